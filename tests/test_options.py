"""QuantizeOptions: the quantize options checked and resolved once, accepted in place of the
format by every quantizer, with the same results as the keyword form."""
import pytest
import torch

import microscale as ms
from microscale import quant, reference
from microscale.formats import NonFinite, Rounding, ScaleRule, TwoLevel
from microscale.options import QuantizeOptions, resolve_format


def test_resolve_applies_overrides_and_enums():
    o = QuantizeOptions.resolve("mxfp4", block_size=64, scale_rule="rceil", rounding="nearest_away",
                                nonfinite="zero", pad=True)
    assert o.fmt == resolve_format("mxfp4", 64, "rceil")
    assert o.fmt.block_size == 64 and o.fmt.scale_rule is ScaleRule.RCEIL
    assert o.rounding is Rounding.NEAREST_AWAY and o.nonfinite is NonFinite.ZERO and o.pad is True
    assert QuantizeOptions.resolve(o) is o  # already resolved: returned as it is
    c = QuantizeOptions.resolve("nvfp4", convention="compressed-tensors")
    assert c.fmt.two_level is TwoLevel.COMPRESSED_TENSORS


@pytest.mark.parametrize("kwargs,err,match", [
    ({"global_scale": 0.5}, ValueError, "two-level"),                 # mxfp4 has no global scale
    ({"block_size": 0}, ValueError, "block_size"),
    ({"scale_rule": "minmax"}, ValueError, "does not apply"),
    ({"rounding": "up"}, ValueError, "rounding"),
    ({"convention": "modelopt"}, ValueError, "two-level"),
])
def test_resolve_errors_name_the_argument(kwargs, err, match):
    with pytest.raises(err, match=match):
        QuantizeOptions.resolve("mxfp4", **kwargs)


@pytest.mark.parametrize("g,err", [(True, TypeError), ("1", TypeError), (torch.ones(2), TypeError),
                                   (torch.ones(1, dtype=torch.int32), TypeError), (0.0, ValueError),
                                   (float("inf"), ValueError), (torch.tensor(-1.0), ValueError)])
def test_global_scale_checked_once_for_every_quantizer(g, err):
    with pytest.raises(err, match="global_scale"):
        QuantizeOptions.resolve("nvfp4", global_scale=g)
    with pytest.raises(err, match="global_scale"):
        ms.quantize(torch.randn(2, 32), "nvfp4", global_scale=g)


def test_options_and_keywords_not_both():
    o = QuantizeOptions.resolve("nvfp4")
    for kw in ({"pad": True}, {"rounding": "stochastic"}, {"block_size": 32}, {"global_scale": 1.0}):
        with pytest.raises(TypeError, match="both"):
            ms.quantize(torch.randn(2, 32), o, **kw)


@pytest.mark.parametrize("name,kw", [("nvfp4", {"global_scale": 0.01}), ("mxfp4", {"scale_rule": "rceil"}),
                                     ("int4_affine_g32", {"pad": True}), ("mxfp8_e4m3", {"block_size": 64})])
def test_options_give_the_keyword_results(name, kw, gen):
    """The reference and the kernel (interpreter) give the same bits from options as from keywords."""
    x = torch.randn(8, 100 if kw.get("pad") else 128, generator=gen)
    o = QuantizeOptions.resolve(name, **kw)
    want = reference.quantize(x, name, **kw)
    for got in (reference.quantize(x, o), ms.quantize(x, o), quant.quantize(x, o)):
        assert got.fmt == want.fmt
        assert torch.equal(got.data, want.data)
        assert torch.equal(got.scales.view(torch.uint8), want.scales.view(torch.uint8))
