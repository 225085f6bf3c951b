"""The preset registry: one parametrized test over every format."""
import pytest

import microscale as ms
from microscale.formats import Format, registry

REQUIRED = ["nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2", "mxint8", "nvfp8",
            "fp4_fp32", "fp4_fp16", "fp8_e4m3_fp32", "fp8_e5m2_fp16", "int2_fp32", "int3_fp16", "int8_fp16",
            "mxint2", "mxint6", "int4_affine_g32", "int8_affine_g128", "fp8_e4m3_block128",
            "fp8_e4m3_block128x128"]


def test_required_presets_exist():
    assert not [n for n in REQUIRED if n not in registry]


@pytest.mark.parametrize("name", list(registry))
def test_format_dict_roundtrip(name):
    f = registry[name]
    assert Format.from_dict(f.to_dict()) == f
    assert ms.get_format(name.upper()) is f


def test_bits_per_element():
    assert registry["nvfp4"].bits_per_element == 4.5
    assert registry["mxfp4"].bits_per_element == 4.25
    assert registry["int4_affine_g128"].bits_per_element == 4 + 24 / 128


def test_custom_format_and_errors():
    f = registry["mxfp4"].replace(name="mxfp4_b16", block_size=16)
    assert f.block_size == 16 and f.element is registry["mxfp4"].element
    with pytest.raises(ValueError, match="does not fit"):
        registry["mxfp4"].replace(scale_rule="amax")
    with pytest.raises(ValueError, match="whole number of bytes"):
        registry["mxfp6_e2m3"].replace(block_size=3)
    with pytest.raises(KeyError, match="unknown format 'fp5'"):
        ms.get_format("fp5")
    with pytest.raises(ValueError, match="already registered"):
        ms.formats.register(registry["nvfp4"])


@pytest.mark.parametrize("field", ["block_size", "block_rows"])
@pytest.mark.parametrize("value,err", [(2.9, TypeError), (32.0, TypeError), (True, TypeError), ("32", TypeError),
                                       (None, TypeError), (0, ValueError), (-32, ValueError)])
def test_int_fields_are_not_coerced(field, value, err):
    """block_size=2.9 is an error, not 2; bools are not ints; sizes are positive."""
    with pytest.raises(err, match=rf"{field} must be"):
        registry["int4_fp32"].replace(**{field: value})


@pytest.mark.parametrize("value,err", [(2.9, TypeError), (32.0, TypeError), (True, TypeError), (False, TypeError),
                                       (0, ValueError), (-16, ValueError)])
def test_quantize_block_size_option_is_checked(value, err):
    import torch

    with pytest.raises(err, match="block_size must be"):
        ms.quantize(torch.randn(2, 64), "int4_fp32", block_size=value)


def test_numpy_ints_are_ints():
    import numpy as np

    f = registry["int4_fp32"].replace(block_size=np.int64(16))
    assert f.block_size == 16 and type(f.block_size) is int


@pytest.mark.parametrize("field,value", [("global_scale", 1), ("zero_point", "no"), ("name", 3), ("element", "e2m1"),
                                         ("scale", "fp16"), ("scale_rule", 5), ("two_level", 1)])
def test_other_fields_are_typed(field, value):
    f = registry["int4_fp32"]
    kw = {k: getattr(f, k) for k in ("name", "element", "block_size", "scale", "scale_rule", "block_rows",
                                      "global_scale", "two_level", "zero_point")}
    with pytest.raises((TypeError, ValueError), match=field):
        Format(**{**kw, field: value})
