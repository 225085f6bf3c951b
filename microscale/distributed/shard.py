"""Cut a :class:`~microscale.QTensor` into tensor-parallel shards and put them back together.

A shard is itself a QTensor (so ``ms.linear`` runs on it unchanged) whose :attr:`~QTensor.meta`
carries a ``"shard"`` record: the dim, world size, rank, the full tensor's shape and stored length
along the dim, and the world padding. Cuts fall only on whole blocks along K (a block of codes is
always whole bytes, so packed sub-byte codes are never split) and on whole ``block_rows`` along N
for 2-D block formats (fp8 block 128x128). Global scales are replicated; zero points are cut like
the block scales.

Shards are equal: the stored length along the dim must split into ``world_size`` equal whole
units. When it does not, :func:`shard` raises a ``ValueError`` naming the tensor, dim and world
size, unless ``pad=True``: then zero units (zero codes, zero scales, zero zero-points — they decode
to 0) are appended at the end, recorded in the shard's meta, and :func:`gather` strips them.

Swizzled scale buffers (the 128x4 / 8x4 tiles of :mod:`microscale.formats.layouts`) are cut on
whole tiles by :func:`shard_swizzled_scales`; a cut inside a tile is an error unless ``pad``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..formats import ScaleLayout, get_scale_layout
from ..qtensor import QTensor

__all__ = ["ShardSpec", "shard", "gather", "shard_spec", "shard_swizzled_scales", "gather_swizzled_scales",
           "resolve_dim", "pad_for"]

_DIMS = {"n": -2, "k": -1, "col": -2, "colwise": -2, "row": -1, "rowwise": -1}


@dataclass(frozen=True)
class ShardSpec:
    """Where one rank's shard sits along the sharded dim, in stored elements (rows for N)."""

    dim: int  # negative index into the original shape: -1 = K (row-parallel), -2 = N (column-parallel)
    world_size: int
    rank: int
    full: int  # stored length of the full tensor along dim (K padded to whole blocks, rows to block_rows)
    padded: int  # full + world padding (a multiple of world_size * unit)
    unit: int  # the smallest cut along dim, in elements (block size along K, block_rows along N)

    @property
    def local(self) -> int:
        """Stored length of each shard along dim (padding included)."""
        return self.padded // self.world_size

    @property
    def start(self) -> int:
        return self.rank * self.local

    @property
    def stop(self) -> int:
        return self.start + self.local

    @property
    def real_stop(self) -> int:
        """End of the part of this shard that holds the full tensor's data (the rest is padding)."""
        return min(self.stop, self.full)

    def to_dict(self) -> dict:
        return {"dim": self.dim, "world_size": self.world_size, "rank": self.rank, "full": self.full,
                "padded": self.padded, "unit": self.unit}


def resolve_dim(dim: str | int, ndim: int, where: str = "shard") -> int:
    """``"n"``/``"col"`` -> -2, ``"k"``/``"row"`` -> -1; an int dim as a negative index."""
    if isinstance(dim, str):
        if dim.lower() not in _DIMS:
            raise ValueError(f"{where}: dim={dim!r} must be 'n' (column-parallel), 'k' (row-parallel) or an int")
        return _DIMS[dim.lower()]
    if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
        raise ValueError(f"{where}: dim={dim!r} must be an int in [{-ndim}, {ndim}) or 'n'/'k'")
    return dim - ndim if dim >= 0 else dim


