"""Element and scale kinds: the few families the GPU decoders tell apart, derived from a
:class:`~microscale.formats.Format`'s fields (pure data, no GPU code).

The integer values are the ones the kernels take as constexprs (``KIND`` / ``SCALE_KIND``);
a kernel branches on a kind, never on a format's name.
"""
from __future__ import annotations

import enum
import functools

from .format import Format

__all__ = ["ScaleKind", "ElementKind", "scale_kind", "element_kind"]


class ScaleKind(enum.IntEnum):
    """How a block scale is stored (:class:`~microscale.formats.ScaleCodec`)."""

    E8M0 = 1  #: a power of two ``2^(B - 127)``, one byte, 0xFF NaN (OCP MX)
    UE4M3 = 2  #: a positive E4M3fn byte (NVFP4)
    FP16 = 3  #: IEEE half, subnormals kept
    BF16 = 4  #: bfloat16
    FP32 = 5  #: IEEE single


_SCALE_BY_NAME = {"e8m0": ScaleKind.E8M0, "ue4m3": ScaleKind.UE4M3, "fp16": ScaleKind.FP16,
                  "bf16": ScaleKind.BF16, "fp32": ScaleKind.FP32}


class ElementKind(enum.IntEnum):
    """The element families with a word-wide decode (4 or 8 bits, no table)."""

    E2M1 = 0  #: 4-bit float without NaN / Inf (NVFP4, MXFP4)
    E4M3 = 1  #: 8-bit E4M3fn: bias 7, NaN 0x7F, no Inf
    E5M2 = 2  #: 8-bit E5M2: bias 15, IEEE NaN / Inf
    INT8 = 3  #: two's-complement 8-bit integer
    INT4 = 4  #: two's-complement 4-bit integer
    UINT8_ZP = 5  #: unsigned 8-bit integer with a zero point (affine)
    UINT4_ZP = 6  #: unsigned 4-bit integer with a zero point (affine)


def scale_kind(fmt: Format) -> ScaleKind:
    """The kind of ``fmt``'s block scales."""
    try:
        return _SCALE_BY_NAME[fmt.scale.name]
    except KeyError:
        raise ValueError(f"scale_kind: format {fmt.name} has scale codec {fmt.scale.name!r}; expected one of "
                         f"{sorted(_SCALE_BY_NAME)}") from None


@functools.lru_cache(maxsize=256)
def element_kind(fmt: Format) -> ElementKind | None:
    """The kind of ``fmt``'s elements, or None when no word-wide decode covers them (other
    widths, fractional integers, NaN / Inf encodings of other layouts)."""
    el = fmt.element
    if el.kind == "int" and el.bits in (4, 8):
        if fmt.zero_point and not el.signed and el.frac_bits == 0:  # affine: (code - z) * s
            return ElementKind.UINT8_ZP if el.bits == 8 else ElementKind.UINT4_ZP
        if el.signed and not fmt.zero_point:
            return ElementKind.INT8 if el.bits == 8 else ElementKind.INT4
        return None
    if fmt.zero_point or el.kind != "float":
        return None
    if el.bits == 4 and not el.has_nan and not el.has_inf:
        return ElementKind.E2M1
    if el.bits == 8 and (el.ebits, el.mbits, el.bias) == (4, 3, 7) and list(el.nan_codes) == [0x7F] \
            and not el.has_inf:
        return ElementKind.E4M3
    if el.bits == 8 and (el.ebits, el.mbits, el.bias) == (5, 2, 15) and el.has_inf:
        return ElementKind.E5M2
    return None
