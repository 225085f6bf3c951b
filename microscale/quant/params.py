"""Format fields -> the quant kernels' constexprs, and the host facts they depend on
(private). Nothing here imports Triton.

Format fields become kernel constexprs here (no per-format code): element codec fields
(:func:`element_params`), scale kind, scale rule, two-level convention, scale layout, and
the paths a format may take (hardware FP8 conversion, the packed bf16 path, int32 code
words).
"""
from __future__ import annotations

import functools
import struct
from types import MappingProxyType

import torch

from ..formats import ElementCodec, Format, NonFinite, Overflow, Rounding, ScaleLayout, ScaleRule, TwoLevel
from ..formats.elements import _enum
from ..formats.kinds import scale_kind
from ..runtime import target
from . import tuning

__all__ = ["unsupported_reason"]


def _empty(shape, dtype, device) -> torch.Tensor:
    """Allocation of every kernel output (tests replace it to poison outputs)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _f32_bits(v: float) -> int:
    return struct.unpack("<i", struct.pack("<f", v))[0]


def _host_default_nan() -> int:
    """Bits (as int32) of the NaN the host CPU's float32 vector division 0/0 returns:
    the reference runs there, and the sign of such a NaN decides an element code."""
    z = torch.zeros(64, dtype=torch.float32)
    return int((z / z).view(torch.int32)[0])


def _host_mul_nan_second() -> bool:
    """Whether the host's ``x * m`` (m broadcast over a block) keeps m's NaN when both
    are NaN (the compiler may commute the multiply; seen: it does on x86)."""
    a = torch.full((4, 16), -float("nan"))
    b = torch.full((4, 1), float("nan"))
    return bool(((a * b).view(torch.int32) >= 0).all())


_DEFAULT_NAN = _host_default_nan()
_MUL_NAN_SECOND = _host_mul_nan_second()
# Triton's interpreter (the CPU test suite): fixed at import, as triton.jit fixes it when the kernels are imported
_INTERPRET = target.interpreting()
# The interpreter's float32 -> bf16 cast does not round to nearest even: round on the bits.
_MANUAL_BF16 = _INTERPRET
# Markstein division on the fast path needs a single-rounding fma (the interpreter rounds twice)
_MARKSTEIN = not _INTERPRET
# PTX inline assembly (the interpreter cannot run it) where it pins an instruction choice
_ASM = not _INTERPRET


def _pdl_ok(dev: torch.device) -> bool:
    """Whether the quantize / dequantize kernels launch as programmatic dependents on ``dev``."""
    if not tuning.current().pdl or _INTERPRET:
        return False
    from ..runtime.target import pdl_capable

    return pdl_capable(dev)


# scale rules, two-level conventions and non-finite policies as the kernels' constexprs
_RULES = {ScaleRule.FLOOR: 0, ScaleRule.CEIL: 1, ScaleRule.EVEN: 2, ScaleRule.RCEIL: 3, ScaleRule.AMAX: 4,
          ScaleRule.MINMAX: 5}
_TWO_LEVEL = {TwoLevel.MODELOPT: 1, TwoLevel.TORCHAO: 2, TwoLevel.COMPRESSED_TENSORS: 3}
_NONFIN = {NonFinite.PROPAGATE: 0, NonFinite.ZERO: 1, NonFinite.ERROR: 2}


@functools.lru_cache(maxsize=256)
def _element_params(e: ElementCodec, overflow: Overflow) -> MappingProxyType:
    if e.kind == "float":
        nan = sorted(e.nan_codes)
        top = (1 << (e.bits - 1)) - 1
        if nan and nan != list(range(nan[0], top + 1)):
            raise NotImplementedError(f"{e.name}: NaN codes must be the top magnitude codes for the kernels")
    if overflow is Overflow.NATIVE and e.kind == "float":
        ovf = e.inf_code if e.has_inf else (e.nan_codes[0] if e.has_nan else e.max_code)
    else:
        ovf = e.max_code
    sub_c = 2.0 ** (e.emin - e.mbits + 23)
    return MappingProxyType(dict(  # cached: read-only
        BITS=e.bits, IS_INT=e.kind == "int", SIGNED=e.signed, MBITS=e.mbits, BIAS=e.bias, MAX_CODE=e.max_code,
        NAN_CODE=e.nan_codes[0] if e.has_nan else -1, OVF_CODE=ovf, MIN_NORMAL=float(e.min_normal),
        SUB_C=sub_c, SUB_C_BITS=_f32_bits(sub_c), INV_MIN_SUB=float(1.0 / e.min_subnormal),
        ELEM_MAX=float(e.max), EMAX=e.emax, M_ELEM=e.mbits if e.kind == "float" else e.frac_bits,
    ))


def _scale_kind(fmt: Format) -> int:
    """The kernels' ``SCALE_KIND``: the format's :class:`~microscale.formats.kinds.ScaleKind`."""
    return int(scale_kind(fmt))


@functools.lru_cache(maxsize=256)
def _scale_nan_bits(fmt: Format) -> int:
    """Bits (signed int of the storage width) of the host's NaN cast to the scale dtype."""
    st = fmt.scale.storage
    if not st.is_floating_point or st.itemsize == 1:
        return 0
    ity = torch.int16 if st.itemsize == 2 else torch.int32
    return int(torch.tensor(float("nan"), dtype=torch.float32).to(st).view(ity))


