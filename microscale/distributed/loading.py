"""Sharded checkpoint loading: each rank reads only its slice of each tensor.

:func:`load_sharded` opens a checkpoint with :func:`microscale.io.open_checkpoint` (every
safetensors header validated, every path checked; any convention microscale reads from safetensors:
native, ModelOpt, compressed-tensors, gpt-oss), learns each quantized tensor's format and shape by
decoding its group with the large members left unread (zero-stride stand-ins), and then reads, for each
member that holds codes, block scales or zero points, only the byte runs of this rank's shard
straight from the file into the shard's buffer. Scalars (global and activation scales) are read
whole and replicated. No full tensor is ever materialized; :class:`ReadStats` counts the bytes.

The result maps each logical tensor name to a :func:`~microscale.distributed.shard.shard`-equal
QTensor (the same bytes and meta as sharding the fully loaded tensor) or, for names the plan does
not shard, the whole tensor.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass

import torch

from .._paths import open_regular
from .._safetensors import SafetensorsError
from ..qtensor import QTensor
from .shard import ShardSpec, shard_spec

__all__ = ["load_sharded", "ReadStats", "DEFAULT_DIMS"]

#: logical tensor name pattern -> dim to cut ("n" column-parallel, "k" row-parallel); first match wins
DEFAULT_DIMS: dict[str, str] = {
    "*q_proj.weight": "n", "*k_proj.weight": "n", "*v_proj.weight": "n", "*o_proj.weight": "k",
    "*gate_proj.weight": "n", "*up_proj.weight": "n", "*down_proj.weight": "k",
    "*attention.self.query.weight": "n", "*attention.self.key.weight": "n", "*attention.self.value.weight": "n",
    "*attention.output.dense.weight": "k", "*intermediate.dense.weight": "n", "*output.dense.weight": "k",
}



@dataclass
class ReadStats:
    """Bytes this rank read from tensor data (headers excluded) and the largest single tensor read."""

    bytes_read: int = 0
    largest: int = 0
    reads: int = 0

    def add(self, n: int, runs: int) -> None:
        self.bytes_read += n
        self.largest = max(self.largest, n)
        self.reads += runs


def _read_slice(reader, name: str, axis: int, lo: int, hi: int, out_len: int, stats: ReadStats) -> torch.Tensor:
    """Entries ``[lo, hi)`` along ``axis`` of tensor ``name`` read straight from the file (only those
    bytes) into a zeroed tensor of ``out_len`` along ``axis`` (the tail beyond ``hi - lo`` is padding)."""
    ti = reader.info(name)
    shape = list(ti.shape)
    if not 0 <= lo <= hi <= shape[axis]:
        raise ValueError(f"{reader.path}: tensor {name!r}: slice [{lo}, {hi}) of dim {axis} outside {tuple(shape)}")
    isz = ti.dtype.itemsize
    inner = 1
    for s in shape[axis + 1:]:
        inner *= s
    outer = 1
    for s in shape[:axis]:
        outer *= s
    out_shape = shape.copy()
    out_shape[axis] = out_len
    out = torch.zeros(out_shape, dtype=ti.dtype)
    if hi == lo or outer * inner == 0:
        return out
    buf = out.view(torch.uint8).reshape(-1).numpy()  # writes land in `out` (a view of its storage)
    run = (hi - lo) * inner * isz
    src_stride = shape[axis] * inner * isz
    dst_stride = out_len * inner * isz
    got_total = 0
    with open_regular(reader.path) as f:
        for o in range(outer):
            f.seek(ti.start + o * src_stride + lo * inner * isz)
            got = f.readinto(memoryview(buf)[o * dst_stride:o * dst_stride + run])
            if got != run:
                raise SafetensorsError(f"{reader.path}: tensor {name!r}: read {got} of {run} bytes (file changed or "
                                       "truncated)")
            got_total += got
    stats.add(got_total, outer)
    return out


def _dims_for(name: str, dims: dict[str, str | int | None]):
    for pat, d in dims.items():
        if fnmatch.fnmatchcase(name, pat):
            return d
    return None


def _plan_member(mshape: tuple[int, ...], q: QTensor, spec: ShardSpec, taken: set[str]):
    """(axis, lo, hi, out_len, part) for a member of shape ``mshape`` holding a QTensor part not yet
    ``taken`` (scales come before zero points, which have their shape), or None."""
    ndim = len(q.shape)
    d = spec.dim
    for part, t, per in (("data", q.data, q.fmt.element.bits / 8 if d == -1 else 1.0), ("scales", q.scales, None),
                         ("zero_points", q.zero_points, None)):
        if t is None or part in taken:
            continue
        if per is None:  # scales / zero points: one entry per block (rows of 2-D blocks too)
            per = 1 / q.fmt.block_size if d == -1 else (1 / q.fmt.block_rows if d == -2 else 1.0)
        lo, hi, real = (int(v * per) for v in (spec.start, spec.stop, spec.real_stop))
        tshape = tuple(t.shape)
        if mshape == tshape:
            return ndim + d, lo, min(real, tshape[ndim + d]), hi - lo, part
        if part == "data" and d == -1 and mshape == (*tshape[:-1], tshape[-1] // 16, 16):
            # gpt-oss stores codes as [..., rows, K/32, 16]: K is cut in whole 16-byte groups
            return ndim - 1, lo // 16, real // 16, (hi - lo) // 16, part
        if part == "data" and d != -1 and mshape == (*tshape[:-1], tshape[-1] // 16, 16):
            return ndim + d, lo, min(real, tshape[ndim + d]), hi - lo, part
    return None


def load_sharded(path: str | os.PathLike, world_size: int, rank: int, dims: dict | None = None,
                 convention: str | None = None, pad: bool = False, names: list[str] | None = None,
                 stats: ReadStats | None = None) -> dict[str, QTensor | torch.Tensor]:
    """This rank's view of a checkpoint: every quantized tensor whose name matches ``dims``
    (pattern -> ``"n"`` / ``"k"`` / int dim, first match wins; default :data:`DEFAULT_DIMS`) as
    its shard (equal to ``shard(full, dim, world_size, rank, pad)``), reading only the shard's bytes;
    everything else whole. ``names`` limits which logical tensors are returned. ``stats`` (a
    :class:`ReadStats`) receives the bytes read."""
    from ..io import open_checkpoint
    from ..io.conventions import get_convention

    dims = DEFAULT_DIMS if dims is None else dict(dims)
    stats = ReadStats() if stats is None else stats
    ck = open_checkpoint(path, convention)
    member = {k for g in ck.groups for k in g.members.values()}
    want = None if names is None else set(names)
    out: dict[str, QTensor | torch.Tensor] = {}
    for g in ck.groups:
        if want is not None and g.base not in want:
            continue
        small = {}
        for role, k in g.members.items():
            ti = ck.info(k)
            if ti.numel <= 1:  # a scalar (global or activation scale): replicated
                small[role] = ck.get(k)
                stats.add(ti.nbytes, 1)
            else:
                small[role] = torch.zeros((), dtype=ti.dtype).expand(ti.shape)  # shape only: no memory, nothing read
        lazy = get_convention(ck.convention).decode(g, small, ck.metadata)  # format, shape, scalars; no codes read
        d = _dims_for(g.base, dims)
        if d is None:
            tensors = {r: (t if ck.info(g.members[r]).numel <= 1 else _whole(ck, g.members[r], stats))
                       for r, t in small.items()}
            out[g.base] = get_convention(ck.convention).decode(g, tensors, ck.metadata)
            continue
        spec = shard_spec(lazy, d, world_size, rank, pad, g.base)
        parts: dict[str, torch.Tensor] = {}
        for role, k in g.members.items():
            ti = ck.info(k)
            if ti.numel <= 1:
                continue
            p = _plan_member(tuple(ti.shape), lazy, spec, set(parts))
            if p is None:
                raise ValueError(f"load_sharded: {k!r} {tuple(ti.shape)} matches no part of {g.base!r} "
                                 f"({lazy.fmt.name} {tuple(lazy.shape)}); cannot cut it")
            axis, lo, hi, n, part = p
            t = _read_slice(ck.readers[ck.where[k]], k, axis, lo, hi, n, stats)
            ref = getattr(lazy, part)
            parts[part] = t.reshape(_local_shape(ref, lazy, spec))
        shape = list(lazy.shape)
        shape[spec.dim] = spec.local
        meta = dict(lazy.meta)
        meta["shard"] = spec.to_dict()
        meta["shard_full_shape"] = list(lazy.shape)
        out[g.base] = QTensor(parts["data"], parts["scales"], lazy.fmt, torch.Size(shape), lazy.dtype,
                              lazy.global_scale, parts.get("zero_points"), meta)
    for k in ck.names:
        if k not in member and (want is None or k in want):
            out[k] = _whole(ck, k, stats)
    return out


def _local_shape(ref: torch.Tensor, q: QTensor, spec: ShardSpec) -> list[int]:
    """A part's shape in the shard: the sharded axis holds ``spec.local`` stored elements."""
    s = list(ref.shape)
    ax = len(q.shape) + spec.dim
    if ref is q.data:
        s[ax] = spec.local * q.fmt.element.bits // 8 if spec.dim == -1 else spec.local
    elif spec.dim == -1:
        s[ax] = spec.local // q.fmt.block_size
    else:
        s[ax] = spec.local // (q.fmt.block_rows if spec.dim == -2 else 1)
    return s


def _whole(ck, k: str, stats: ReadStats) -> torch.Tensor:
    t = ck.get(k)
    stats.add(t.numel() * t.element_size(), 1)
    return t
