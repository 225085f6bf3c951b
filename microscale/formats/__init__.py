"""Layer 1: pure data and exact arithmetic — element codecs, scale codecs and rules,
packing and scale layouts, the :class:`Format` record and the preset registry.
No GPU code lives here."""
from .elements import ELEMENTS, ElementCodec, NonFinite, Overflow, Rounding, get_element, round_integer
from .format import Format, get_format, register, registry
from .layouts import SCALE_LAYOUTS, ScaleLayout, get_scale_layout, pack_codes, packed_len, unpack_codes
from .scales import SCALES, ScaleCodec, ScaleRule, TwoLevel, e8m0_from_amax, get_scale_codec

__all__ = [
    "ELEMENTS", "ElementCodec", "NonFinite", "Overflow", "Rounding", "get_element", "round_integer",
    "Format", "get_format", "register", "registry",
    "SCALE_LAYOUTS", "ScaleLayout", "get_scale_layout", "pack_codes", "packed_len", "unpack_codes",
    "SCALES", "ScaleCodec", "ScaleRule", "TwoLevel", "e8m0_from_amax", "get_scale_codec",
]