def _layout_code(layout: ScaleLayout) -> int:
    """The kernels' ``LAYOUT``: 0 row-major, 1 swizzled 128x4, 2 swizzled 8x4."""
    if not layout.tile_rows:
        return 0
    if layout.tile_cols == 4 and layout.tile_rows == 128 and layout.sub_rows == 32:
        return 1
    if layout.tile_cols == 4 and layout.tile_rows == 8 and not layout.sub_rows:
        return 2
    raise NotImplementedError(f"scale layout {layout.name!r} has no kernel support")


def _hw_fp8(e: ElementCodec, rounding: Rounding, overflow: Overflow) -> int:
    """1 / 2 when the GPU's ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` computes this codec's
    encode exactly (RNE, saturate; NaN-free tiles): E4M3fn / E5M2 by their fields."""
    if _INTERPRET or rounding is not Rounding.NEAREST_EVEN or overflow is not Overflow.SATURATE:
        return 0
    if e.kind != "float" or e.bits != 8:
        return 0
    if (e.ebits, e.mbits, e.bias, tuple(e.nan_codes), e.inf_code) == (4, 3, 7, (0x7F,), None):
        return 1
    if (e.ebits, e.mbits, e.bias, e.inf_code) == (5, 2, 15, 0x7C):
        return 2
    return 0


def _packed_bf16(x2: torch.Tensor, fmt: Format, rounding: Rounding, overflow: Overflow, nonfinite: NonFinite,
                 prologue: int) -> bool:
    """The quantize kernel's packed path (``PK``): bf16 input read as int32 words of two
    elements, encoded two per 32-bit operation (``_encode_p2_bf16x2``). For 4-bit float
    elements with an E8M0 (power-of-two) scale or the two-level NVFP4 scheme, RNE and
    saturation, NaN propagation, whole blocks of 16 or 32 elements in 4-byte aligned rows;
    everything else keeps the float32 path."""
    e = fmt.element
    scale_ok = (fmt.scale.power_of_two and _RULES[fmt.scale_rule] <= 3) if not fmt.global_scale else \
        fmt.two_level in _TWO_LEVEL
    return (x2.dtype == torch.bfloat16 and prologue == 0 and fmt.block_rows == 1 and scale_ok
            and e.kind == "float" and e.bits == 4 and e.signed and rounding is Rounding.NEAREST_EVEN
            and (overflow is Overflow.SATURATE or _element_params(e, overflow)["OVF_CODE"] == e.max_code)
            and nonfinite is NonFinite.PROPAGATE and fmt.block_size in (16, 32)
            and x2.shape[1] % fmt.block_size == 0 and x2.stride(0) % 2 == 0 and x2.data_ptr() % 4 == 0)


def _pack32(fmt: Format, cfg: tuning.QuantizeConfig) -> bool:
    """Codes go through int32 words when 32 bits hold whole codes and whole blocks."""
    bits = fmt.element.bits
    return 32 % bits == 0 and (fmt.block_size * bits) % 32 == 0 and (cfg.tile_cols * bits) % 32 == 0


def unsupported_reason(fmt: Format, rounding: Rounding | str = Rounding.NEAREST_EVEN) -> str | None:
    """Why the kernels can't run this format/rounding (the caller falls back to the
    reference), or ``None``."""
    rounding = _enum(Rounding, rounding, "rounding")
    if rounding is Rounding.STOCHASTIC:
        return "stochastic rounding follows the CPU generator's draws (reference only)"
    if not tuning._pow2(fmt.block_size) or not tuning._pow2(fmt.block_rows):
        return f"block {fmt.block_rows}x{fmt.block_size} is not a power of two"
    if fmt.element.bits % 8 and 8 % fmt.element.bits and fmt.block_size < 8:
        return "odd-width codes need blocks of at least 8"
    if fmt.global_scale and fmt.scale_rule is ScaleRule.MINMAX:
        return "two-level affine formats are not supported"
    return None
