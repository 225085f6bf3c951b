"""The grouped kernel's launcher (device code: ``_kernels._grouped._grouped_kernel``) and the
routing (tokens sorted per expert and the row-tile map, on the device, no host sync)."""
from __future__ import annotations

import torch

from ..formats.kinds import ScaleKind, scale_kind
from ..runtime import target
from ..runtime.launch import cdiv, launch, next_pow2
from ..runtime.workspace import workspace
from .packed import OP, PackedExperts
from .tuning import ROUTE_KERNEL_MAX_ROWS, GroupedConfig, choose_config

#: ``act`` names -> the kernel's ``ACT`` epilogue
_ACT = {"swiglu": 1, "swiglu_clamped": 2}


def pair_eligible(pe: PackedExperts, dtype: torch.dtype) -> bool:
    """Whether the two-per-word bf16x2 decode is exact for this weight and activation dtype:
    4-bit float codes without NaN/Inf, E8M0 or UE4M3 scales (every decoded product has at most
    8 significant bits and stays in bf16's range), bf16 activations."""
    el = pe.fmt.element
    return (pe.container_bits == 4 and dtype == torch.bfloat16 and el.kind == "float" and not pe.specials
            and scale_kind(pe.fmt) in (ScaleKind.E8M0, ScaleKind.UE4M3) and not pe.fmt.zero_point)


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


def max_tiles(rows: int, experts: int, block_m: int) -> int:
    """Program slots along the row-tile axis: each touched expert adds at most one partial tile."""
    return cdiv(rows, block_m) + min(experts, rows)


