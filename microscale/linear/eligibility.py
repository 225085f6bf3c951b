"""What the linear kernels take: input checks, the weight families each decoder serves
(pure functions of the format and of the weight's scanned facts)."""
from __future__ import annotations

import torch

from ..formats import Format
from ..formats.kinds import ElementKind, element_kind
from ..qtensor import QTensor
from .weight_state import e8m0_range, f16_scale_max, has_specials, state, zero_point_max

OP = "linear"


_KINDS: dict = {}  # id(fmt) -> (fmt, kind): asked on every call; a Format's own hash walks all its fields


def gemv_kind(fmt: Format) -> int | None:
    """The decoders' element kind (``KIND``) of a format as a plain int, or None when none decodes it."""
    hit = _KINDS.get(id(fmt))
    if hit is not None and hit[0] is fmt:
        return hit[1]
    k = element_kind(fmt)
    if len(_KINDS) >= 256:
        _KINDS.clear()
    _KINDS[id(fmt)] = (fmt, None if k is None else int(k))  # (fmt kept: its id is not reused meanwhile)
    return _KINDS[id(fmt)][1]


def check(x: torch.Tensor, n: int, k: int, device: torch.device, bias: torch.Tensor | None,
          dtypes: tuple = (torch.bfloat16, torch.float16)) -> None:
    """Clear errors for what every route of :func:`linear` assumes (weight ``[n, k]`` on
    ``device``; x of one of ``dtypes``)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{OP}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        raise TypeError(f"{OP}: x has dtype {x.dtype}; expected {' or '.join(str(d).split('.')[-1] for d in dtypes)}")
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"{OP}: x has shape {tuple(x.shape)}; its last dim must be K={k} of the weight")
    if x.device != device:
        raise ValueError(f"{OP}: x is on {x.device} but the weight is on {device}")
    if bias is not None:
        if bias.shape != (n,):
            raise ValueError(f"{OP}: bias has shape {tuple(bias.shape)}; expected ({n},)")
        if bias.device != x.device:
            raise ValueError(f"{OP}: bias is on {bias.device} but x is on {x.device}")


def e2m1_weight_reason(q: QTensor) -> str | None:
    """:func:`_e2m1_weight_reason`, once per weight version (kept in its state)."""
    return state(q).fact(q, "e2m1_reason", lambda: _e2m1_weight_reason(q))


def _e2m1_weight_reason(q: QTensor) -> str | None:
    """Why ``q`` is not a weight the E2M1 tensor-core kernels (:func:`gemv_mma`,
    :func:`prefill_ws`) take, or None: E2M1 codes with UE4M3 (16) or E8M0 (32) block scales,
    an unpadded 2-D weight with row-major scales."""
    f = q.fmt
    el = f.element
    if not (el.kind == "float" and (el.bits, el.mbits, el.bias) == (4, 1, 1) and not f.zero_point
            and f.block_rows == 1 and (f.scale.name, f.block_size) in (("ue4m3", 16), ("e8m0", 32))):
        return f"serves E2M1 weights with UE4M3 (16) or E8M0 (32) block scales, not {f.name}"
    if len(q.shape) != 2 or tuple(q.padded_shape) != tuple(q.shape) or \
            tuple(q.scales.shape) != (q.shape[0], q.shape[1] // f.block_size):
        return "needs an unpadded 2-D weight with row-major scales"
    return None


def int_weight_reason(q: QTensor) -> str | None:
    """Why ``q`` is not an integer weight the Gluon kernels (:func:`prefill_ws`,
    :func:`decode_tma`) take, or None: 4- or 8-bit codes with fp16 block scales of a multiple of
    16, unsigned with uint8 zero points (affine, ``int*_affine_g*``; 4-bit ones at most 15) or two's
    complement (``int4_fp16``, ``int8_fp16``), or two's complement with E8M0 scales of 32 (MXINT4,
    MXINT8); an unpadded 2-D weight with row-major scales."""
    f = q.fmt
    el = f.element
    kind = gemv_kind(f)
    f16 = kind in (ElementKind.UINT4_ZP, ElementKind.INT4, ElementKind.UINT8_ZP, ElementKind.INT8) and el.frac_bits == 0 and f.scale.name == "fp16" \
        and f.block_size % 16 == 0
    mx = kind in (ElementKind.INT8, ElementKind.INT4) and f.scale.name == "e8m0" and f.block_size == 32
    if not ((f16 or mx) and f.block_rows == 1):
        return (f"serves 4/8-bit integers with fp16 block scales (a multiple of 16) or E8M0 scales of 32, "
                f"not {f.name}")
    kb = q.shape[1] // f.block_size if len(q.shape) == 2 else -1
    if len(q.shape) != 2 or tuple(q.padded_shape) != tuple(q.shape) or tuple(q.scales.shape) != (q.shape[0], kb) \
            or (f.zero_point and tuple(q.zero_points.shape) != (q.shape[0], kb)):
        return "needs an unpadded 2-D weight with row-major scales"
    if f.zero_point and el.bits == 4:
        zmax = zero_point_max(q)  # 128 + z and (code - z) * (the scale's low 3 bits) stay exact in bf16
        if zmax is None or zmax > 15:
            return "needs zero points of at most 15 (scanned once; unscanned during a CUDA graph capture)"
    return None


def e4m3_weight_reason(q: QTensor) -> str | None:
    """Why ``q`` is not an 8-bit float weight :func:`prefill_ws` takes, or None: E4M3 or E5M2 codes
    with E8M0 block scales of 32 (``mxfp8_e4m3``, ``mxfp8_e5m2``) and no Inf / NaN code (scanned
    once; assumed present while a CUDA graph is captured unscanned), an unpadded 2-D weight with
    row-major scales."""
    f = q.fmt
    if not (gemv_kind(f) in (ElementKind.E4M3, ElementKind.E5M2) and f.scale.name == "e8m0" and f.block_size == 32
            and f.block_rows == 1):
        return f"serves E4M3 / E5M2 weights with E8M0 block scales of 32, not {f.name}"
    if len(q.shape) != 2 or tuple(q.padded_shape) != tuple(q.shape) or \
            tuple(q.scales.shape) != (q.shape[0], q.shape[1] // 32):
        return "needs an unpadded 2-D weight with row-major scales"
    if has_specials(q):
        return "needs 8-bit float codes without Inf / NaN (scanned once; unscanned during a CUDA graph capture)"
    return None


def gluon_weight_reason(q: QTensor) -> str | None:
    """:func:`_gluon_weight_reason`, once per weight version (kept in its state)."""
    return state(q).fact(q, "gluon_reason", lambda: _gluon_weight_reason(q))


def _gluon_weight_reason(q: QTensor) -> str | None:
    """Why :func:`prefill_ws` has no decode for weight ``q``, or None: E2M1 codes
    (:func:`e2m1_weight_reason`), 4/8-bit integers (:func:`int_weight_reason`) or E4M3 / E5M2
    codes with E8M0 scales (:func:`e4m3_weight_reason`)."""
    whys = [r(q) for r in (_e2m1_weight_reason, int_weight_reason, e4m3_weight_reason)]
    if None in whys:
        return None
    if all(w.startswith("serves") for w in whys):
        return ("serves E2M1 weights with UE4M3 (16) or E8M0 (32) block scales, 4/8-bit integers with fp16 block "
                f"scales (a multiple of 16), E4M3 / E5M2 and 4/8-bit integers with E8M0 scales of 32, not {q.fmt.name}")
    return next(w for w in whys if not w.startswith("serves"))  # the format is served: why not this weight


def f16_weight_reason(q: QTensor) -> str | None:
    """:func:`_f16_weight_reason`, once per weight version (kept in its state)."""
    return state(q).fact(q, "f16_reason", lambda: _f16_weight_reason(q))


def _f16_weight_reason(q: QTensor) -> str | None:
    """Why the Gluon kernels' f16 decode (fp16 activations) cannot take weight ``q`` exactly, or
    None: E8M0 scales within the element kind's window of :data:`E8M0_F16_WINDOW` (NaN none), fp16
    block scales small enough that ``(code - z) * s`` stays finite in f16 (both scanned once;
    unscanned during a CUDA graph capture: refused)."""
    f = q.fmt
    if f.scale.name == "e8m0":
        rng = e8m0_range(q)
        lo, hi, _ = E8M0_F16_WINDOW[(gluon_elem_kind(q), f.element.bits)]
        if rng is None or rng[1] - rng[0] > hi - lo:
            return (f"with float16 activations needs E8M0 scales within {hi - lo + 1} binades and none NaN "
                    "(scanned once; unscanned during a CUDA graph capture)")
    elif f.scale.name == "fp16":
        smax = f16_scale_max(q)
        if smax is None or not smax * (1 << f.element.bits) <= 65504:
            return (f"with float16 activations needs fp16 scales of at most {65504 / (1 << f.element.bits):g} in "
                    "magnitude (scanned once; unscanned during a CUDA graph capture)")
    return None


#: ``(least, largest, B)`` per Gluon element kind and code width for the f16 decode (fp16 activations):
#: the f16 exponent fields ``e + ke`` of the E8M0 scales for which every code times the scale is an exact,
#: finite f16 (E2M1 decoded as ``v * 2^-14``: least product 2^-24; E4M3 / E5M2 / integers exact, ``B = 0``:
#: E4M3 448 * 2^7, E5M2 57344 * 2^0 and 2^-16 * 2^-8, MXINT4 -8 * 2^12, MXINT8 -128 * 2^8)
E8M0_F16_WINDOW = {(0, 4): (6, 30, 14), (0, 8): (1, 22, 0), (2, 8): (7, 15, 0), (1, 4): (1, 27, 0), (1, 8): (1, 23, 0)}


def gluon_elem_kind(q: QTensor) -> int:
    """The Gluon kernels' ``EI`` for ``q``: the element kind under E8M0 scales where the code
    width leaves it open (1 two's-complement integers: MXINT4 / MXINT8; 2 E5M2; else 0)."""
    if q.fmt.scale.name != "e8m0":
        return 0
    return 1 if q.fmt.element.kind == "int" else 2 if gemv_kind(q.fmt) == ElementKind.E5M2 else 0


def fp4_codes(q: QTensor) -> bool:
    """Whether ``q`` holds 4-bit float codes (E2M1: NVFP4, MXFP4), which the routing rules
    treat apart from the integer and 8-bit formats."""
    return q.fmt.element.kind == "float" and q.fmt.element.bits == 4
