"""The :class:`Format` record and the registry of named presets.

A format is a row of data: code reads its fields, never its name. Adding a preset
touches :data:`registry` and nothing else.
"""
from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field

from .elements import ElementCodec, get_element
from .scales import ScaleCodec, ScaleRule, TwoLevel, get_scale_codec

__all__ = ["Format", "registry", "get_format", "register", "check_int"]


@dataclass(frozen=True)
class Format:
    """A block-scaled format.

    Attributes:
        name: preset name (informational; never used for dispatch).
        element: element codec.
        block_size: elements per block along the last dimension.
        scale: scale codec (how a block scale is stored).
        scale_rule: default rule that derives the block scale from the block.
        block_rows: rows per block (1; 128 for 128x128 weight blocks).
        global_scale: True for a second, per-tensor FP32 level (NVFP4).
        two_level: default convention for the two-level scale (``global_scale`` only).
        zero_point: True for affine formats (unsigned codes, per-block zero point).
    """

    name: str
    element: ElementCodec
    block_size: int
    scale: ScaleCodec
    scale_rule: ScaleRule
    block_rows: int = 1
    global_scale: bool = False
    two_level: TwoLevel = TwoLevel.MODELOPT
    zero_point: bool = False
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = f"format {self.name!r}"
        if not isinstance(self.name, str):
            raise TypeError(f"format name must be a str, got {self.name!r} ({type(self.name).__name__})")
        for f, cls in (("element", ElementCodec), ("scale", ScaleCodec), ("scale_rule", ScaleRule),
                       ("two_level", TwoLevel)):
            if not isinstance(getattr(self, f), cls):
                raise TypeError(f"{where}: {f} must be a {cls.__name__}, got {getattr(self, f)!r}")
        for f in ("global_scale", "zero_point"):
            if not isinstance(getattr(self, f), bool):
                raise TypeError(f"{where}: {f} must be a bool, got {getattr(self, f)!r}")
        for f in ("block_size", "block_rows"):
            object.__setattr__(self, f, check_int(getattr(self, f), f, where))
        if (self.block_size * self.element.bits) % 8:
            raise ValueError(f"format {self.name!r}: a block of {self.block_size} {self.element.bits}-bit "
                             "codes is not a whole number of bytes")
        if self.scale_rule.power_of_two != self.scale.power_of_two:
            raise ValueError(f"format {self.name!r}: scale rule {self.scale_rule.value!r} does not fit "
                             f"scale codec {self.scale.name!r}")
        if self.zero_point != (self.scale_rule is ScaleRule.MINMAX) or self.zero_point == self.element.signed:
            raise ValueError(f"format {self.name!r}: affine formats need rule 'minmax' and unsigned elements")

    @property
    def bits_per_element(self) -> float:
        """Storage bits per element including block scales and zero points
        (the per-tensor global scale is negligible and not counted)."""
        per_block = self.scale.bits + (8 if self.zero_point else 0)  # zero points stored as bytes
        return self.element.bits + per_block / (self.block_size * self.block_rows)

    def replace(self, **changes) -> "Format":
        """A copy with fields changed (e.g. ``fmt.replace(block_size=128)``), validated."""
        if "scale_rule" in changes:
            changes["scale_rule"] = ScaleRule(changes["scale_rule"])
        if "two_level" in changes:
            changes["two_level"] = TwoLevel(changes["two_level"])
        if "element" in changes:
            changes["element"] = get_element(changes["element"])
        if "scale" in changes:
            changes["scale"] = get_scale_codec(changes["scale"])
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """JSON-able description (element and scale by name)."""
        return {
            "name": self.name, "element": self.element.name, "block_size": self.block_size,
            "scale": self.scale.name, "scale_rule": self.scale_rule.value, "block_rows": self.block_rows,
            "global_scale": self.global_scale, "two_level": self.two_level.value, "zero_point": self.zero_point,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Format":
        """Inverse of :meth:`to_dict`. Every field is checked, none coerced: a value of the
        wrong JSON type or an unknown name raises ``ValueError`` naming the field."""
        if not isinstance(d, dict):
            raise ValueError(f"format must be a JSON object, got {d!r}")
        optional = {"block_rows": 1, "global_scale": False, "two_level": "modelopt", "zero_point": False}
        types = {"name": str, "element": str, "block_size": int, "scale": str, "scale_rule": str,
                 "block_rows": int, "global_scale": bool, "two_level": str, "zero_point": bool}
        unknown = sorted(set(d) - set(types))
        if unknown:
            raise ValueError(f"format: unknown field(s) {', '.join(map(repr, unknown))}")
        v = {}
        for k, t in types.items():
            if k not in d and k not in optional:
                raise ValueError(f"format: field {k!r} is missing")
            x = d.get(k, optional.get(k))
            if not isinstance(x, t) or (t is int and isinstance(x, bool)):
                raise ValueError(f"format.{k}={x!r} must be a JSON {'integer' if t is int else t.__name__}")
            v[k] = x
        try:
            element, scale = get_element(v["element"]), get_scale_codec(v["scale"])
        except KeyError as e:
            raise ValueError(f"format: {e.args[0]}") from None
        rule = _enum_field(ScaleRule, v["scale_rule"], "scale_rule")
        two = _enum_field(TwoLevel, v["two_level"], "two_level")
        try:
            return cls(name=v["name"], element=element, block_size=v["block_size"], scale=scale, scale_rule=rule,
                       block_rows=v["block_rows"], global_scale=v["global_scale"], two_level=two,
                       zero_point=v["zero_point"])
        except TypeError as e:
            raise ValueError(str(e)) from None


def _enum_field(cls, value: str, what: str):
    try:
        return cls(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"format.{what}={value!r} is not valid; expected one of {choices}") from None


def check_int(value: object, what: str, where: str = "", minimum: int = 1) -> int:
    """``value`` as an ``int`` >= ``minimum``: ``TypeError`` for a non-integer (a float such
    as 2.9 or 32.0, a bool, a string), ``ValueError`` when below ``minimum``."""
    pre = f"{where}: " if where else ""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{pre}{what} must be an int, got {value!r} ({type(value).__name__})")
    n = operator.index(value)
    if n < minimum:
        raise ValueError(f"{pre}{what} must be >= {minimum}, got {n}")
    return n


registry: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Add a preset to the registry (name must be new)."""
    if fmt.name in registry:
        raise ValueError(f"format {fmt.name!r} is already registered")
    registry[fmt.name] = fmt
    return fmt


def get_format(fmt: str | Format) -> Format:
    """Resolve a preset name (case-insensitive) or pass a :class:`Format` through."""
    if isinstance(fmt, Format):
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"format must be a name or a Format, got {type(fmt).__name__}")
    key = fmt.lower()
    if key not in registry:
        raise KeyError(f"unknown format {fmt!r}; known formats: {', '.join(registry)}")
    return registry[key]


def _f(name, element, block, scale, rule, desc, **kw) -> None:
    register(Format(name, get_element(element), block, get_scale_codec(scale), ScaleRule(rule),
                    description=desc, **kw))


# ---- presets ------------------------------------------------------------------------
_f("nvfp4", "e2m1", 16, "ue4m3", "amax", "NVIDIA NVFP4: E2M1, 16-block UE4M3 scale, FP32 tensor scale",
   global_scale=True)
_f("mxfp4", "e2m1", 32, "e8m0", "floor", "OCP MXFP4")
_f("mxfp6_e2m3", "e2m3", 32, "e8m0", "floor", "OCP MXFP6 E2M3")
_f("mxfp6_e3m2", "e3m2", 32, "e8m0", "floor", "OCP MXFP6 E3M2")
_f("mxfp8_e4m3", "e4m3", 32, "e8m0", "floor", "OCP MXFP8 E4M3")
_f("mxfp8_e5m2", "e5m2", 32, "e8m0", "floor", "OCP MXFP8 E5M2")
_f("mxint8", "mxint8", 32, "e8m0", "floor", "OCP MXINT8")
for _b in range(2, 7):
    _f(f"mxint{_b}", f"mxint{_b}", 32, "e8m0", "floor", f"MX-style {_b}-bit integer, E8M0 block-32 scale")
_f("nvfp8", "e4m3", 16, "fp32", "amax", "FP8 E4M3 with an FP32 scale per 16")
for _sc in ("fp32", "fp16"):
    _f(f"fp4_{_sc}", "e2m1", 32, _sc, "amax", f"FP4 E2M1, {_sc.upper()} scale per 32")
    _f(f"fp8_e4m3_{_sc}", "e4m3", 32, _sc, "amax", f"FP8 E4M3, {_sc.upper()} scale per 32")
    _f(f"fp8_e5m2_{_sc}", "e5m2", 32, _sc, "amax", f"FP8 E5M2, {_sc.upper()} scale per 32")
    for _b in (2, 3, 4, 5, 6, 8):
        _f(f"int{_b}_{_sc}", f"int{_b}", 32, _sc, "amax", f"symmetric int{_b}, {_sc.upper()} scale per 32")
for _b in (4, 8):
    for _g in (32, 64, 128):
        _f(f"int{_b}_affine_g{_g}", f"uint{_b}", _g, "fp16", "minmax",
           f"affine uint{_b}: FP16 scale + uint{_b} zero point per {_g}", zero_point=True)
_f("fp8_e4m3_block128", "e4m3", 128, "fp32", "amax", "DeepSeek-V3 activations: E4M3, FP32 scale per 1x128")
_f("fp8_e4m3_block128x128", "e4m3", 128, "fp32", "amax", "DeepSeek-V3 weights: E4M3, FP32 scale per 128x128",
   block_rows=128)
