"""``a @ b^T`` on fp8 tensor cores for operands whose codes are fp8 bytes (device code:
``_scaled_fp8._scaled_fp8_kernel``): fp8 block-128 activations x 128x128-block weights (DeepSeek-V3)
and MXFP8 pairs of one fp8 type. The codes reach the MMA as stored; each chunk of the smaller block
size is promoted to float32 and scaled, as DeepGEMM does every 128 K.

This is the ``fast_accum`` path of :func:`microscale.scaled_mm`: Hopper's fp8 MMA adds the products
of one instruction with fewer bits than float32, so the result differs from the exact oracle by more
than float32 summation order (about 1e-4 relative at 128-element chunks on an H200;
docs/decisions/scaled-mm-operands.md). Without ``fast_accum`` the exact kernels serve.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ...formats import Format
from ...formats.elements import ElementCodec
from ...runtime import target
from ...runtime.launch import cdiv, launch
from .. import tuning
from ..scaled import ScaledOperand, parse_meta
from .scaled_exact import launch_output, operand_constexprs

#: fp8 types whose bytes are the values: the kernel's FP8 constexpr per torch dtype
_FP8_TYPES = {1: torch.float8_e4m3fn, 2: torch.float8_e5m2}


@functools.lru_cache(maxsize=None)
def _codes_are(el: ElementCodec, dtype: torch.dtype) -> bool:
    """Whether ``el``'s 8-bit codes decode to exactly the values of the same bytes read as ``dtype``
    (every code: NaN where that is NaN, Inf where Inf)."""
    if el.bits != 8:
        return False
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    mine = el.decode(codes).to(torch.float64)
    theirs = codes.view(dtype).to(torch.float64)
    same_nan = torch.isnan(mine) == torch.isnan(theirs)
    return bool(same_nan.all() and torch.equal(torch.nan_to_num(mine), torch.nan_to_num(theirs)))


def fp8_codes_kind(fa: Format, fb: Format) -> int:
    """The kernel's fp8 type (1 e4m3, 2 e5m2) when both formats' codes are bytes of that type and
    neither has zero points, else 0."""
    if fa.zero_point or fb.zero_point:
        return 0
    for kind, dt in _FP8_TYPES.items():
        if _codes_are(fa.element, dt) and _codes_are(fb.element, dt):
            return kind
    return 0


def scaled_fp8_reason(fa: Format, fb: Format) -> str | None:
    """Why the fp8 kernel cannot take ``fa`` x ``fb`` (None: it can)."""
    if not fp8_codes_kind(fa, fb):
        return (f"needs both operands' codes to be bytes of one fp8 type (e4m3fn or e5m2), got {fa.name} x "
                f"{fb.name}")
    if min(fa.block_size, fb.block_size) < 32:
        return f"needs chunks of >= 32 elements (the fp8 MMA's K step), got {min(fa.block_size, fb.block_size)}"
    return None


@torch.compiler.disable  # (a host-side rule on formats: cached, not traced)
def fast_accum_takes(fa: Format, fb: Format, m: int) -> bool:
    """Whether ``scaled_mm(..., fast_accum=True)`` runs ``m`` rows of ``fa`` x ``fb`` here: pairs the kernel
    takes whose values are not exact in bf16 (float32 / float16 block scales: fp8 block-128). Pairs exact in
    bf16 (MXFP8) keep the linear op's exact kernels at every M: they stream the weight at 85% of copy up to
    64 rows and run 0.89x cuBLAS bf16 at 4096, and this kernel's 32-element chunks (four promotions per 128 K)
    were not measured to beat them."""
    from .scaled_exact import bf16_exact

    del m  # (the rule holds at every M measured: 1-4096 rows)
    return scaled_fp8_reason(fa, fb) is None and not (bf16_exact(fa) and bf16_exact(fb))


@dataclass(frozen=True)
class Fp8Config:
    """Output tile ``block_m x block_n``; ``group_m`` row tiles share a column tile's weight strip in L2;
    ``warp_specialize``: the compiler's producer/consumer warp split of the K loop; ``tma``: tiles through
    TMA descriptors where the operands allow (16-byte aligned rows), pointer loads otherwise. ``gluon``: the
    warp-specialized Gluon kernel instead (:func:`scaled_fp8_ws_reason` says where it runs; ``block_m``
    128, ``block_n`` 64 or 128 (256 spills: two float32 tiles per thread; 128 also spills a little with
    per-row weight scales, 32 of them a thread and chunk), ``num_stages`` ring slots, ``num_warps`` unused)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    warp_specialize: bool = False
    tma: bool = True
    gluon: bool = False