def _check_world(world_size: int, rank: int, where: str) -> None:
    for name, v, lo in (("world_size", world_size, 1), ("rank", rank, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{where}: {name}={v!r} must be an int >= {lo}")
    if rank >= world_size:
        raise ValueError(f"{where}: rank={rank} must be < world_size={world_size}")


def _unit_and_full(q: QTensor, d: int) -> tuple[int, int]:
    stored = q.padded_shape if d == -1 else q.data.shape
    if d == -1:
        return q.fmt.block_size, int(stored[-1])
    if d == -2 and q.fmt.block_rows > 1:
        return q.fmt.block_rows, int(stored[-2])
    return 1, int(stored[d])


def pad_for(n: int, unit: int, world_size: int) -> int:
    """The smallest multiple of ``world_size * unit`` that is >= ``n``."""
    step = world_size * unit
    return -(-n // step) * step


def shard_spec(q: QTensor, dim: str | int, world_size: int, rank: int, pad: bool = False,
               name: str = "weight") -> ShardSpec:
    """Where rank ``rank`` of ``world_size`` cuts ``q`` along ``dim``; raises if a cut splits a block
    (or a 2-D block's rows) and ``pad`` is False."""
    where = f"shard({name})"
    _check_world(world_size, rank, where)
    d = resolve_dim(dim, len(q.shape), where)
    unit, full = _unit_and_full(q, d)
    padded = pad_for(full, unit, world_size)
    if padded != full and not pad:
        what = {(-1): f"{q.fmt.name} blocks of {unit} along K", (-2): f"{q.fmt.name} blocks of {unit} rows along N"}
        raise ValueError(
            f"{where}: dim {d} (stored length {full}) cannot be cut into {world_size} equal shards of whole "
            f"{what.get(d, 'rows') if unit > 1 else 'rows'}: each shard would hold {full / world_size:g} "
            f"({full / world_size / unit:g} units of {unit}); pass pad=True to pad to {padded} with zero blocks")
    return ShardSpec(d, world_size, rank, full, padded, unit)


def _cut(t: torch.Tensor, axis: int, per_elem: float, spec: ShardSpec) -> torch.Tensor:
    """Slice ``t`` along ``axis`` for ``spec`` (``per_elem`` = entries of t per stored element), zero-padded."""
    lo, hi, real_hi = (int(v * per_elem) for v in (spec.start, spec.stop, spec.real_stop))
    part = t.narrow(axis, lo, max(real_hi - lo, 0)) if real_hi > lo else t.narrow(axis, 0, 0)
    if part.shape[axis] == hi - lo:
        return part.contiguous()
    shape = list(t.shape)
    shape[axis] = hi - lo
    out = t.new_zeros(shape)
    out.narrow(axis, 0, part.shape[axis]).copy_(part)
    return out


def _axes(q: QTensor, d: int) -> tuple[int, float, int, float]:
    """(data axis, data entries per element, scales axis, scale entries per element) along d."""
    ndim = len(q.shape)
    ax = ndim + d
    if d == -1:
        return ax, q.fmt.element.bits / 8, ax, 1 / q.fmt.block_size
    if d == -2:
        return ax, 1.0, ax, 1 / q.fmt.block_rows
    return ax, 1.0, ax, 1.0


def shard(q: QTensor, dim: str | int, world_size: int, rank: int, pad: bool = False,
          name: str = "weight") -> QTensor:
    """Rank ``rank``'s shard of ``q`` along ``dim`` (``"n"`` = output rows, column-parallel;
    ``"k"`` = input columns, row-parallel; or a leading dim such as experts).

    The shard's shape is its stored shape along ``dim`` (block padding and world padding included);
    its meta records a :class:`ShardSpec` under ``"shard"`` and the full shape under
    ``"shard_full_shape"``, which :func:`gather` uses to restore ``q`` byte for byte."""
    if not isinstance(q, QTensor):
        raise TypeError(f"shard({name}): expected a QTensor, got {type(q).__name__}")
    spec = shard_spec(q, dim, world_size, rank, pad, name)
    dax, dper, sax, sper = _axes(q, spec.dim)
    data = _cut(q.data, dax, dper, spec)
    scales = _cut(q.scales, sax, sper, spec)
    zp = None if q.zero_points is None else _cut(q.zero_points, sax, sper, spec)
    shape = list(q.shape)
    shape[spec.dim] = spec.local
    meta = dict(q.meta)
    meta["shard"] = spec.to_dict()
    meta["shard_full_shape"] = list(q.shape)
    gs = None if q.global_scale is None else q.global_scale.clone()  # replicated on every rank
    return QTensor(data, scales, q.fmt, torch.Size(shape), q.dtype, gs, zp, meta)


def _spec_of(s: QTensor, i: int) -> ShardSpec:
    m = s.meta.get("shard") if isinstance(s.meta, dict) else None
    if not isinstance(m, dict):
        raise ValueError(f"gather: shard {i} has no 'shard' record in its meta (not made by shard())")
    return ShardSpec(**m)


def gather(shards: Sequence[QTensor]) -> QTensor:
    """Inverse of :func:`shard`: concatenate the shards of ranks ``0..world_size-1`` (in order),
    strip the world padding and restore the full QTensor, bit for bit."""
    if not shards:
        raise ValueError("gather: no shards given")
    specs = [_spec_of(s, i) for i, s in enumerate(shards)]
    s0 = specs[0]
    if len(shards) != s0.world_size:
        raise ValueError(f"gather: got {len(shards)} shards for world_size={s0.world_size}")
    for i, (s, sp) in enumerate(zip(shards, specs)):
        if sp.rank != i or (sp.dim, sp.world_size, sp.full, sp.padded) != (s0.dim, s0.world_size, s0.full, s0.padded):
            raise ValueError(f"gather: shard {i} is {sp} but shard 0 is {s0}; pass one shard per rank, in rank order")
        if s.fmt != shards[0].fmt:
            raise ValueError(f"gather: shard {i} is {s.fmt.name}, shard 0 is {shards[0].fmt.name}")
    q0 = shards[0]
    dax, dper, sax, sper = _axes(q0, s0.dim)
    full_shape = torch.Size(q0.meta["shard_full_shape"])

    def cat(parts, axis, per):
        return torch.cat(parts, axis).narrow(axis, 0, int(s0.full * per)).contiguous()

    data = cat([s.data for s in shards], dax, dper)
    scales = cat([s.scales for s in shards], sax, sper)
    zp = None if q0.zero_points is None else cat([s.zero_points for s in shards], sax, sper)
    meta = {k: v for k, v in q0.meta.items() if k not in ("shard", "shard_full_shape")}
    return QTensor(data, scales, q0.fmt, full_shape, q0.dtype, q0.global_scale, zp, meta)


# ---- swizzled scale buffers --------------------------------------------------------------------
def _tiles(flat: torch.Tensor, rows: int, cols: int, layout: ScaleLayout) -> torch.Tensor:
    """A flat tiled buffer as ``[row tiles, col tiles, entries per tile]`` (tiles are contiguous)."""
    rp, cp = layout.padded_shape(rows, cols)
    per = layout.tile_rows * layout.tile_cols
    if flat.dim() != 1 or flat.numel() != rp * cp:
        raise ValueError(f"{layout.name} scales: expected a flat buffer of {rp * cp} entries for [{rows}, {cols}], "
                         f"got shape {tuple(flat.shape)}")
    return flat.reshape(rp // layout.tile_rows, cp // layout.tile_cols, per)


def shard_swizzled_scales(flat: torch.Tensor, rows: int, cols: int, layout: str | ScaleLayout, dim: str | int,
                          world_size: int, rank: int, pad: bool = False,
                          name: str = "weight_scale") -> tuple[torch.Tensor, int, int]:
    """Rank ``rank``'s part of a swizzled scale buffer of the row-major matrix ``[rows, cols]``, cut on
    whole tiles: ``dim`` ``"n"`` cuts rows (each rank gets ``rows / world_size`` of them, which must be
    a multiple of the tile's rows), ``"k"`` cuts scale columns (a multiple of 4). Returns
    ``(flat shard, shard rows, shard cols)``: the shard is the same layout of the rank's rows/columns,
    so it equals swizzling the row-major shard. With ``pad``, zero tiles are appended (gather strips
    them). A row-major layout is cut like any matrix."""
    lay = get_scale_layout(layout)
    where = f"shard_swizzled_scales({name})"
    _check_world(world_size, rank, where)
    d = resolve_dim(dim, 2, where)
    if not lay.tile_rows:
        m = flat.reshape(rows, cols)
        n = rows if d == -2 else cols
        padded = pad_for(n, 1, world_size)
        if padded != n and not pad:
            raise ValueError(f"{where}: {n} {'rows' if d == -2 else 'columns'} do not split into {world_size} "
                             f"equal shards; pass pad=True to pad to {padded}")
        spec = ShardSpec(d, world_size, rank, n, padded, 1)
        part = _cut(m, 2 + d, 1.0, spec)
        return part.reshape(-1), *part.shape
    n = rows if d == -2 else cols
    unit = lay.tile_rows if d == -2 else lay.tile_cols
    tiled_n = lay.padded_shape(rows, cols)[0 if d == -2 else 1]
    if n % world_size or (n // world_size) % unit:
        if not pad:
            raise ValueError(
                f"{where}: cutting {n} {'rows' if d == -2 else 'scale columns'} into {world_size} shards of "
                f"{n / world_size:g} splits a {lay.name} tile ({unit} {'rows' if d == -2 else 'columns'}); "
                f"pass pad=True to pad to {pad_for(n, unit, world_size)}")
    padded = pad_for(n, unit, world_size)
    t = _tiles(flat, rows, cols, lay)
    spec = ShardSpec(d, world_size, rank, tiled_n // unit, padded // unit, 1)
    part = _cut(t, 2 + d, 1.0, spec)
    local = padded // world_size
    shape = (local, cols) if d == -2 else (rows, local)
    return part.reshape(-1), *shape


def gather_swizzled_scales(parts: Sequence[torch.Tensor], rows: int, cols: int, layout: str | ScaleLayout,
                           dim: str | int) -> torch.Tensor:
    """Inverse of :func:`shard_swizzled_scales` for all ranks' parts (in rank order): the full
    flat buffer of ``[rows, cols]`` in ``layout``, padding stripped, bit for bit."""
    lay = get_scale_layout(layout)
    w = len(parts)
    d = resolve_dim(dim, 2, "gather_swizzled_scales")
    if not lay.tile_rows:
        n = rows if d == -2 else cols
        local = pad_for(n, 1, w) // w
        shp = (local, cols) if d == -2 else (rows, local)
        m = torch.cat([p.reshape(shp) for p in parts], 2 + d).narrow(2 + d, 0, n)
        return m.contiguous().reshape(-1)
    n = rows if d == -2 else cols
    unit = lay.tile_rows if d == -2 else lay.tile_cols
    local = pad_for(n, unit, w) // w
    shp = (local, cols) if d == -2 else (rows, local)
    rp, cp = lay.padded_shape(*shp)
    per = lay.tile_rows * lay.tile_cols
    t = torch.cat([p.reshape(rp // lay.tile_rows, cp // lay.tile_cols, per) for p in parts], 2 + d)
    full_tiles = lay.padded_shape(rows, cols)[0 if d == -2 else 1] // unit
    return t.narrow(2 + d, 0, full_tiles).contiguous().reshape(-1)
