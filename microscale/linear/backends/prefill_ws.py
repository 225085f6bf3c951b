"""``prefill_ws``: the warp-specialized Gluon prefill kernel on Hopper (device code:
:mod:`microscale.linear._kernels._prefill_gluon`; docs/decisions/linear-prefill-ws.md)."""
from __future__ import annotations

import torch

from ...qtensor import QTensor
from ...runtime import target
from ...runtime.launch import cdiv, launch
from ...runtime.workspace import workspace
from .. import tuning
from ..eligibility import E8M0_F16_WINDOW, OP, check, f16_weight_reason, gluon_elem_kind, gluon_weight_reason
from ..weight_state import e8m0_range, e8m0_window, ue4m3_normal, views


def prefill_ws_reason(q: QTensor, x: torch.Tensor) -> str | None:
    """Why :func:`prefill_ws` cannot serve ``x @ dequant(q)^T``, or None."""
    why = gluon_weight_reason(q)
    if why is not None:
        return why
    f = q.fmt
    k = q.shape[1]
    if x.dim() != 2 or x.shape[1] != k or k % 64:
        return f"needs [M, K] activations with K = {k} a multiple of 64"
    if x.dtype not in (torch.bfloat16, torch.float16):
        return f"needs bfloat16 or float16 activations, got {x.dtype}"
    if not (x.is_cuda and q.data.is_cuda) or target.capability(x.device) != (9, 0):
        return "needs a Hopper GPU (sm_90: wgmma)"
    if not (q.data.is_contiguous() and q.scales.is_contiguous() and q.data.data_ptr() % 16 == 0):
        return "needs contiguous, 16-byte aligned codes and contiguous scales"
    if x.dtype == torch.float16:
        return f16_weight_reason(q)
    if f.scale.name == "e8m0" and e8m0_window(q) is None:
        return "E8M0 scales span more than 126 binades or hold NaN"
    return None