def route(top_k_index: torch.Tensor, num_experts: int, block_m: int, trigger: bool = False) -> tuple:
    """The routing of ``top_k_index`` [T, top_k] on the device, no host sync: ``perm`` (int32
    [T*top_k], the flat (token, slot) pair index of each grouped row, stable), ``offsets`` (int32
    [E+1]) and the tile map (:func:`tile_map`) for ``block_m``-row tiles. Up to
    :data:`~microscale.moe.tuning.ROUTE_KERNEL_MAX_ROWS` pairs: one single-program launch, which with
    ``trigger`` lets the next launch (a programmatic dependent that waits for it) start at once."""
    p = top_k_index.numel()
    mt = max_tiles(p, num_experts, block_m)
    dev = top_k_index.device
    if p > ROUTE_KERNEL_MAX_ROWS:
        ids = top_k_index.reshape(-1)
        perm = torch.argsort(ids, stable=True)
        counts = torch.zeros(num_experts, dtype=torch.int64, device=dev)
        counts.scatter_add_(0, ids.to(torch.int64), torch.ones_like(ids, dtype=torch.int64))  # (bincount syncs)
        offsets = torch.zeros(num_experts + 1, dtype=torch.int32, device=dev)
        offsets[1:] = torch.cumsum(counts, 0)
        return (perm.to(torch.int32), offsets) + tile_map(offsets, block_m, mt)
    from ._kernels import _grouped as kern

    ids = top_k_index.reshape(-1)
    if ids.dtype not in (torch.int32, torch.int64):
        ids = ids.to(torch.int64)
    if ids.stride(0) != 1:  # (a strided view, e.g. every other column: the kernel reads unit-stride ids)
        ids = ids.contiguous()
    out = torch.empty(p + num_experts + 1 + 2 * mt, dtype=torch.int32, device=dev)
    perm, offsets, te, tb = out.split([p, num_experts + 1, mt, mt])
    eb = next_pow2(num_experts + 1)
    ch = max(16, min(128, 4096 // eb))
    launch(kern._route_kernel, (1,), ids, perm, offsets, te, tb, p, num_experts, mt, BLOCK_M=block_m, EB=eb, CH=ch,
           NCP=next_pow2(cdiv(p, ch)), NCT=next_pow2(cdiv(mt, ch)), TRIGGER=trigger, num_warps=4)
    return perm, offsets, te, tb


def slot_sum(y: torch.Tensor, top_k: int, dtype: torch.dtype, wait: bool = False) -> torch.Tensor:
    """Each token's sum of its ``top_k`` consecutive rows of ``y`` (fp32 ``[T*top_k, H]``, contiguous), the
    slots added in order in fp32 and cast to ``dtype``: ``[T, H]`` in one launch; with ``wait``, launched as a
    programmatic dependent of the launch that writes ``y``."""
    from ._kernels import _grouped as kern

    r, h = y.shape
    out = torch.empty((r // top_k, h), dtype=dtype, device=y.device)
    if out.numel():
        block = min(1024, max(128, next_pow2(h)))
        launch(kern._slot_sum_kernel, (out.shape[0], cdiv(h, block)), y, out, h, TOP_K=top_k, BLOCK=block,
               WAIT=wait, num_warps=4, **({"launch_pdl": True} if wait else {}))
    return out


def grouped_run(x: torch.Tensor, pe: PackedExperts, offsets: torch.Tensor, bias: torch.Tensor | None = None,
                rows: torch.Tensor | None = None, config: GroupedConfig | None = None,
                out: torch.Tensor | None = None, *, gather_div: int = 1, tiles: tuple | None = None,
                act: tuple | None = None, scatter: torch.Tensor | None = None) -> torch.Tensor:
    """``out[r] = x[src(r)] @ dequant(W[e])^T + bias[e]`` for ``offsets[e] <= r < offsets[e+1]``,
    ``src(r) = rows[r] // gather_div`` when ``rows`` is given (the routing gather), else ``r``.

    ``x`` [T, K] with unit last stride; ``offsets`` int32 [E+1]; rows past ``offsets[E]`` are not
    written. ``out`` [R, N] may be passed (tests poison it); R = ``rows.numel()`` or T.
    ``tiles``: the tile map for ``config.block_m`` (:func:`route`), else built here.
    ``act`` = ``(activation, alpha, limit, layout)``: out [R, N/2] is the gated activation of
    each (gate, up) pair (the gate/up GEMM's epilogue). ``scatter``: the flat routing weights
    [R]; with ``rows`` (then not a gather) out fp32 [R, N] gets ``out[rows[r]] = scatter[rows[r]] *
    row r`` (the down GEMM's epilogue)."""
    from ._kernels import _grouped as kern

    r = rows.numel() if rows is not None else x.shape[0]
    n, k = pe.n, pe.k
    n_out = n // 2 if act is not None else n
    if out is None:
        out = torch.empty((r, n_out), dtype=torch.float32 if scatter is not None else x.dtype, device=x.device)
    if r == 0:
        return out
    kw = pe.codes.shape[2]
    pair = pair_eligible(pe, x.dtype)
    c = config if config is not None else choose_config(r, pe.e, n, kw, pe.container_bits, x.device, pair)
    if c.block_kw % 8 or c.block_kw < 8:
        raise ValueError(f"{OP}: block_kw={c.block_kw} must be a positive multiple of 8 (words per row per step)")
    if c.pair and not pair:
        raise ValueError(f"{OP}: pair decode needs 4-bit float codes with E8M0/UE4M3 scales and bf16 x")
    if scatter is not None and rows is None:
        raise ValueError(f"{OP}: scatter needs rows (the sorted pair index)")
    mt = max_tiles(r, pe.e, c.block_m)
    te, tb = tiles if tiles is not None else tile_map(offsets, c.block_m, mt)
    ce = pe.constexprs()
    dummy = pe.scales
    zp = pe.zero_points if pe.zero_points is not None else dummy
    gs = pe.global_scale if pe.global_scale is not None else dummy
    b = bias if bias is not None else dummy
    grid_n = cdiv(n, c.block_n)
    if c.split_k > 1:
        ws, cnt = workspace(x.device, c.split_k * grid_n * mt * c.block_n * c.block_m, grid_n * mt)
    else:
        ws, cnt = dummy, dummy
    s = 32 // pe.container_bits
    a_name, alpha, limit, layout = act if act is not None else ("", 1.0, 0.0, "")
    launch(kern._grouped_kernel, (grid_n, c.split_k, te.numel()),
           x, pe.codes, pe.scales, zp, gs, b, out, ws, cnt, rows if rows is not None else offsets, offsets, te, tb,
           scatter if scatter is not None else dummy, pe.e, n, k, kw, x.stride(0), out.stride(0),
           pe.codes.stride(0), pe.codes.stride(1), pe.scales.stride(0), pe.scales.stride(1),
           zp.stride(0) if pe.zero_points is not None else 0, zp.stride(1) if pe.zero_points is not None else 0,
           bias.stride(0) if bias is not None else 0, gather_div, float(alpha or 1.0), float(limit or 0.0),
           **ce, HAS_BIAS=bias is not None, GATHER=rows is not None and scatter is None, BLOCK_N=c.block_n,
           BLOCK_M=c.block_m, BLOCK_KW=c.block_kw, SPLIT_K=c.split_k, INTERP=target.interpreting(),
           ITERS=cdiv(cdiv(kw, c.split_k), c.block_kw), EVEN_K=k == kw * s, PAIR=c.pair,
           ACT=_ACT.get(a_name, 0), CONCAT=layout == "concat", SCATTER=scatter is not None,
           RAGGED=kw % c.block_kw != 0,
           num_warps=c.num_warps, num_stages=c.num_stages)
    return out
