"""The decode path's launcher (device code: ``_kernels._decode_mma._decode_mma_kernel``): few grouped
rows per touched expert, E2M1 experts (MXFP4, NVFP4) and bf16 activations, on the linear op's
``gemv_mma`` decode with an expert axis. docs/decisions/moe-grouped-kernel.md says why."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from ..runtime import target
from ..runtime.launch import cdiv, launch
from ..runtime.workspace import workspace
from .packed import OP, PackedExperts
from .tuning import expected_touched

#: grouped rows of one row tile (the MMA's N side: one token group of 8)
DECODE_TILE_ROWS = 8
#: most grouped rows expected per touched expert (uniform routing) for which :func:`decode_eligible` picks
#: this path: below the 8 rows of a tile, so that the busiest experts still mostly fit one tile
DECODE_MAX_PER_EXPERT = 4

_ACT = {"swiglu": 1, "swiglu_clamped": 2}


@dataclass(frozen=True)
class DecodeConfig:
    """Each warp takes ``16 * row_groups`` weight rows and ``4 * words_per_lane`` code words a row
    and step (as :class:`~microscale.linear.backends.gemv_mma.GemvMmaConfig`); ``num_warps`` warps a
    program; K split ``split_k`` ways (partials summed in split order by each tile's last split)."""

    row_groups: int = 2
    words_per_lane: int = 8
    num_warps: int = 2
    split_k: int = 1


def decode_eligible(pe: PackedExperts, x: torch.Tensor, rows: int) -> bool:
    """Whether the decode path serves ``rows`` grouped rows of ``x`` on ``pe``: an E2M1 weight with its
    decode view (:func:`~microscale.moe.packed.mma_operand`), bf16 activations on a Hopper-or-newer GPU,
    at most :data:`DECODE_MAX_PER_EXPERT` rows expected per touched expert."""
    return (pe.mma is not None and x.dtype == torch.bfloat16 and x.is_cuda and 0 < rows
            and x.stride(-1) == 1 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0
            and target.capability(x.device) >= (9, 0)
            and rows / max(1.0, expected_touched(rows, pe.e)) <= DECODE_MAX_PER_EXPERT)


@functools.lru_cache(maxsize=1024)
def _choose(rows: int, experts: int, n: int, kw: int, sms: int) -> DecodeConfig:
    c = DecodeConfig()
    touched = max(1, math.floor(expected_touched(rows, experts)))
    tiles = cdiv(rows, DECODE_TILE_ROWS) if touched * DECODE_MAX_PER_EXPERT < rows else touched
    warps = cdiv(n, 16 * c.row_groups) * tiles
    step = 4 * c.words_per_lane
    split = 1
    while warps * split < 6 * sms and cdiv(kw, step * split * 2) >= 2 and split < 16:
        split *= 2
    return DecodeConfig(c.row_groups, c.words_per_lane, c.num_warps, split)


def choose_decode_config(rows: int, experts: int, n: int, k: int, device: torch.device) -> DecodeConfig:
    """Two 16-row groups a warp, 8 words a lane and step, 2 warps a program (the linear op's
    ``gemv_mma`` choice up to 8 tokens); K split by powers of two until about 6 warps per SM
    stream the touched experts' rows (each K range at least two steps)."""
    return _choose(rows, experts, n, k // 8, target.num_sms(device))


def decode_run(x: torch.Tensor, pe: PackedExperts, offsets: torch.Tensor, bias: torch.Tensor | None = None,
               rows: torch.Tensor | None = None, config: DecodeConfig | None = None,
               out: torch.Tensor | None = None, *, gather_div: int = 1, tiles: tuple | None = None,
               act: tuple | None = None, scatter: torch.Tensor | None = None, pdl_wait: int = 0,
               pdl_trigger: bool = False) -> torch.Tensor:
    """:func:`~microscale.moe.grouped.grouped_run`'s contract (rows, gather, ``act`` and ``scatter``
    epilogues) on the decode kernel; ``tiles``: the tile map for :data:`DECODE_TILE_ROWS`-row tiles.
    ``pe`` must carry its decode view (``pe.mma``) and ``x`` be bf16 with unit last stride.
    ``pdl_wait`` (a GPU with programmatic dependent launch only): launched as a dependent of the launch
    before, 1: the routing kernel that wrote ``tiles`` (waits at once); 2: the gate/up GEMM that wrote ``x``,
    launched as 1 (the tile map is read and the first weights issued before the wait). ``pdl_trigger``:
    the next launch is a programmatic dependent of this one."""
    from ..linear._kernels import _gemv_mma as mk
    from ..linear.backends.gemv_mma import split_words
    from ._kernels import _decode_mma as kern
    from .grouped import max_tiles, tile_map

    if pe.mma is None:
        raise ValueError(f"{OP}: the decode path needs E2M1 experts with their decode view (PackedExperts.mma)")
    if x.dtype != torch.bfloat16 or x.stride(-1) != 1 or x.data_ptr() % 16 or x.stride(0) % 8:
        raise ValueError(f"{OP}: the decode path needs bfloat16 x with unit last stride and 16-byte aligned rows")
    r = rows.numel() if rows is not None else x.shape[0]
    n, k = pe.n, pe.k
    n_out = n // 2 if act is not None else n
    if out is None:
        out = torch.empty((r, n_out), dtype=torch.float32 if scatter is not None else x.dtype, device=x.device)
    if r == 0:
        return out
    if scatter is not None and rows is None:
        raise ValueError(f"{OP}: scatter needs rows (the sorted pair index)")
    c = config if config is not None else choose_decode_config(r, pe.e, n, k, x.device)
    kw = k // 8
    wpg = pe.fmt.block_size // 8
    step = 4 * c.words_per_lane
    per = split_words(kw, c.split_k, c.words_per_lane)
    if kw % c.words_per_lane or per is None:
        raise ValueError(f"{OP}: K={k} does not split into {c.split_k} ranges of {8 * step}-element steps")
    mt = max_tiles(r, pe.e, DECODE_TILE_ROWS)
    te, tb = tiles if tiles is not None else tile_map(offsets, DECODE_TILE_ROWS, mt)
    sk, ke, post = pe.mma
    tg = 1
    lasm, lcons, nout = mk.load_asm(c.row_groups, c.words_per_lane, 0, c.words_per_lane // wpg)
    xasm, xcons, nxout = mk.load_asm(0, c.words_per_lane, tg, 0, 16)
    sasm, scons = mk.step_asm(c.row_groups, c.words_per_lane, tg, wpg, sk)
    grid_n = cdiv(n_out, 8 * c.row_groups * c.num_warps) if act is not None else cdiv(n, 16 * c.row_groups * c.num_warps)
    if c.split_k > 1:  # (a programmatic dependent touches it only after its wait: the grid before is done with it)
        ws, cnt = workspace(x.device, c.split_k * grid_n * te.numel() * 4 * c.row_groups * tg * 32 * c.num_warps,
                            grid_n * te.numel())
    else:
        ws = cnt = out
    dummy = out
    a_name, alpha, limit, layout = act if act is not None else ("", 1.0, 0.0, "")
    launch(kern._decode_mma_kernel, (grid_n, c.split_k, te.numel()),
           x, pe.words, pe.wscales, pe.global_scale if pe.global_scale is not None else dummy,
           bias if bias is not None else dummy, out, ws, cnt, rows if rows is not None else offsets, offsets, te, tb,
           scatter if scatter is not None else dummy, ke, pe.e, n, kw, x.stride(0), pe.words.stride(0),
           pe.words.stride(1), pe.wscales.stride(0), pe.wscales.stride(1), bias.stride(0) if bias is not None else 0,
           out.stride(0), gather_div, 2.0 ** post, float(alpha or 1.0), float(limit or 0.0),
           KW_PER_SPLIT=per, RG=c.row_groups, WPL=c.words_per_lane, TG=tg, WPG=wpg, SK=sk, SPLIT_K=c.split_k,
           HAS_GS=pe.global_scale is not None, HAS_BIAS=bias is not None, GATHER=rows is not None and scatter is None,
           ACT=_ACT.get(a_name, 0), CONCAT=layout == "concat", SCATTER=scatter is not None,
           EVEN_K=per * c.split_k == kw, LASM=lasm, LCONS=lcons, NOUT=nout, XASM=xasm, XCONS=xcons, NXOUT=nxout,
           SASM=sasm, SCONS=scons, NW=c.num_warps, WAIT=pdl_wait, TRIGGER=pdl_trigger, num_warps=c.num_warps,
           num_stages=1, **({"launch_pdl": True} if pdl_wait else {}))
    return out
