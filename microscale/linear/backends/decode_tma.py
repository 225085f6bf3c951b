"""``decode_tma``: the TMA-fed, warp-specialized tensor-core decode kernel for 2-64 tokens on
Hopper (device code: :mod:`microscale.linear._kernels._decode_tma`;
docs/decisions/linear-decode-tma.md)."""
from __future__ import annotations

import functools

import torch

from ...qtensor import QTensor
from ...runtime import target
from ...runtime.launch import cdiv, launch
from ...runtime.workspace import scratch, workspace
from .. import tuning
from ..eligibility import OP, check, fp4_codes, gluon_elem_kind
from ..weight_state import WeightViews, state, views
from .prefill_ws import gluon_scale_args, prefill_ws_reason


def dt_large(q: QTensor) -> bool:
    """Whether ``q`` has at least ``tuning.decode_tma_eager_min_nk`` elements (the size from which
    :func:`decode_tma` serves more token counts, and eager calls)."""
    return q.shape[0] * q.shape[-1] >= tuning.get().decode_tma_eager_min_nk


def dt_min_m(q: QTensor) -> int:
    """The fewest tokens :func:`linear` sends to :func:`decode_tma` on weight ``q``."""
    least = tuning.get().decode_tma_min_m if dt_large(q) else tuning.get().decode_tma_small_min_m
    if q.fmt.element.bits == 8:
        small_int = q.fmt.element.kind == "int" and not dt_large(q)
        return max(least, tuning.get().decode_tma_small_min_m_int8 if small_int else tuning.get().decode_tma_min_m_8bit)
    if q.fmt.element.kind == "int":
        return max(least, tuning.get().decode_tma_min_m_int4 if q.fmt.zero_point else tuning.get().decode_tma_min_m_int4_sym)
    return least


def dt_post(q: QTensor, tok: int) -> bool:
    """Whether :func:`decode_tma` with ``tok`` token columns applies ``q``'s block scales to the
    MMA results (``tuning.dt_post_scale``): integer codes with fp16 scales in blocks of a multiple of 64."""
    return (tuning.get().dt_post_scale and q.fmt.element.kind == "int" and q.fmt.scale.name == "fp16" and dt_nps(q) == 1
            and tok <= tuning.get().dt_post_max_tok)


def dt_tokens(m: int) -> int:
    """Token columns of :func:`decode_tma`'s tile for ``m`` tokens: 8, 16, 32 or 64."""
    return 8 if m <= 8 else 16 if m <= 16 else 32 if m <= 32 else 64


def dt_nps(q: QTensor) -> int:
    """int32 block scales per row and K step in :func:`decode_tma`'s step-major copy of an
    integer weight with fp16 scales: 2 for blocks of 32, else 1 (E8M0 / UE4M3 scales: 1, four bytes)."""
    return 2 if q.fmt.scale.name == "fp16" and q.fmt.block_size == 32 else 1


