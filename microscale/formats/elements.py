"""Element codecs: minifloats (E2M1, E2M3, E3M2, E4M3fn, E5M2) and integers.

One generic conversion serves every element type; a type is a row of data
(:class:`ElementCodec`).  Codes are returned one per ``torch.uint8`` (packing
into sub-byte streams lives in :mod:`microscale.formats.packing`).

Rounding and policies are enums, resolved once at the API boundary:

* :class:`Rounding` — ``nearest_even`` (IEEE default, OCP MX, ml_dtypes),
  ``nearest_away`` (microxcaling's default), ``stochastic`` (seeded generator).
* :class:`Overflow` — ``saturate`` (clamp to +-max; OCP MX conversion) or
  ``native`` (the type's own behaviour, as ml_dtypes: NaN for E4M3fn, Inf for
  E5M2, saturation for types with neither).
* :class:`NonFinite` — what NaN / Inf *inputs* become: ``propagate`` (NaN ->
  the type's NaN, or the code ml_dtypes uses for types without NaN, ``0b1000..``;
  Inf -> treated as an overflow under the overflow policy), ``zero`` (both -> +0),
  ``error`` (raise ``ValueError``). Block formats whose scale comes from the block amax:
  a NaN makes the scale NaN, so its whole block decodes to NaN (the OCP MX rule; an Inf
  does the same to an E8M0 scale and saturates a float scale). Affine blocks take their
  range from their finite values: a NaN element encodes as the zero point (decodes to 0)
  and +-Inf as the block's largest / smallest code; the other elements keep their values.
"""
from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass, field
from functools import cached_property

import torch

__all__ = ["Rounding", "Overflow", "NonFinite", "ElementCodec", "ELEMENTS", "get_element", "round_integer",
           "beyond_float32", "to_float32"]


class Rounding(str, enum.Enum):
    """How a value between two representable neighbours is rounded."""

    NEAREST_EVEN = "nearest_even"  #: round to nearest, ties to even code (IEEE 754 default)
    NEAREST_AWAY = "nearest_away"  #: round to nearest, ties away from zero (microxcaling)
    STOCHASTIC = "stochastic"  #: round up with probability equal to the fractional distance


class Overflow(str, enum.Enum):
    """What a finite value beyond the largest magnitude becomes."""

    SATURATE = "saturate"  #: clamp to +-max (OCP MX conversion, the default)
    NATIVE = "native"  #: the type's own: Inf if it has Inf, else NaN if it has NaN, else saturate


class NonFinite(str, enum.Enum):
    """What NaN and Inf inputs become."""

    PROPAGATE = "propagate"  #: NaN -> NaN code (or 0b1000.. without NaN); Inf -> overflow policy
    ZERO = "zero"  #: NaN and Inf -> +0
    ERROR = "error"  #: raise ValueError


def _enum(cls: type[enum.Enum], value: object, what: str) -> enum.Enum:
    try:
        return cls(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"{what}={value!r} is not valid; expected one of {choices}") from None


