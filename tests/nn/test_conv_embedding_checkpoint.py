"""quantized_state / load_quantized_state for QuantConv2d and QuantEmbedding: QTensors named
``<module>.weight`` through microscale.io's native convention into a fresh float model, every
check made before the model changes."""
import pytest
import torch
from torch import nn

from microscale import io as msio
from microscale.conv import conv_layout
from microscale.nn import QuantConv2d, QuantEmbedding, QuantLinear, load_quantized_state, quantize_model, \
    quantized_state


class _Net(nn.Module):
    def __init__(self, k: int = 3):
        super().__init__()
        self.embed = nn.Embedding(13, 32, padding_idx=1)
        self.stem = nn.Conv2d(3, 32, 4, stride=4)  # patch embedding
        self.dw = nn.Conv2d(32, 32, k, padding="same", groups=32, padding_mode="reflect")
        self.pw = nn.Conv2d(32, 16, 1, bias=False)
        self.head = nn.Linear(16, 5)

    def forward(self, img, ids):
        h = self.pw(self.dw(self.stem(img))).mean((2, 3))
        return self.head(h + self.embed(ids)[:, :16])


def _quantized(fmt="nvfp4"):
    torch.manual_seed(0)
    m = quantize_model(_Net(), fmt, conv2d=True, embedding=True)
    q, bias, geo = _requantized(m.dw, "chw")
    m.dw = QuantConv2d.from_qtensor(q, bias, **geo)  # one weight in the other K order
    return m


def _requantized(qc: QuantConv2d, order: str):
    from microscale.conv import dequantize_conv_weight, quantize_conv_weight

    w = dequantize_conv_weight(qc.qweight)
    q = quantize_conv_weight(w, qc.fmt, order=order)
    return q, qc.bias.detach(), dict(stride=qc.stride, padding=qc.padding, dilation=qc.dilation, groups=qc.groups,
                                     padding_mode=qc.padding_mode)


def _fresh(k: int = 3):
    torch.manual_seed(1)
    return _Net(k)


def _floats(m):
    return all(type(getattr(m, n)) is t for n, t in (("embed", nn.Embedding), ("stem", nn.Conv2d),
                                                      ("dw", nn.Conv2d), ("pw", nn.Conv2d), ("head", nn.Linear)))


@pytest.mark.parametrize("fmt", ["nvfp4", "int4_affine_g32"])
def test_native_round_trip_into_fresh_float_model(tmp_path, fmt):
    qm = _quantized(fmt)
    state = quantized_state(qm)
    for n in ("embed", "stem", "dw", "pw", "head"):
        assert state[n + ".weight"].fmt.name == fmt
    assert state["stem.weight"].meta["conv2d"] == {"shape": [32, 3, 4, 4], "order": "hwc"}
    assert state["dw.weight"].meta["conv2d"]["order"] == "chw"
    assert not any(k.endswith(("weight_data", "weight_scales", "_extra_state")) for k in state)
    msio.save(state, tmp_path / "ckpt")
    loaded = msio.load(tmp_path / "ckpt")
    fresh = load_quantized_state(_fresh(), loaded)
    assert type(fresh.embed) is QuantEmbedding and fresh.embed.padding_idx == 1
    assert type(fresh.head) is QuantLinear
    for n in ("stem", "dw", "pw"):
        a, b = getattr(fresh, n), getattr(qm, n)
        assert type(a) is QuantConv2d and a._geometry() == b._geometry()
        assert conv_layout(a.qweight) == conv_layout(b.qweight)
        assert torch.equal(a.weight_data, b.weight_data) and torch.equal(a.weight_scales, b.weight_scales)
    img, ids = torch.randn(2, 3, 16, 16), torch.tensor([3, 1])
    with torch.no_grad():
        assert torch.equal(fresh(img, ids), qm(img, ids))
    assert fresh.state_dict().keys() == qm.state_dict().keys()


def test_conv_shape_mismatch_leaves_model_unchanged():
    state = quantized_state(_quantized())
    model = _fresh(k=5)
    with pytest.raises(ValueError, match=r"'dw.weight' is a conv weight of shape \[32, 1, 3, 3\].*\[32, 1, 5, 5\]"):
        load_quantized_state(model, state)
    assert _floats(model)


def test_conv_weight_without_layout_is_refused():
    state = quantized_state(_quantized())
    q = state["stem.weight"]
    state["stem.weight"] = type(q)(q.data, q.scales, q.fmt, q.shape, q.dtype, q.global_scale, q.zero_points, {})
    model = _fresh()
    with pytest.raises(ValueError, match="'stem.weight'.*no conv2d layout"):
        load_quantized_state(model, state)
    assert _floats(model)


def test_embedding_shape_and_missing_bias_leave_model_unchanged():
    state = quantized_state(_quantized())
    model = _fresh()
    model.embed = nn.Embedding(14, 32)
    with pytest.raises(ValueError, match=r"'embed.weight' has shape \(13, 32\).*\(14, 32\)"):
        load_quantized_state(model, state)
    assert _floats(model)
    del state["stem.bias"]
    model = _fresh()
    with pytest.raises(ValueError, match="missing.*stem.bias"):
        load_quantized_state(model, state)
    assert _floats(model)