def step_scales(q: QTensor, rows: int) -> torch.Tensor:
    """``q``'s block scales step-major for :func:`decode_tma`: ``[tiles * steps * rows / 64,
    256]`` uint8, where row tile ``t`` (``rows`` weight rows, zero-padded) and K step ``s`` (64
    elements) hold ``[rows, 4]`` bytes at row ``(t * steps + s) * rows / 64``: one byte per 16
    elements (E8M0 scales of 32 repeated), so that one TMA box brings a step's scales. For
    integers with fp16 scales a step holds ``[nps, rows]`` int32 (:func:`dt_nps`: 1 for
    blocks of a multiple of 64, the same bytes; 2 for blocks of 32), the fp16 scale bits of
    elements ``64 s + 32 j ..`` | the zero point << 16 (8 for two's-complement codes)."""
    n, k = q.shape
    tiles = cdiv(n, rows)
    if q.fmt.scale.name == "fp16":  # integers: fp16 bits | zero point << 16, dt_nps(q) int32 a step
        nps = dt_nps(q)
        zp = q.zero_points.to(torch.int32) if q.zero_points is not None else 8
        pk = (q.scales.reshape(n, -1).view(torch.int16).to(torch.int32) & 0xFFFF) | (zp << 16)
        pk = pk.repeat_interleave(q.fmt.block_size // 16, dim=1)[:, :: 4 // nps]  # the block of 64 s + 64 j / nps
        pad = torch.zeros((tiles * rows, k // 64 * nps), dtype=torch.int32, device=pk.device)
        pad[:n] = pk
        return (pad.reshape(tiles, rows, k // 64, nps).permute(0, 2, 3, 1).contiguous().view(torch.uint8)
                .reshape(-1, 256))
    sc = q.scales.reshape(n, -1).view(torch.uint8)
    if sc.shape[1] != k // 16:
        sc = sc.repeat_interleave(k // 16 // sc.shape[1], dim=1)
    pad = torch.zeros((tiles * rows, k // 16), dtype=torch.uint8, device=sc.device)
    pad[:n] = sc
    return pad.reshape(tiles, rows, k // 64, 4).permute(0, 2, 1, 3).reshape(-1, 256).contiguous()


@functools.lru_cache(maxsize=None)
def dt_layouts(wide: int, tok: int = 16, f16: bool = False) -> tuple:
    """Shared-memory layouts of :func:`decode_tma`'s TMA boxes: code words (``wide`` K steps a
    box) swizzled by their row width (conflict-free 8-byte reads of one K step's words by each
    quad), scale bytes unswizzled (each warp reads its own rows), activations (``[tok, 64]``,
    bf16 or ``f16``) as the MMA operand wants them."""
    from triton.experimental.gluon import language as gl

    return (gl.NVMMASharedLayout(swizzle_byte_width=0 if wide == 1 else 32 * wide, element_bitwidth=32, rank=2),
            gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2),
            gl.NVMMASharedLayout.get_default_for([tok, 64], gl.float16 if f16 else gl.bfloat16))


def dt_weight_descs(q: QTensor, wv: WeightViews, rows: int | None = None) -> tuple:
    """TMA descriptors of ``q``'s code words and step-major scales (:func:`step_scales`) for
    :func:`decode_tma` tiles of ``rows`` rows (default ``tuning.dt_rows``), made once per weight, tile
    height and version of its tensors and kept on it (not while a CUDA graph is being captured: the
    graph then makes its own step-major scales at every replay; :func:`linear`'s eager calls in the
    kernel's token range make them ahead, see :func:`route`)."""
    t = tuning.get()
    rows = rows or t.dt_rows
    trows = dt_table_rows(q, rows)
    st = state(q)
    return st.fact(q, ("dt_descs", rows, trows, t.dt_wide, t.dt_sbox),
                   lambda: _make_descs(q, st, wv, rows, trows, t.dt_wide, t.dt_sbox))


def _make_descs(q: QTensor, st, wv: WeightViews, rows: int, trows: int, wide: int, sbox: int) -> tuple:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # one step-major table per weight and table height, shared by the tile heights that read it
    table = st.fact(q, ("dt_table", trows), lambda: step_scales(q, trows))
    # a box of 8-bit codes (16 words a step) spans half the steps: the same 32 * wide-byte rows
    cw = wide if q.fmt.element.bits == 4 else max(wide // 2, 1)
    lw, ls, _ = dt_layouts(cw * q.fmt.element.bits // 4)
    if trows == rows:
        sdesc = TensorDescriptor.from_tensor(table, [sbox * dt_nps(q) * rows // 64, 256], ls)
    else:  # 128-row tiles on the 256-row table: [tiles256 x steps, half, 2, 256] (see _decode_tma_kernel)
        sdesc = TensorDescriptor(table, [table.shape[0] // 4, 2, 2, 256], [1024, 512, 256, 1], [sbox, 1, 2, 256],
                                 gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=4))
    return TensorDescriptor.from_tensor(wv.words, [rows, 2 * q.fmt.element.bits * cw], lw), sdesc


def dt_table_rows(q: QTensor, rows: int) -> int:
    """The tile height whose step-major scale layout :func:`decode_tma`'s ``rows``-row tiles read on
    ``q``: their own, or with ``tuning.dt_one_table`` the 256-row one for every E2M1 weight (one table for
    both heights, so that a weight can take 256-row tiles at 64 token columns and 128-row ones below)."""
    return tuning.get().dt_tile_big[0] if tuning.get().dt_one_table and fp4_codes(q) and rows == tuning.get().dt_rows else rows


def decode_tma_reason(q: QTensor, x: torch.Tensor) -> str | None:
    """Why :func:`decode_tma` cannot serve ``x @ dequant(q)^T``, or None."""
    why = prefill_ws_reason(q, x)
    if why is not None:
        return why
    if q.fmt.element.bits == 8 and not tuning.get().decode_tma_8bit:
        return "takes 8-bit codes only with tuning.decode_tma_8bit on"
    if q.fmt.element.bits == 8 and x.shape[0] > tuning.get().decode_tma_max_m_8bit:
        return f"serves 1 to {tuning.get().decode_tma_max_m_8bit} tokens with 8-bit codes, got {x.shape[0]}"
    if q.fmt.scale.name == "fp16" and q.fmt.block_size % 64 and q.fmt.block_size != 32:
        return f"serves integer weights with fp16 scales in blocks of 32 or a multiple of 64, not {q.fmt.block_size}"
    if not 1 <= x.shape[0] <= tuning.get().decode_tma_max_m:
        return f"serves 1 to {tuning.get().decode_tma_max_m} tokens, got {x.shape[0]}"
    if q.shape[1] % (64 * tuning.get().dt_chunk):
        return f"needs K a multiple of {64 * tuning.get().dt_chunk}, got {q.shape[1]}"
    return None


def dt_ring(rows: int, tok: int, k: int, bits: int) -> tuple[int, int]:
    """``(K steps per ring chunk, ring chunks)`` of :func:`decode_tma`'s ``rows``-row tiles with ``tok`` token
    columns on ``bits``-bit codes and K = ``k``: ``tuning.dt_big_chunk`` / ``tuning.dt_big_stages`` for the 256-row tile
    where they apply (4-bit codes, at most ``tuning.dt_big_chunk_max_tok`` columns, K a multiple of 64 x that chunk),
    else ``tuning.dt_chunk`` steps in as many chunks as shared memory holds."""
    if rows == tuning.get().dt_tile_big[0] and bits == 4 and tok <= tuning.get().dt_big_chunk_max_tok and k % (64 * tuning.get().dt_big_chunk) == 0:
        return tuning.get().dt_big_chunk, tuning.get().dt_big_stages
    return tuning.get().dt_chunk, tuning.get().dt_stages_8bit if bits == 8 else tuning.get().dt_stages if tok < 64 else min(tuning.get().dt_stages, tuning.get().dt_stages_64)


def choose_decode_tma_programs(n: int, k: int, num_sms: int, rows: int = 0, per_sm: int = 0, chunk: int = 0) -> int:
    """Programs for :func:`decode_tma` on an ``n x k`` weight, with tiles of ``rows`` rows,
    ``per_sm`` programs resident per SM and ring chunks of ``chunk`` K steps (default ``tuning.dt_rows``, ``tuning.dt_per_sm``,
    ``tuning.dt_chunk``). Units: row tiles, cut into
    the fewest K parts (a power of two, at most 8, dividing the chunks) that give every SM
    one; as many units per program as ``per_sm`` resident per SM need (whole units where the
    count divides) where that spreads evenly over the SMs, else ``per_sm`` programs per SM, each
    with an equal stream-K share (docs/decisions/linear-decode-tma.md)."""
    rows, per_sm = rows or tuning.get().dt_rows, per_sm or tuning.get().dt_per_sm
    tiles, nct = cdiv(n, rows), k // (64 * (chunk or tuning.get().dt_chunk))
    parts = 1
    while parts < 8 and tiles * parts < num_sms and nct % (2 * parts) == 0:
        parts *= 2
    units = tiles * parts
    per = cdiv(units, per_sm * num_sms)  # units per program
    programs = cdiv(units, per)
    # SMs run one or two programs: the busiest has ceil(programs / SMs), against programs / SMs on average
    if programs > num_sms and cdiv(programs, num_sms) * num_sms > 1.3 * programs:
        programs = per_sm * num_sms
    elif per_sm == 1 and units > num_sms and programs < 0.8 * num_sms:  # (several units each: SMs left idle)
        programs = num_sms
    return min(programs, tiles * nct)


@functools.lru_cache(maxsize=256)
def dt_parts(tiles: int, nct: int, programs: int) -> int:
    """Most programs sharing one row tile when :func:`decode_tma`'s ``programs`` take equal
    contiguous shares of the ``tiles x nct`` ring chunks (1: every tile is one program's)."""
    total = tiles * nct
    return max(((t + 1) * nct * programs - 1) // total - ((t * nct + 1) * programs - 1) // total + 1
               for t in range(tiles))


def dt_big(q: QTensor, m: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether :func:`decode_tma` takes its 256-row tile (``tuning.dt_tile_big``) for ``m`` tokens of ``dtype`` on
    ``q`` by default: E2M1 weights with bf16 activations (what that tile was built and tested for), at
    every token count where one 256-row tile per SM keeps 80-100% of the SMs busy (see ``tuning.dt_tile_big``),
    and with ``tuning.dt_one_table`` (one scale table for both heights) at 64 token columns, and at 16-32 where
    K >= 2 N (where each was measured faster)."""
    if not (fp4_codes(q) and dtype == torch.bfloat16):
        return False
    sms = target.num_sms(device)
    fills = 0.8 * sms <= cdiv(q.shape[0], tuning.get().dt_tile_big[0]) <= sms
    tok = dt_tokens(m)
    return fills or (tuning.get().dt_one_table and (tok == 64 or (tok >= 16 and q.shape[1] >= 2 * q.shape[0])))


def dt_tile(q: QTensor, x2: torch.Tensor, rows: int | None = None) -> tuple[int, int, int, int]:
    """:func:`decode_tma`'s tile for activations like ``x2`` on ``q``: ``(rows, row slices per consumer
    warp, programs per SM, registers)``. ``rows`` None: ``tuning.dt_tile_big`` where :func:`dt_big` says so, else
    ``tuning.dt_rows``; else the tile of that height, ValueError where the kernel has none."""
    big = fp4_codes(q) and x2.dtype == torch.bfloat16  # (the 256-row tile was built and tested for these)
    if rows is None:
        rows = tuning.get().dt_tile_big[0] if dt_big(q, x2.shape[0], x2.dtype, x2.device) else tuning.get().dt_rows
    if rows == tuning.get().dt_tile_big[0] and big:
        return tuning.get().dt_tile_big
    if rows == tuning.get().dt_rows:
        return tuning.get().dt_rows, 1, tuning.get().dt_per_sm, 80
    raise ValueError(f"{OP}: decode_tma takes rows={tuning.get().dt_rows}, or {tuning.get().dt_tile_big[0]} for E2M1 weights with "
                     f"bfloat16 activations; got rows={rows} for {q.fmt.name} and {x2.dtype}")


def decode_tma(x2: torch.Tensor, q: QTensor, bias: torch.Tensor | None = None,
               programs: int | None = None, tokens: int | None = None, rows: int | None = None) -> torch.Tensor:
    """``x2 [M <= 64, K] @ dequant(q)^T (+ bias)`` for bf16 or fp16 activations on Hopper and an E2M1
    weight (NVFP4, MXFP4), a 4/8-bit integer weight with fp16 scales in blocks of 32 or a multiple
    of 64 (``int4_affine_g*``, ``int4_fp16``, ``int8_affine_g*``, ``int8_fp16``), MXFP8 (E4M3, E5M2),
    MXINT4 or MXINT8 (8-bit codes: ``M <= 32``), with the
    warp-specialized Gluon kernel
    (:mod:`microscale.linear._kernels._decode_tma`: a producer warp brings each K step's code words,
    block scales and activations by TMA into a shared-memory ring, eight consumer warps
    decode them into ``mma.sync`` and free each slot each on its own; fp16 activations as in
    :func:`prefill_ws`). :func:`linear` routes here
    from ``tuning.decode_tma_min_m``
    (``tuning.decode_tma_small_min_m``; per format :func:`dt_min_m`) tokens while a CUDA graph is being
    captured and for large weights (``decode_tma_wanted``). Work: the row tiles' ring chunks (256 K elements,
    or 512: :func:`dt_ring`) in tile-major order, split into ``programs`` contiguous shares of equal size (stream-K;
    default :func:`choose_decode_tma_programs`); a tile shared by several programs is added
    up in K order (256-row tiles by their first program when every program is resident, else by the
    last part to arrive). ``tokens``: the tile's token columns (8, 16, 32 or 64, at
    least M; default the fewest). ``rows``: the tile height, 128 (8 consumer warps of 16 rows, two
    programs per SM) or 256 (E2M1 weights and bf16 activations: 8 warps of two 16-row slices, one
    program per SM); default :func:`dt_tile`. The first call on a weight makes its step-major scales
    and their TMA descriptors (kept in its state, per tile height). Raises ValueError saying why when
    it cannot serve the call."""
    check(x2, q.shape[0], q.shape[-1], q.device, bias)
    if tokens is not None and (tokens not in (8, 16, 32, 64) or tokens < x2.shape[0]):
        raise ValueError(f"{OP}: decode_tma needs tokens in (8, 16, 32, 64) and at least M={x2.shape[0]}, "
                         f"got {tokens}")
    why = decode_tma_reason(q, x2)
    if why is not None:
        raise ValueError(f"{OP}: decode_tma {why}")
    if programs is not None and programs < 1:
        raise ValueError(f"{OP}: decode_tma needs programs >= 1, got {programs}")
    return decode_tma_run(x2, q, bias, programs, tokens, rows)


def decode_tma_run(x2: torch.Tensor, q: QTensor, bias: torch.Tensor | None = None,
                   programs: int | None = None, tokens: int | None = None, rows: int | None = None,
                   global_scale: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`decode_tma` on a call already checked (:func:`decode_tma_reason` is None). ``global_scale``
    (float32 ``[1]`` on the device) multiplies the float32 sums in place of ``q``'s own global scale."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .._kernels import _decode_tma as dk
    from .._kernels import _prefill_gluon as pg
    from .._kernels import _ptx

    t = tuning.get()
    if t.dt_warp_arrive:
        _ptx.install()  # the PTX rewrite's compile hook, added once at the first launch
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    m, k = x2.shape
    n = q.shape[0]
    tok = dt_tokens(m) if tokens is None else tokens
    rows, slices, per_sm, nreg = dt_tile(q, x2, rows)
    cb = q.fmt.element.bits
    xp = scratch((m, k), x2.dtype, x2.device)  # activations in the consumers' K order
    launch(pg._xperm_kernel, (cdiv(m, 32), k // 64), x2, xp, m, x2.stride(0), K=k, BLOCK_R=32, CB=cb, num_warps=4)
    f16 = x2.dtype == torch.float16
    sk, ke, post = gluon_scale_args(q, f16)
    wv = views(q)
    w_desc, s_desc = dt_weight_descs(q, wv, rows)
    x_desc = TensorDescriptor.from_tensor(xp, [tok, 64], dt_layouts(tuning.get().dt_wide, tok, f16)[2])
    out = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    gs = global_scale if global_scale is not None else wv.global_scale
    tiles = cdiv(n, rows)
    chunk, stages = dt_ring(rows, tok, k, cb)
    nct = k // (64 * chunk)
    grid = min(tiles * nct, programs or choose_decode_tma_programs(n, k, target.num_sms(x2.device), rows, per_sm, chunk))
    maxp = dt_parts(tiles, nct, grid)
    ws, cnt = workspace(x2.device, tiles * maxp * rows * tok if maxp > 1 else 0, tiles * rows * 4 if maxp > 1 else 0)
    launch(dk._decode_tma_kernel, (grid,), w_desc, s_desc, x_desc, gs if gs is not None else out,
           bias if bias is not None else out,
           out, ws, cnt, n, m, tiles, maxp, ke, post, NCT=nct, C=chunk, SK=sk, STAGES=stages,
           HAS_GS=gs is not None, HAS_BIAS=bias is not None, NPS=dt_nps(q), CB=cb,
           EI=gluon_elem_kind(q), F16=f16,
           POST=dt_post(q, tok), WARP_ARRIVE=t.dt_warp_arrive and _ptx.active(), SLICES=slices,
           # a shared tile's first program may wait for later ones: only when all programs fit at once
           OWNER=slices == 2 and grid <= per_sm * target.num_sms(x2.device),
           num_warps=rows // (16 * slices), maxnreg=nreg)
    return out
