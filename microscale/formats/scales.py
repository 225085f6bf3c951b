"""Scale codecs (how a block scale is stored) and scale rules (how it is chosen).

Power-of-two rules work on the float32 bit fields of the block amax — never on
``log2`` of a float (float32 ``log2`` returns k for values one ulp below 2^k).
Notation: ``E(a)`` is the biased exponent field of float32 ``a``, ``M(a)`` its
mantissa field, ``emax = floor(log2(element max))``, ``B`` the stored E8M0 byte.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property

import torch

from .elements import ELEMENTS, ElementCodec, Overflow, Rounding, _on_device, div_exact

__all__ = ["ScaleCodec", "ScaleRule", "SCALES", "get_scale_codec", "e8m0_from_amax", "TwoLevel"]


class ScaleRule(str, enum.Enum):
    """How a block's scale is derived from its absolute maximum ``a``."""

    #: OCP MX v1.0 Alg. 1: ``B = clamp(E(a) - emax, 0, 254)``. Largest element may saturate.
    FLOOR = "floor"
    #: ``B = E(a) + [M(a) != 0] - emax``: the scaled amax never exceeds 2^emax.
    CEIL = "ceil"
    #: Round amax to ``m_elem + 1`` significant bits first:
    #: ``a' = (bits(a) + 2^(22 - m_elem)) & 0xFF800000; B = E(a') - emax``
    #: (vLLM and compressed-tensors MXFP4 / MXFP8).
    EVEN = "even"
    #: Round ``d = fl(a / max_elem)`` up to a power of two: ``B = E(d) + [M(d) != 0]``,
    #: ``B = [M(d) > 0x400000]`` for subnormal d (PTX ``cvt.rp.satfinite.ue8m0x2.f32``;
    #: torchao inference, triton_kernels ROUND_UP, cuDNN).
    RCEIL = "rceil"
    #: ``s = fl(a / max_elem)`` stored through a float scale codec with round-to-nearest-even.
    AMAX = "amax"
    #: Affine: ``s = (max(x_max, 0) - min(x_min, 0)) / q_max``, zero point ``round(-min/s)``.
    MINMAX = "minmax"

    @property
    def power_of_two(self) -> bool:
        return self in (ScaleRule.FLOOR, ScaleRule.CEIL, ScaleRule.EVEN, ScaleRule.RCEIL)


class TwoLevel(str, enum.Enum):
    """NVFP4 two-level scaling conventions (FORMATS.md, 'NVFP4 two-level').

    Decode is always ``x = e2m1 * e4m3 * s_dec``; they differ in how the block
    scale and elements are computed (op order, clamping, zero handling).
    """

    #: NVIDIA ModelOpt: ``s2 = amax/2688``; ``sb = e4m3(amax_b / (6*s2))`` (exact 0 -> 1);
    #: element ``x / (f(sb) * s2)``. The default.
    MODELOPT = "modelopt"
    #: torchao: ``sb = e4m3(clamp((amax_b/6)/s2, 2^-6, 448))``; element ``x * ((1/s2)/f(sb))``.
    TORCHAO = "torchao"
    #: compressed-tensors: stores ``gs = 2688/max(amax, tiny)`` (NaN/Inf -> 1);
    #: ``sb = e4m3(min(gs*(amax_b/6), 448))``, zero -> 0.125; element ``x / (f(sb)/gs)``.
    COMPRESSED_TENSORS = "compressed-tensors"