def choose_fp8_config(m: int, n: int, kb: int, sms: int = 132) -> Fp8Config:
    """Tiles by token count, from an H100 sweep (28672x8192 and 8192x8192, fp8 block-128): up to 64 tokens
    64-row tiles (the smallest Hopper MMA), 128 columns where that still gives a tile per SM (1.80x cuBLAS
    bf16 at 1-16 tokens on 28672 rows, against 1.37-1.60x for 64 columns), else 64, by pointer loads; beyond,
    128 x 128 with 8 warps and 3 stages through TMA (813 TFLOP/s at 4096 tokens; 4 stages 780, pointer loads
    776, 128 x 256 or 4 warps far less)."""
    if m <= 64:  # pointer loads: as fast here (87.9 against 89.0 µs) and launched without building descriptors
        bn = 128 if -(-n // 128) >= sms else 64
        return Fp8Config(64, bn, 4, 4 if bn == 128 else 5, tma=False)
    return Fp8Config(128, 128, 8, 3)


def _tma_ok(t: torch.Tensor) -> bool:
    """Whether a TMA descriptor can address ``t`` (rows of 1-byte codes): 16-byte aligned base and rows."""
    return t.stride(1) == 1 and t.data_ptr() % 16 == 0 and t.stride(0) % 16 == 0


#: K elements per chunk of the Gluon kernel (its ring slot and promotion)
_WS_BK = 128
#: scale kinds of :func:`operand_constexprs` -> the dtype the Gluon kernel reads them as (E8M0: bytes)
_WS_SCALE_DTYPES = {1: torch.uint8, 3: torch.float16, 4: torch.bfloat16, 5: torch.float32}


def scaled_fp8_ws_reason(oa: ScaledOperand, ob: ScaledOperand, config: Fp8Config | None = None) -> str | None:
    """Why the warp-specialized Gluon kernel cannot run ``oa x ob`` (formats the fp8 kernel takes), or None."""
    fa, fb = parse_meta(oa.meta)[0], parse_meta(ob.meta)[0]
    if fa.block_size % _WS_BK or fb.block_size % _WS_BK:
        return f"needs block sizes that are multiples of {_WS_BK} along K, got {fa.block_size} x {fb.block_size}"
    if not (oa.codes.is_cuda and ob.codes.is_cuda) or target.capability(oa.codes.device) != (9, 0):
        return "needs a Hopper GPU (sm_90: wgmma, TMA)"
    if not all(_tma_ok(t) for t in (oa.codes, ob.codes)):
        return "needs 16-byte aligned code rows (TMA)"
    kinds = [operand_constexprs(f)["SCALE_KIND"] for f in (fa, fb)]
    if any(k not in _WS_SCALE_DTYPES for k in kinds):
        return f"reads float32 / float16 / bfloat16 / E8M0 block scales, not {fa.scale.name} x {fb.scale.name}"
    if config is not None and (config.block_m != 128 or config.block_n not in (64, 128)
                               or not 2 <= config.num_stages <= (200 * 1024) // ((128 + config.block_n) * _WS_BK)):
        return (f"needs block_m 128, block_n 64 / 128 and 2..{(200 * 1024) // ((128 + config.block_n) * _WS_BK)}"
                f" stages, got {config.block_m} x {config.block_n}, {config.num_stages} stages")
    return None


def _ws_launch(oa: ScaledOperand, ob: ScaledOperand, bias: torch.Tensor | None, out: torch.Tensor, m: int, n: int,
               k: int, dt: torch.dtype, ca: dict, cb: dict, c: Fp8Config) -> None:
    """Launch :mod:`microscale.linear._kernels._scaled_fp8_ws` (one persistent program per SM)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .._kernels import _scaled_fp8_ws as kern
    from .prefill_ws import launch_direct

    gdt = gl.float8e4nv if dt == torch.float8_e4m3fn else gl.float8e5
    a8, b8 = oa.codes.view(dt), ob.codes.view(dt)
    # (the logical [rows, K]: code columns past K, a padded operand's, are never read; TMA fills zeros there)
    a_desc = TensorDescriptor(a8, [m, k], [a8.stride(0), 1], [128, _WS_BK],
                              gl.NVMMASharedLayout.get_default_for([128, _WS_BK], gdt))
    b_desc = TensorDescriptor(b8, [n, k], [b8.stride(0), 1], [c.block_n, _WS_BK],
                              gl.NVMMASharedLayout.get_default_for([c.block_n, _WS_BK], gdt))
    sa, sb = (o.scales.view(_WS_SCALE_DTYPES[ce["SCALE_KIND"]]) for o, ce in ((oa, ca), (ob, cb)))
    dummy = out
    tiles = cdiv(m, 128) * cdiv(n, c.block_n)
    launch_direct(kern._scaled_fp8_ws_kernel, (min(tiles, target.num_sms(out.device)),), a_desc, b_desc, sa, sb,
                  oa.global_scale if oa.global_scale is not None else dummy,
                  ob.global_scale if ob.global_scale is not None else dummy,
                  bias if bias is not None else dummy, out, m, n, k, sa.stride(0), sb.stride(0), out.stride(0),
                  A_KIND=ca["SCALE_KIND"], A_GROUP=ca["GROUP"], A_GROUP_ROWS=ca["GROUP_ROWS"],
                  B_KIND=cb["SCALE_KIND"], B_GROUP=cb["GROUP"], B_GROUP_ROWS=cb["GROUP_ROWS"],
                  HAS_GA=oa.global_scale is not None, HAS_GB=ob.global_scale is not None, HAS_BIAS=bias is not None,
                  STAGES=c.num_stages, GROUP_M=c.group_m, num_warps=4)


def scaled_fp8_launch(oa: ScaledOperand, ob: ScaledOperand, bias: torch.Tensor | None, out_dtype: torch.dtype,
                      config: Fp8Config | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the fp8 kernel on prepared operands (formats checked by :func:`scaled_fp8_reason`; the Gluon
    kernel where ``config.gluon``, checked by :func:`scaled_fp8_ws_reason`)."""
    from .._kernels import _scaled_fp8 as kern

    why = scaled_fp8_reason(parse_meta(oa.meta)[0], parse_meta(ob.meta)[0])
    if why is None and config is not None and config.gluon:
        why = scaled_fp8_ws_reason(oa, ob, config)
    if why is not None:
        raise ValueError(f"scaled_mm: the fp8 kernel {why}")
    fa, fb, (m, n, k), out, done = launch_output(oa, ob, bias, out_dtype, out)
    if done:
        return out
    dev = oa.codes.device
    kb = min(fa.block_size, fb.block_size)
    c = config if config is not None else choose_fp8_config(m, n, kb, target.num_sms(dev))
    if config is None and 0 < tuning.get().fp8_gluon_min_m <= m and operand_constexprs(fb)["GROUP_ROWS"] % 128 == 0:
        ws = Fp8Config(128, 128, 4, 4, gluon=True)  # (per-row weight scales measured slower there: Triton keeps them)
        c = ws if scaled_fp8_ws_reason(oa, ob, ws) is None else c
    if c.gluon:
        _ws_launch(oa, ob, bias, out, m, n, k, _FP8_TYPES[fp8_codes_kind(fa, fb)], operand_constexprs(fa),
                   operand_constexprs(fb), c)
        return out
    ca, cb = operand_constexprs(fa), operand_constexprs(fb)
    dt = _FP8_TYPES[fp8_codes_kind(fa, fb)]
    a8, b8 = oa.codes.view(dt), ob.codes.view(dt)  # (the codes are the values: the MMA reads them as they are)
    tma = c.tma and all(_tma_ok(t) for t in (a8, b8))
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        a8 = TensorDescriptor(a8, [m, k], [a8.stride(0), 1], [c.block_m, kb])
        b8 = TensorDescriptor(b8, [n, k], [b8.stride(0), 1], [c.block_n, kb])
    dummy = oa.codes
    grid = (cdiv(m, c.block_m) * cdiv(n, c.block_n),)
    launch(kern._scaled_fp8_kernel, grid,
           a8, oa.scales, oa.global_scale if oa.global_scale is not None else dummy,
           b8, ob.scales, ob.global_scale if ob.global_scale is not None else dummy,
           bias if bias is not None else dummy, out, m, n, k,
           oa.codes.stride(0), oa.scales.stride(0), ob.codes.stride(0), ob.scales.stride(0), out.stride(0),
           A_SCALE_KIND=ca["SCALE_KIND"], A_SB=ca["SB"], A_GROUP=ca["GROUP"], A_GROUP_ROWS=ca["GROUP_ROWS"],
           B_SCALE_KIND=cb["SCALE_KIND"], B_SB=cb["SB"], B_GROUP=cb["GROUP"], B_GROUP_ROWS=cb["GROUP_ROWS"],
           HAS_GA=oa.global_scale is not None, HAS_GB=ob.global_scale is not None, HAS_BIAS=bias is not None,
           KB=kb, CHUNKS=cdiv(k, kb), BLOCK_M=c.block_m, BLOCK_N=c.block_n, GROUP_M=c.group_m,
           WS=c.warp_specialize, TMA=tma,
           INTERP=target.interpreting(), num_warps=c.num_warps, num_stages=c.num_stages)
    return out
