"""The grouped kernel's launcher (device code: ``_kernels._grouped._grouped_kernel``)."""
from __future__ import annotations

import torch

from ..runtime import target
from ..runtime.launch import cdiv, launch
from ..runtime.workspace import workspace
from .packed import OP, PackedExperts
from .tuning import GroupedConfig, choose_config


def tile_map(offsets: torch.Tensor, block_m: int, max_tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row tiles of ``block_m`` rows per expert, on the device (no host sync): the expert of each
    of ``max_tiles`` program slots (``E`` past the last tile) and its tile index within the expert."""
    counts = (offsets[1:] - offsets[:-1]).to(torch.int64)
    tiles = (counts + block_m - 1) // block_m
    ends = torch.cumsum(tiles, 0)
    slot = torch.arange(max_tiles, device=offsets.device, dtype=torch.int64)
    te = torch.searchsorted(ends, slot, right=True)
    starts = ends - tiles
    tb = slot - starts[te.clamp(max=counts.numel() - 1)]
    return te.to(torch.int32), tb.to(torch.int32)


def grouped_run(x: torch.Tensor, pe: PackedExperts, offsets: torch.Tensor, bias: torch.Tensor | None = None,
                rows: torch.Tensor | None = None, config: GroupedConfig | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """``out[r] = x[src(r)] @ dequant(W[e])^T + bias[e]`` for ``offsets[e] <= r < offsets[e+1]``,
    ``src(r) = rows[r]`` when ``rows`` is given (the routing gather), else ``r``.

    ``x`` [T, K] with unit last stride; ``offsets`` int32 [E+1]; rows past ``offsets[E]`` are not
    written. ``out`` [R, N] may be passed (tests poison it); R = ``rows.numel()`` or T."""
    from ._kernels import _grouped as kern

    r = rows.numel() if rows is not None else x.shape[0]
    n, k = pe.n, pe.k
    if out is None:
        out = torch.empty((r, n), dtype=x.dtype, device=x.device)
    if r == 0:
        return out
    kw = pe.codes.shape[2]
    c = config if config is not None else choose_config(r, pe.e, n, kw, pe.container_bits, x.device)
    if kw % c.block_kw or c.block_kw % 8:
        raise ValueError(f"{OP}: block_kw={c.block_kw} must be a multiple of 8 dividing {kw} words per row")
    max_tiles = cdiv(r, c.block_m) + min(pe.e, r)  # each touched expert adds at most one partial tile
    te, tb = tile_map(offsets, c.block_m, max_tiles)
    ce = pe.constexprs()
    dummy = pe.scales
    zp = pe.zero_points if pe.zero_points is not None else dummy
    gs = pe.global_scale if pe.global_scale is not None else dummy
    b = bias if bias is not None else dummy
    grid_n = cdiv(n, c.block_n)
    if c.split_k > 1:
        ws, cnt = workspace(x.device, c.split_k * grid_n * max_tiles * c.block_n * c.block_m, grid_n * max_tiles)
    else:
        ws, cnt = dummy, dummy
    s = 32 // pe.container_bits
    launch(kern._grouped_kernel, (grid_n, c.split_k, max_tiles),
           x, pe.codes, pe.scales, zp, gs, b, out, ws, cnt, rows if rows is not None else offsets, offsets, te, tb,
           pe.e, n, k, kw, x.stride(0), out.stride(0), pe.codes.stride(0), pe.codes.stride(1), pe.scales.stride(0),
           pe.scales.stride(1), zp.stride(0) if pe.zero_points is not None else 0,
           zp.stride(1) if pe.zero_points is not None else 0, bias.stride(0) if bias is not None else 0,
           **ce, HAS_BIAS=bias is not None, GATHER=rows is not None, BLOCK_N=c.block_n, BLOCK_M=c.block_m,
           BLOCK_KW=c.block_kw, SPLIT_K=c.split_k, INTERP=target.interpreting(),
           ITERS=cdiv(cdiv(kw, c.split_k), c.block_kw), EVEN_K=k == kw * s, num_warps=c.num_warps,
           num_stages=c.num_stages)
    return out
