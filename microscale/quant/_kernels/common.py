"""Small exact helpers shared by the quant kernels: float bits, casts, NaN rules,
integer rounding, the correctly rounded division, and the programmatic-launch prologue."""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...formats.kinds import ScaleKind

# the kernels' SCALE_KIND values: microscale.formats.kinds.ScaleKind (FP16, BF16 and FP32 share one path)
SK_E8M0 = tl.constexpr(int(ScaleKind.E8M0))
SK_UE4M3 = tl.constexpr(int(ScaleKind.UE4M3))
SK_FP16 = tl.constexpr(int(ScaleKind.FP16))  # the first of the float-dtype kinds


@triton.jit
def _bits(x):
    return x.to(tl.int32, bitcast=True)


@triton.jit
def _flt(b):
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _to_f32(v):
    """Loaded values -> float32, exactly (bf16 by bit placement: the interpreter's cast
    flushes bf16 subnormals; on the GPU this is the same single shift as the cast)."""
    if v.dtype == tl.bfloat16:
        r = _flt(v.to(tl.int16, bitcast=True).to(tl.int32) << 16)
    else:
        r = v.to(tl.float32)
    return r


@triton.jit
def _cast(v, ty: tl.constexpr, MANUAL_BF16: tl.constexpr):
    """float32 -> ``ty`` with round-to-nearest-even. ``MANUAL_BF16``: do the bf16 rounding
    on the bits (the interpreter's bf16 cast does not round to nearest even)."""
    if MANUAL_BF16 and ty == tl.bfloat16:
        b = _bits(v)
        r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        r = tl.where(v != v, (b >> 16) | 0x40, r)
        out = r.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        out = v.to(ty)
    return out


@triton.jit
def _isfinite(x):
    return (_bits(x) & 0x7FFFFFFF) < 0x7F800000


@triton.jit
def _clamp_nan(v, lo, hi):
    """torch.clamp semantics: NaN stays NaN (PTX min/max would drop it)."""
    return tl.where(v != v, v, tl.minimum(tl.maximum(v, lo), hi))


@triton.jit
def _nan_rule(q, a, b, DEFAULT_NAN: tl.constexpr):
    """Give a NaN result of ``a (op) b`` the sign the host CPU gives it."""
    nb = tl.where(a != a, _bits(a), tl.where(b != b, _bits(b), DEFAULT_NAN))
    return tl.where(q != q, _flt(nb), q)


@triton.jit
def _round_int(t, ROUNDING: tl.constexpr):
    """Round float32 ``t`` (|t| <= 2^22, not NaN) to an integer-valued float32.
    0: nearest-even (magic number, exact IEEE adds); 1: nearest, ties away."""
    if ROUNDING == 0:
        r = (t + 12582912.0) - 12582912.0
    else:
        f = tl.floor(tl.abs(t) + 0.5)
        r = _flt((_bits(f) & 0x7FFFFFFF) | (_bits(t) & -2147483648))
    return r


@triton.jit
def _rint_s32(t):
    """``cvt.rni.s32.f32``: ``t`` rounded to the nearest integer, ties to even, as int32 in one instruction
    (``_round_int(t, 0)`` then a conversion; |t| < 2^31, not NaN; GPU only)."""
    return tl.inline_asm_elementwise("cvt.rni.s32.f32 $0, $1;", "=r,f", [t], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _rcp_rn_normal(d):
    """RN(1/d) for d in [2^-100, 2^100] (GPU only): the in-range branch of ``rcp.rn.f32``
    (an approximate reciprocal and one Newton step, as ptxas expands it), without its
    range test and out-of-line slow path."""
    return tl.inline_asm_elementwise(
        "{\n.reg .f32 y, t;\nrcp.approx.ftz.f32 y, $1;\nfma.rn.f32 t, $1, y, 0fBF800000;\nneg.f32 t, t;\n"
        "fma.rn.f32 $0, y, t, y;\n}", "=f,f", [d], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _markstein_div(a, r, nd):
    """RN(a / d) from r = RN(1/d) and nd = -d: q = RN(a r), e = a - q d (exact by fma),
    RN(q + e r). This is ``div.rn.f32``'s own sequence where its range check passes (a = 0
    or a in [2^-60, 2^60), d in [2^-40, 2^60] are well inside it); GPU only (the
    interpreter's fma rounds twice)."""
    q = a * r
    return tl.math.fma(tl.math.fma(q, nd, a), r, q)


@triton.jit
def _pdl_start(PDL: tl.constexpr, TRIGGER: tl.constexpr):
    """Launched as a programmatic dependent (Hopper+): wait for the previous kernel's results
    before any read (every read and write stays after the wait, so the stream order is what
    it was) and, with ``TRIGGER``, let the next kernel launch once every program of this
    grid runs, which hides the launch and ramp of back-to-back kernels. Quantize does not
    trigger: its codes may be a weight that the decode GEMV reads before its own wait
    (the linear tuning field ``gemv_pdl_chain``); dequantize writes dense tensors only."""
    if PDL:
        if TRIGGER:
            gdc_launch_dependents()
        gdc_wait()
