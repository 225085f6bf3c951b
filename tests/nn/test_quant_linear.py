import pytest
import torch
from torch import nn

import microscale as ms
from microscale.nn import QuantLinear, quantize_model

FORMATS = ["nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "int4_affine_g32", "int8_fp16", "fp8_e4m3_block128x128"]


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(128, 256)
        self.act = nn.GELU()
        self.down = nn.Linear(256, 128, bias=False)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.down(self.act(self.up(x))))


@pytest.mark.parametrize("fmt", FORMATS)
def test_forward_and_state_dict_roundtrip(fmt):
    torch.manual_seed(0)
    model = Toy()
    x = torch.randn(4, 128)
    qm = quantize_model(model, fmt, skip=["head"], inplace=False)
    assert isinstance(qm.up, QuantLinear) and isinstance(qm.down, QuantLinear) and type(qm.head) is nn.Linear
    assert type(model.up) is nn.Linear  # inplace=False leaves the original
    q = ms.quantize(model.up.weight.detach(), fmt)
    assert torch.equal(qm.up.qweight.data, q.data)
    want = nn.functional.linear(x, q.dequantize(), model.up.bias)
    assert torch.equal(qm.up(x), want)
    y = qm(x)
    # a fresh quantized model loads the state dict and computes the same thing
    fresh = quantize_model(Toy(), fmt, skip=["head"])
    fresh.load_state_dict(qm.state_dict())
    assert torch.equal(fresh(x), y)
    for r in ("data", "scales", "global_scale", "zero_points"):
        a, b = getattr(qm.up, "weight_" + r), getattr(fresh.up, "weight_" + r)
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a,
                                                      b.view(torch.uint8) if b.element_size() == 1 else b)


def test_state_dict_format_mismatch():
    qm = quantize_model(Toy(), "nvfp4")
    other = quantize_model(Toy(), "mxfp4")
    with pytest.raises(Exception, match="nvfp4|mxfp4|size mismatch"):
        other.load_state_dict(qm.state_dict())


def test_dtype_cast_keeps_quantized_storage():
    qm = quantize_model(Toy(), "nvfp4")
    gs = qm.up.weight_global_scale.clone()
    qm = qm.to(torch.bfloat16)
    assert qm.up.weight_scales.dtype == torch.float8_e4m3fn
    assert qm.up.weight_global_scale.dtype == torch.float32 and torch.equal(qm.up.weight_global_scale, gs)
    assert qm.up.bias.dtype == torch.bfloat16
    y = qm(torch.randn(2, 128, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()


def test_bf16_input_uses_linear_when_available():
    torch.manual_seed(1)
    lin = nn.Linear(128, 64)
    ql = QuantLinear.from_linear(lin, "mxfp4")
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    y = ql(x)
    w = ql.qweight.dequantize(torch.float64)
    ref = (x.double() @ w.T + lin.bias.double())
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), ref, rtol=2e-2, atol=2e-2)


def test_padded_k():
    lin = nn.Linear(100, 8)
    ql = QuantLinear.from_linear(lin, "mxfp4")  # K=100 padded to 128 inside the QTensor
    x = torch.randn(2, 100)
    assert ql(x).shape == (2, 8)
    assert ql.qweight.shape == (8, 100)


def test_hf_transformers_model():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=128, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 50, (2, 8))
    ref = model(input_ids=ids).last_hidden_state
    qm = quantize_model(model, "mxfp8_e4m3", skip=["pooler*"], inplace=False)
    n = sum(isinstance(m, QuantLinear) for m in qm.modules())
    assert n == 2 * 6
    out = qm(input_ids=ids).last_hidden_state
    cos = nn.functional.cosine_similarity(out.flatten(1), ref.flatten(1)).min()
    assert cos > 0.99
    fresh = quantize_model(transformers.BertModel(cfg).eval(), "mxfp8_e4m3", skip=["pooler*"])
    fresh.load_state_dict(qm.state_dict())
    assert torch.equal(fresh(input_ids=ids).last_hidden_state, out)


@pytest.mark.parametrize("conv,fmt", [("native", "int4_affine_g32"), ("modelopt", "nvfp4"),
                                      ("compressed-tensors", "mxfp4")])
def test_checkpoint_of_a_quantized_model(tmp_path, conv, fmt):
    from microscale import io as msio
    from microscale.nn import load_quantized_state, quantized_state

    torch.manual_seed(0)
    f = msio.get_convention(conv).check_format(ms.get_format(fmt))
    qm = quantize_model(Toy(), f, skip=["head"])
    x = torch.randn(3, 128)
    msio.save(quantized_state(qm), tmp_path / "ck", convention=conv)
    fresh = load_quantized_state(Toy(), msio.load(tmp_path / "ck"))
    assert isinstance(fresh.up, QuantLinear) and type(fresh.head) is nn.Linear
    assert torch.equal(fresh(x), qm(x))