@dataclass(frozen=True)
class ScaleCodec:
    """How one scale is stored: ``e8m0`` (a power-of-two byte), ``ue4m3`` (a positive
    E4M3fn), or a plain float (``fp32``, ``fp16`` with subnormals, ``bf16``)."""

    name: str
    bits: int
    storage: torch.dtype
    description: str = ""

    @property
    def power_of_two(self) -> bool:
        return self.name == "e8m0"

    @cached_property
    def max(self) -> float:
        if self.name == "e8m0":
            return 2.0**127
        if self.name == "ue4m3":
            return 448.0
        return float(torch.finfo(self.storage).max)

    @cached_property
    def _e8m0_lut(self) -> torch.Tensor:
        b = torch.arange(256, dtype=torch.int32)
        v = (b << 23).view(torch.float32).clone()
        v[0] = 2.0**-127  # float32 subnormal
        v[255] = float("nan")
        return v

    def decode(self, raw: torch.Tensor) -> torch.Tensor:
        """Stored scales -> float32 values (E8M0 0xFF -> NaN, 0x00 -> 2^-127)."""
        if self.name == "e8m0":
            return _on_device(self._e8m0_lut, raw.device)[raw.to(torch.int64)]
        return raw.to(torch.float32)

    def encode(self, s: torch.Tensor, overflow: Overflow | str = Overflow.SATURATE) -> torch.Tensor:
        """float32 scale values -> storage, round-to-nearest-even.

        E8M0 rounds to the nearest power of two by the float bits (ties up, as
        ml_dtypes); power-of-two scale *rules* compute the byte directly instead
        (:func:`e8m0_from_amax`). ``overflow='saturate'`` clamps to the largest
        finite scale.
        """
        s = s.to(torch.float32)
        if self.name == "e8m0":
            bits = s.view(torch.int32)
            e = (bits >> 23) & 0xFF
            m = bits & 0x7FFFFF
            # nearest power of two by the bits, ties up (ml_dtypes >= 0.7); a subnormal d lies
            # between 2^-127 (code 0, mantissa 0x400000) and 2^-126 (code 1): midpoint 0x600000
            b = torch.where(e == 0, (m >= 0x600000).to(torch.int32), e + (m >= 0x400000).to(torch.int32))
            b = torch.clamp(b, 0, 254)
            bad = ~torch.isfinite(s) | (s <= 0)
            return torch.where(bad, torch.full_like(b, 255), b).to(torch.uint8)
        if self.name == "ue4m3":
            codes = ELEMENTS["e4m3"].encode(s, Rounding.NEAREST_EVEN, overflow)
            return codes.view(torch.float8_e4m3fn)
        if Overflow(overflow) is Overflow.SATURATE:
            s = s.clamp(-self.max, self.max)
        return s.to(self.storage)


SCALES: dict[str, ScaleCodec] = {
    c.name: c
    for c in [
        ScaleCodec("e8m0", 8, torch.uint8, "power of two 2^(B-127), B=0..254; 0xFF is NaN"),
        ScaleCodec("ue4m3", 8, torch.float8_e4m3fn, "E4M3fn used for positive scales (NVFP4)"),
        ScaleCodec("fp32", 32, torch.float32, "IEEE float32"),
        ScaleCodec("fp16", 16, torch.float16, "IEEE float16, subnormals kept"),
        ScaleCodec("bf16", 16, torch.bfloat16, "bfloat16"),
    ]
}


def get_scale_codec(name: str | ScaleCodec) -> ScaleCodec:
    """Look up a scale codec by name."""
    if isinstance(name, ScaleCodec):
        return name
    if name not in SCALES:
        raise KeyError(f"unknown scale codec {name!r}; known: {', '.join(SCALES)}")
    return SCALES[name]


def e8m0_from_amax(amax: torch.Tensor, rule: ScaleRule, element: ElementCodec) -> torch.Tensor:
    """E8M0 byte (uint8) for each block amax (float32, >= 0) under a power-of-two rule.

    NaN or Inf amax gives 0xFF (NaN scale). Formulas: :class:`ScaleRule`.
    """
    rule = ScaleRule(rule)
    a = amax.to(torch.float32)
    emax = element.emax
    if rule is ScaleRule.RCEIL:
        d = div_exact(a, element.max)  # float32 division, as torchao and triton_kernels
        db = d.view(torch.int32)
        e, m = (db >> 23) & 0xFF, db & 0x7FFFFF
        b = torch.where(e == 0, (m > 0x400000).to(torch.int32), e + (m != 0).to(torch.int32))
        b = b.clamp(0, 254)
    else:
        bits = a.view(torch.int32)
        if rule is ScaleRule.EVEN:
            m_elem = element.mbits if element.kind == "float" else element.frac_bits
            bits = (bits + (1 << (22 - m_elem))) & -(1 << 23)  # & 0xFF800000
        e, m = (bits >> 23) & 0xFF, bits & 0x7FFFFF
        if rule is ScaleRule.FLOOR or rule is ScaleRule.EVEN:
            b = e - emax
        elif rule is ScaleRule.CEIL:
            b = e + (m != 0).to(torch.int32) - emax
        else:
            raise ValueError(f"scale_rule={rule.value!r} is not a power-of-two rule")
        b = b.clamp(0, 254)
    b = torch.where(torch.isfinite(a), b, torch.full_like(b, 255))
    return b.to(torch.uint8)