def ws_tail_parts(tiles: int, programs: int) -> int:
    """K parts per tail tile of :func:`prefill_ws` with ``split_tail`` (as the kernel's
    ``_plan``; it also caps them at the K step count): ``programs // R`` for the
    ``R = tiles % programs`` tiles past the last full wave, at most 8; 1 means unsplit."""
    tail = tiles % programs
    return max(min(programs // tail, 8), 1) if tail else 1


def choose_prefill_ws_tile(m: int, n: int, num_sms: int, split_tail: bool = True) -> tuple[int, int]:
    """``(block_t, stages)`` for :func:`prefill_ws` on ``m`` tokens and ``n`` weight rows: the
    token tile with the least modelled time, the waves of tiles times the tile's cost
    (``block_t / rate``), so that few-token calls on few rows still fill the SMs. With
    ``split_tail`` a last wave of ``R`` tiles costs ``1 / S`` of a wave (``S = SMs // R``
    parts, at most 8; see :func:`prefill_ws`)."""
    rows = 2 * 64  # two consumer warpgroups of 64 rows

    def cost(bt: int) -> float:
        tiles = -(-m // bt) * -(-n // rows)
        full, tail = divmod(tiles, num_sms)
        parts = ws_tail_parts(tiles, num_sms) if split_tail else 1
        return (full + (1 / parts if tail else 0)) * bt / rate[bt]

    t = tuning.get()
    rate = dict(t.ws_tile_rate)
    bt = min(rate, key=lambda b: (cost(b), -b))
    return bt, dict(t.ws_stages)[bt]


def gluon_scale_args(q: QTensor, f16: bool = False) -> tuple[int, int, float]:
    """``(SK, ke, post)`` of the Gluon kernels' decode (:mod:`microscale.linear._kernels._prefill_gluon`)
    for weight ``q`` (``f16``: the f16 decode, for fp16 activations): the scale kind, the E8M0
    exponent offset and the power of two the scale placement leaves to the epilogue."""
    from .._kernels import _prefill_gluon as pg

    f = q.fmt
    if f.scale.name == "ue4m3":  # bf16: E2M1 as v * 2^-126 and s * 2^119; f16: v * 2^-14 and s
        sk = pg.SK_UE4M3N if not f16 and tuning.get().gluon_scale_imad and ue4m3_normal(q) else pg.SK_UE4M3
        return sk, 0, 2.0 ** (14 if f16 else 7)
    if f.scale.name == "e8m0" and f16:
        # f16 scale bits (e + ke) << 10, the decode gives v * 2^-B: the sums want 2^(e - 127 + B - frac) /
        # 2^(e + ke - 15); the largest scale goes to the top of the window
        _, top, b = E8M0_F16_WINDOW[(gluon_elem_kind(q), f.element.bits)]
        ke = top - e8m0_range(q)[1]
        return pg.SK_E8M0, ke, 2.0 ** (b - 112 - ke - f.element.frac_bits)
    if f.scale.name == "e8m0":
        # the decode gives v * 2^-B and the E8M0 scale is 2^(e + C - D - 127) (ke = C - D), so the sums
        # want 2^(B - C + D) (times the integers' 2^-frac); C keeps each element's least nonzero code
        # times the smallest scale at or above 2^-133, bf16's least subnormal
        b, c = E8M0_PLACEMENT[(gluon_elem_kind(q), f.element.bits)]
        d = e8m0_window(q)
        return pg.SK_E8M0N if tuning.get().gluon_scale_imad else pg.SK_E8M0, c - d, 2.0 ** (b - c + d - f.element.frac_bits)
    return (pg.SK_F16Z if f.zero_point else pg.SK_F16), 0, 1.0  # integers, fp16 scales


#: ``(B, C)`` per Gluon element kind and code width (:func:`gluon_scale_args`): E2M1 placed as
#: ``v * 2^-126``; E4M3 as ``v * 2^-120`` with the window one binade lower; E5M2 as ``v * 2^-112``;
#: integers (MXINT4, MXINT8) exact, their products in [2^-125, 2^8]
E8M0_PLACEMENT = {(0, 4): (126, 126), (0, 8): (120, 121), (2, 8): (112, 120), (1, 4): (0, 0), (1, 8): (0, 0)}


def launch_direct(fn, grid, *args, **kwargs) -> None:
    """``fn[grid](...)``: the Gluon kernel's TMA descriptor is no key for ``launch``'s cache
    (``tools/gemv_ptx.py --ws`` replaces this to compile without a GPU)."""
    fn[grid](*args, **kwargs)


def prefill_ws(x2: torch.Tensor, q: QTensor, bias: torch.Tensor | None = None, block_t: int | None = None,
               stages: int | None = None, group_t: int = 4, persistent: bool = True,
               split_tail: bool | None = None) -> torch.Tensor:
    """``x2 [M, K] @ dequant(q)^T (+ bias)`` for many tokens of bf16 or fp16 activations on Hopper and an
    E2M1 weight (NVFP4, MXFP4), 4-bit integers with fp16 block scales (``int4_affine_g*`` with
    zero points of at most 15, ``int4_fp16``), 8-bit integers with fp16 block scales
    (``int8_affine_g*``, ``int8_fp16``: each weight the bf16 of ``(code - z) * s`` but within 2^-15
    of a rounding tie, relative, see :func:`microscale.linear._kernels._prefill_gluon.int8_decode_asm`), MXFP8
    (E4M3 / E5M2 codes without Inf / NaN, E8M0 scales), MXINT4 or MXINT8,
    with the warp-specialized Gluon kernel
    (:mod:`microscale.linear._kernels._prefill_gluon`: TMA ring for the activations, two consumer
    warpgroups decoding the codes straight into the wgmma register operand; fp16 activations: f16
    decodes and fp16 MMAs, weights exact or the f16 of ``(code - z) * s``, within the limits of
    :func:`f16_weight_reason`). :func:`linear`
    routes here from ``tuning.prefill_ws_min_m`` tokens. ``block_t``: tokens per tile (the wgmma N:
    64, 128 or 256); ``stages``: activation ring slots (both default to
    :func:`choose_prefill_ws_tile`); ``group_t``: token tiles that sweep the row tiles together
    (L2 reuse); ``persistent``: one program per SM looping over the tiles (else one per
    tile); ``split_tail`` (persistent only; default ``tuning.prefill_ws_split_tail``): the ``R``
    tiles past the last full wave (all tiles when fewer than the SMs) are split in K into
    ``SMs // R`` parts (2 to 8) on as many programs, the parts' fp32 sums added up in K
    order by each tile's last part (a workspace per device and stream). Raises ValueError
    saying why when it cannot serve the call."""
    check(x2, q.shape[0], q.shape[-1], q.device, bias)
    why = prefill_ws_reason(q, x2)
    if why is not None:
        raise ValueError(f"{OP}: prefill_ws {why}")
    return prefill_ws_run(x2, q, bias, block_t, stages, group_t, persistent, split_tail)


def prefill_ws_run(x2: torch.Tensor, q: QTensor, bias: torch.Tensor | None = None, block_t: int | None = None,
                   stages: int | None = None, group_t: int = 4, persistent: bool = True,
                   split_tail: bool | None = None, global_scale: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`prefill_ws` on a call already checked (:func:`prefill_ws_reason` is None). ``global_scale``
    (float32 ``[1]`` on the device) multiplies the float32 sums in place of ``q``'s own global scale."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .._kernels import _prefill_gluon as pg

    split_tail = persistent and (tuning.get().prefill_ws_split_tail if split_tail is None else split_tail)
    sms = target.num_sms(x2.device)
    if block_t is None:
        block_t, auto_stages = choose_prefill_ws_tile(x2.shape[0], q.shape[0], sms, split_tail)
        stages = auto_stages if stages is None else stages
    stages = dict(tuning.get().ws_stages).get(block_t, 4) if stages is None else stages
    # shared memory: the activation ring and two output tiles (<= 227 KB on an H100 / H200)
    if block_t not in (64, 128, 256) or stages < 2 or group_t < 1 or (stages + 2) * block_t * 128 > 200 * 1024:
        raise ValueError(f"{OP}: prefill_ws needs block_t in (64, 128, 256), 2 <= stages <= "
                         f"{200 * 8 // block_t - 2} for block_t={block_t}, group_t >= 1")
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    m, k = x2.shape
    n = q.shape[0]
    f = q.fmt
    bk = int(pg.BK.value)
    cb = f.element.bits  # 4, or 8 (E4M3, 8-bit integers)
    f16 = x2.dtype == torch.float16
    gdt = gl.float16 if f16 else gl.bfloat16
    xp = torch.empty((m, k), dtype=x2.dtype, device=x2.device)  # activations in the consumers' K order
    launch(pg._xperm_kernel, (cdiv(m, 32), k // bk), x2, xp, m, x2.stride(0), K=k, BLOCK_R=32, CB=cb, num_warps=4)
    desc = TensorDescriptor.from_tensor(xp, [block_t, bk], gl.NVMMASharedLayout.get_default_for([block_t, bk], gdt))
    wv = views(q)
    scales, zps = wv.scales_u8, wv.scales_u8
    sk, ke, post = gluon_scale_args(q, f16)
    if f.scale.name == "fp16":  # integers: fp16 scales as int16 bits, zero points
        scales = wv.scales_int
        zps = wv.zero_points if f.zero_point else scales
    out = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    gs = global_scale if global_scale is not None else wv.global_scale
    rows = int(pg.WG_ROWS.value)
    tma_out = n % 8 == 0  # TMA needs 16-byte row strides
    out_desc = (TensorDescriptor.from_tensor(out, [block_t, rows], gl.NVMMASharedLayout.get_default_for(
        [block_t, rows], gdt)) if tma_out else desc)
    tiles = cdiv(m, block_t) * cdiv(n, 2 * rows)
    grid = sms if split_tail else (min(tiles, sms) if persistent else tiles)
    split = split_tail and ws_tail_parts(tiles, grid) > 1  # a partial tile per program, counters per tail tile
    ws, cnt = workspace(x2.device, grid * 2 * rows * block_t if split else 0, (tiles % grid) * 2 * rows * 4 if split
                         else 0)
    launch_direct(pg._prefill_ws_kernel, (grid,), desc, wv.words, scales, zps, gs if gs is not None else out,
                   bias if bias is not None else out, out, out_desc, ws, cnt, n, m, k, wv.words.stride(0),
                   scales.stride(0), out.stride(0), ke, post, BT=block_t, STAGES=stages, GROUP_T=group_t,
                   SK=sk, TPS=f.block_size // 16, HAS_GS=gs is not None, HAS_BIAS=bias is not None,
                   TMA_OUT=tma_out, SPLIT_TAIL=split_tail, CB=cb, EI=gluon_elem_kind(q), F16=f16, num_warps=4)
    return out