@dataclass(frozen=True)
class ElementCodec:
    """An element type of ``bits`` <= 8 bits.

    Floats: ``sign | exponent (ebits) | mantissa (mbits)``, value
    ``(-1)^s * 2^(e - bias) * 1.m`` (``0.m * 2^(1 - bias)`` when ``e == 0``).
    Integers: two's complement (``signed``) or unsigned, value ``k * 2^-frac_bits``.
    ``nan_codes``/``inf_code`` describe the specials by magnitude code (sign bit clear).
    """

    name: str
    bits: int
    kind: str  # "float" | "int"
    ebits: int = 0
    mbits: int = 0
    bias: int = 0
    signed: bool = True
    frac_bits: int = 0
    nan_codes: tuple[int, ...] = ()  # magnitude codes that are NaN; the first is the one written
    inf_code: int | None = None  # magnitude code of Inf
    description: str = field(default="", compare=False)

    # ---- derived facts -------------------------------------------------------------
    @property
    def has_nan(self) -> bool:
        return bool(self.nan_codes)

    @property
    def has_inf(self) -> bool:
        return self.inf_code is not None

    @cached_property
    def max_code(self) -> int:
        """Magnitude code of the largest finite value."""
        if self.kind == "int":
            return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1
        specials = set(self.nan_codes) | ({self.inf_code} if self.has_inf else set())
        c = (1 << (self.bits - 1)) - 1
        while c in specials:
            c -= 1
        return c

    @cached_property
    def max(self) -> float:
        """Largest finite value."""
        return float(self._magnitudes()[self.max_code])

    @property
    def min(self) -> float:
        """Smallest finite value (``-max`` for signed types, 0 for unsigned)."""
        return -self.max if self.signed else 0.0

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal (floats)."""
        return 1 - self.bias

    @cached_property
    def emax(self) -> int:
        """floor(log2(max)): the exponent the OCP MX scale rules subtract."""
        return math.frexp(self.max)[1] - 1

    @property
    def min_normal(self) -> float:
        return 2.0**self.emin if self.kind == "float" else 2.0**-self.frac_bits

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.mbits) if self.kind == "float" else 2.0**-self.frac_bits

    # ---- tables ---------------------------------------------------------------------
    def _magnitudes(self) -> list[float]:
        """Values of the magnitude codes 0 .. 2^(bits-1)-1 (floats) or all codes (ints)."""
        if self.kind == "int":
            n = 1 << self.bits
            vals = [k - n if (self.signed and k >= n // 2) else k for k in range(n)]
            return [math.ldexp(v, -self.frac_bits) for v in vals]
        out = []
        for c in range(1 << (self.bits - 1)):
            e, m = c >> self.mbits, c & ((1 << self.mbits) - 1)
            if c in self.nan_codes:
                out.append(math.nan)
            elif c == self.inf_code:
                out.append(math.inf)
            elif e == 0:
                out.append(math.ldexp(m, self.emin - self.mbits))
            else:
                out.append(math.ldexp((1 << self.mbits) + m, e - self.bias - self.mbits))
        return out

    @cached_property
    def _lut_cpu(self) -> torch.Tensor:
        if self.kind == "int":
            vals = self._magnitudes()
        else:
            mags = self._magnitudes()
            vals = mags + [-v for v in mags]
        return torch.tensor(vals, dtype=torch.float32)

    def lut(self, device: torch.device | str | None = None) -> torch.Tensor:
        """float32 value of every code, indexed by code (``2**bits`` entries); one cached
        copy per device."""
        return _on_device(self._lut_cpu, device)

    # ---- conversion -----------------------------------------------------------------
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (any integer dtype, one per element) -> float32 values."""
        if codes.dtype.is_floating_point or codes.dtype == torch.bool:
            raise TypeError(f"{self.name}.decode: codes must be an integer tensor, got {codes.dtype}")
        idx = codes.to(torch.int64) & ((1 << self.bits) - 1)
        return self.lut(codes.device)[idx]

    def encode(
        self,
        x: torch.Tensor,
        rounding: Rounding | str = Rounding.NEAREST_EVEN,
        overflow: Overflow | str = Overflow.SATURATE,
        nonfinite: NonFinite | str = NonFinite.PROPAGATE,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """float tensor -> one ``uint8`` code per element (low ``bits`` bits used).

        The input is converted to float32 first (exact for bf16/fp16/fp32 input;
        float64 input is rounded to float32 once, and a finite float64 beyond float32's
        range becomes +-float32 max: an overflow of every element type, never an Inf
        input). ``generator`` seeds stochastic rounding.
        """
        rounding = _enum(Rounding, rounding, "rounding")
        overflow = _enum(Overflow, overflow, "overflow")
        nonfinite = _enum(NonFinite, nonfinite, "nonfinite")
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{self.name}.encode: x must be a torch.Tensor, got {type(x).__name__}")
        if not x.dtype.is_floating_point:
            raise TypeError(f"{self.name}.encode: x must be a floating tensor, got {x.dtype}")
        x = to_float32(x)
        if nonfinite is NonFinite.ERROR and not bool(torch.isfinite(x).all()):
            raise ValueError(f"{self.name}.encode: input has NaN or Inf (nonfinite='error')")
        if nonfinite is NonFinite.ZERO:
            x = torch.where(torch.isfinite(x), x, torch.zeros((), dtype=x.dtype, device=x.device))
        if self.kind == "int":
            return self._encode_int(x, rounding, generator)
        return self._encode_float(x, rounding, overflow, nonfinite, generator)

    def _encode_int(self, x: torch.Tensor, rounding: Rounding, generator: torch.Generator | None) -> torch.Tensor:
        t = torch.nan_to_num(x, nan=0.0) * (2.0**self.frac_bits)
        hi = float(self.max_code)
        lo = -hi if self.signed else 0.0
        # Clamp before rounding so huge values stay below 2^24 (clamping first is
        # harmless: every value beyond the range saturates either way).
        t = t.clamp(lo - 1.0, hi + 1.0)
        k = round_integer(t, rounding, generator).clamp(lo, hi).to(torch.int32)
        return (k & ((1 << self.bits) - 1)).to(torch.uint8)

    def _encode_float(
        self,
        x: torch.Tensor,
        rounding: Rounding,
        overflow: Overflow,
        nonfinite: NonFinite,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        # Rounding works on the float32 bit pattern (exact, no log2, few passes):
        # normal range: add half a target ulp (minus one plus the kept LSB for ties to
        # even) and shift the mantissa down — a carry moves into the exponent by itself;
        # subnormal range: a + C with C = 2^(emin - mbits + 23) rounds a to a multiple of
        # the smallest subnormal in float32 hardware (RNE), and bits(a + C) - bits(C) is
        # then the code itself (2^mbits is the code of the smallest normal).
        mb, sh = self.mbits, 23 - self.mbits
        xb = x.view(torch.int32)
        b = xb & 0x7FFFFFFF
        a = b.view(torch.float32)
        code = b >> sh  # in-place steps below: this path is the CPU reference's hot loop
        if rounding is Rounding.NEAREST_EVEN:
            code &= 1
            code += (1 << (sh - 1)) - 1
            code += b
        elif rounding is Rounding.NEAREST_AWAY:
            code = b + (1 << (sh - 1))
        else:
            code = b + torch.randint(0, 1 << sh, b.shape, generator=generator, device=b.device, dtype=torch.int32)
        code >>= sh
        code -= (127 - self.bias) << mb
        if rounding is Rounding.NEAREST_EVEN:
            c = 2.0 ** (self.emin - mb + 23)
            k = (a + c).view(torch.int32)
            k -= _f32_bits(c)
        else:
            k = round_integer(a * (1.0 / self.min_subnormal), rounding, generator).to(torch.int32)
        # select the subnormal result where a < min_normal with integer ops (boolean
        # masks are ~25x slower than int32 arithmetic on CPU): m = -1 there, else 0
        m = b - _f32_bits(self.min_normal)
        m >>= 31
        code ^= (code ^ k) & m
        if overflow is Overflow.SATURATE or self._overflow_code(overflow) == self.max_code:
            code.clamp_(max=self.max_code)
        else:
            code.masked_fill_(code > self.max_code, self._overflow_code(overflow))
        sign = xb >> (32 - self.bits)
        sign &= 1 << (self.bits - 1)
        if nonfinite is NonFinite.PROPAGATE and b.numel() and bool(b.max() > 0x7F800000):  # any NaN
            isnan = torch.isnan(x)
            if self.has_nan:
                code.masked_fill_(isnan, self.nan_codes[0])
            else:
                # ml_dtypes' choice for types without NaN: a zero with the NaN's sign
                # bit inverted (+NaN -> 0b1000.., -NaN -> +0).
                code.masked_fill_(isnan, 0)
                sign ^= isnan.to(torch.int32) << (self.bits - 1)
        code |= sign
        return code.to(torch.uint8)

    def _overflow_code(self, overflow: Overflow) -> int:
        if overflow is Overflow.NATIVE:
            if self.has_inf:
                return self.inf_code  # type: ignore[return-value]
            if self.has_nan:
                return self.nan_codes[0]
        return self.max_code


_F32_MAX = torch.finfo(torch.float32).max


def beyond_float32(x: torch.Tensor) -> torch.Tensor:
    """Mask of the finite elements of ``x`` that a float32 cast turns into Inf (float64 input
    only): ``|x| >= 2^128 - 2^103``, float32 max plus half its ulp (below, the cast rounds
    to float32 max)."""
    if x.dtype != torch.float64:
        return torch.zeros((), dtype=torch.bool, device=x.device)
    return torch.isfinite(x) & (x.abs() >= 2.0**128 - 2.0**103)


def to_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` as float32, a finite float64 beyond float32's range saturated to +-float32 max
    (a plain cast would turn it into Inf)."""
    if x.dtype == torch.float64 and x.numel():
        x = torch.where(beyond_float32(x), x.clamp(-_F32_MAX, _F32_MAX), x)
    return x.to(torch.float32)


# (id of the CPU table, device) -> (the CPU table, kept alive so its id stays unique; copy)
_DEVICE_COPIES: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}


def div_exact(t: torch.Tensor, c: float) -> torch.Tensor:
    """``t / c`` correctly rounded on every device. On CUDA, torch turns ``tensor / python float``
    into a multiply by the reciprocal, one ulp off the quotient for many values (about 1 in 6 of
    ``amax / 2688``); a same-device tensor divisor takes the IEEE division, as the CPU does."""
    return t / torch.full((), c, dtype=t.dtype, device=t.device)


def _on_device(t: torch.Tensor, device: torch.device | str | None) -> torch.Tensor:
    """A cached copy of the (CPU) table ``t`` on ``device``."""
    if device is None or torch.device(device).type == "cpu":
        return t
    key = (id(t), str(torch.device(device)))
    hit = _DEVICE_COPIES.get(key)
    if hit is None:
        hit = _DEVICE_COPIES[key] = (t, t.to(device))
    return hit[1]


@functools.lru_cache(maxsize=None)
def _f32_bits(v: float) -> int:
    """The int32 bit pattern of float32(v)."""
    return int(torch.tensor(v, dtype=torch.float32).view(torch.int32))


def round_integer(t: torch.Tensor, rounding: Rounding | str = Rounding.NEAREST_EVEN,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Round float32 ``t`` (``|t| < 2^24``) to an integer-valued float32 tensor."""
    rounding = _enum(Rounding, rounding, "rounding")
    if rounding is Rounding.NEAREST_EVEN:
        return torch.round(t)  # half to even, exact for float32
    a = t.abs()
    fl = torch.floor(a)
    frac = a - fl  # exact
    if rounding is Rounding.NEAREST_AWAY:
        up = frac >= 0.5
    else:
        up = frac > torch.rand(a.shape, generator=generator, device=a.device)
    return torch.copysign(fl + up.to(a.dtype), t)


def _fp(name: str, e: int, m: int, bias: int, nan=(), inf=None, desc="") -> ElementCodec:
    return ElementCodec(name, 1 + e + m, "float", e, m, bias, True, 0, tuple(nan), inf, desc)


def _int(name: str, bits: int, signed=True, frac=0, desc="") -> ElementCodec:
    return ElementCodec(name, bits, "int", 0, 0, 0, signed, frac, (), None, desc)


#: Every built-in element type by name.
ELEMENTS: dict[str, ElementCodec] = {
    c.name: c
    for c in [
        _fp("e2m1", 2, 1, 1, desc="FP4 (OCP MX / NVFP4), max 6, no specials"),
        _fp("e2m3", 2, 3, 1, desc="FP6 E2M3 (OCP MX), max 7.5, no specials"),
        _fp("e3m2", 3, 2, 3, desc="FP6 E3M2 (OCP MX), max 28, no specials"),
        _fp("e4m3", 4, 3, 7, nan=(0x7F,), desc="FP8 E4M3fn, max 448, NaN S.1111.111, no Inf"),
        _fp("e5m2", 5, 2, 15, nan=(0x7E, 0x7D, 0x7F), inf=0x7C, desc="FP8 E5M2 (IEEE-like), max 57344"),
        *[_int(f"int{b}", b, desc=f"symmetric signed {b}-bit integer, most negative code unused")
          for b in range(2, 9)],
        *[_int(f"uint{b}", b, signed=False, desc=f"unsigned {b}-bit integer (affine formats)")
          for b in (2, 3, 4, 5, 6, 8)],
        _int("mxint8", 8, frac=6, desc="OCP MXINT8: k*2^-6, k in [-127, 127]"),
        *[_int(f"mxint{b}", b, frac=b - 2, desc=f"MX-style {b}-bit integer: k*2^-{b - 2}, max < 2")
          for b in range(2, 7)],
    ]
}


def get_element(name: str | ElementCodec) -> ElementCodec:
    """Look up an element codec by name (``"e2m1"``, ``"e4m3"``, ``"int4"``, ...)."""
    if isinstance(name, ElementCodec):
        return name
    key = str(name).lower().replace("fn", "") if str(name).lower() not in ELEMENTS else str(name).lower()
    if key not in ELEMENTS:
        raise KeyError(f"unknown element type {name!r}; known: {', '.join(ELEMENTS)}")
    return ELEMENTS[key]
