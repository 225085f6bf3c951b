"""QuantConv2d and QuantEmbedding: forward vs float64 math on the dequantized weights, the
quantize_model opt-ins (conv2d / embedding, tied tables), state dicts and dtype casts."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from microscale.conv import conv_layout, dequantize_conv_weight
from microscale.nn import QuantConv2d, QuantEmbedding, QuantLinear, quantize_model


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 4, stride=4)  # patch embedding
        self.dw = nn.Conv2d(8, 8, 3, padding="same", groups=8, padding_mode="reflect")
        self.pw = nn.Conv2d(8, 16, 1, bias=False)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        return self.head(self.pw(self.dw(self.stem(x))).mean((2, 3)))


class _LM(nn.Module):
    def __init__(self, tie: bool):
        super().__init__()
        self.embed = nn.Embedding(11, 32, padding_idx=0)
        self.proj = nn.Linear(32, 32)
        self.lm_head = nn.Linear(32, 11, bias=False)
        if tie:
            self.lm_head.weight = self.embed.weight

    def forward(self, ids):
        return self.lm_head(self.proj(self.embed(ids)))


def _conv64(m: QuantConv2d, x: torch.Tensor) -> torch.Tensor:
    """float64 F.conv2d on the dequantized weight, the module's padding mode applied first."""
    w = dequantize_conv_weight(m.qweight, torch.float64)
    b = None if m.bias is None else m.bias.double()
    xd = x.double()
    pad = m.padding
    if m.padding_mode != "zeros":
        xd, pad = F.pad(xd, m._explicit_padding(), mode=m.padding_mode), 0
    return F.conv2d(xd, w, b, m.stride, pad, m.dilation, m.groups)


@pytest.mark.parametrize("conv", [nn.Conv2d(4, 6, 3, stride=2, padding=1, dilation=1),
                                  nn.Conv2d(4, 8, (3, 2), padding="same", groups=2, padding_mode="circular",
                                            dilation=(1, 2)),
                                  nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False, padding_mode="replicate")])
def test_quant_conv_forward_is_float64_math(conv, gen):
    m = QuantConv2d.from_conv(conv, "nvfp4")
    assert conv_layout(m.qweight).shape == tuple(conv.weight.shape)
    x = torch.randn(2, 4, 7, 6, generator=gen)
    got = m(x)
    assert got.shape == conv(x).shape
    assert torch.equal(got, _conv64(m, x).float())


def test_quantize_model_conv_opt_in(gen):
    torch.manual_seed(0)
    net = _Net()
    x = torch.randn(2, 3, 16, 16, generator=gen)
    plain = quantize_model(net, "mxfp4", inplace=False)
    assert type(plain.stem) is nn.Conv2d and isinstance(plain.head, QuantLinear)  # convs stay by default
    q = quantize_model(net, "mxfp4", inplace=False, conv2d=True, skip=["head"])
    assert all(isinstance(getattr(q, n), QuantConv2d) for n in ("stem", "dw", "pw")) and type(q.head) is nn.Linear
    some = quantize_model(net, "mxfp4", inplace=False, conv2d=lambda name, m: m.groups == 1)
    assert isinstance(some.stem, QuantConv2d) and type(some.dw) is nn.Conv2d
    # the quantized model computes the float model with dequantized weights
    ref = _Net()
    ref.load_state_dict(net.state_dict())
    with torch.no_grad():
        for n in ("stem", "dw", "pw"):
            getattr(ref, n).weight.copy_(dequantize_conv_weight(getattr(q, n).qweight))
        assert (q(x) - ref(x)).abs().max() < 1e-5
    root = quantize_model(nn.Conv2d(3, 4, 3), "nvfp4", conv2d=True)
    assert isinstance(root, QuantConv2d)


def test_quant_conv_state_dict_and_casts(gen):
    torch.manual_seed(1)
    net = _Net()
    q = quantize_model(net, "int4_affine_g32", inplace=False, conv2d=True)
    fresh = quantize_model(_Net(), "int4_affine_g32", conv2d=True)
    fresh.load_state_dict(q.state_dict())
    x = torch.randn(1, 3, 8, 8, generator=gen)
    assert torch.equal(fresh(x), q(x))
    other = quantize_model(_Net(), "nvfp4", conv2d=True)
    with pytest.raises(ValueError, match="QuantConv2d: state is int4_affine_g32"):
        other.load_state_dict(q.state_dict())
    before = q.stem.weight_scales
    q.to(torch.bfloat16)
    assert q.stem.bias.dtype == torch.bfloat16 and q.stem.weight_scales.dtype == before.dtype
    assert q.stem(x.bfloat16()).dtype == torch.bfloat16


def test_quant_embedding(gen):
    emb = nn.Embedding(11, 40, padding_idx=0)  # D = 40: padded to a whole block
    m = QuantEmbedding.from_embedding(emb, "nvfp4")
    ids = torch.tensor([[3, 0, 10], [1, 1, 7]])
    table = m.qweight.dequantize(torch.float32)
    assert torch.equal(m(ids), table[ids]) and m.padding_idx == 0
    m.half()
    assert m(ids).dtype == torch.float16 and m.weight_data.dtype == torch.uint8
    assert torch.equal(m(ids), table.half()[ids])
    with pytest.raises(ValueError, match="max_norm"):
        QuantEmbedding.from_embedding(nn.Embedding(4, 32, max_norm=1.0))


@pytest.mark.parametrize("tie", [False, True])
def test_quantize_model_embedding_opt_in_and_ties(tie, gen):
    torch.manual_seed(2)
    lm = _LM(tie)
    ids = torch.tensor([[1, 5, 0, 9]])
    assert type(quantize_model(lm, "mxfp8_e4m3", inplace=False).embed) is nn.Embedding  # off by default
    q = quantize_model(lm, "mxfp8_e4m3", inplace=False, embedding=True)
    assert isinstance(q.embed, QuantEmbedding) != tie  # a table tied to lm_head stays unless asked
    q = quantize_model(lm, "mxfp8_e4m3", inplace=False, embedding=True, tied_embeddings=True)
    assert isinstance(q.embed, QuantEmbedding) and isinstance(q.lm_head, QuantLinear)
    ref = _LM(False)
    ref.load_state_dict(lm.state_dict(), strict=False)
    with torch.no_grad():
        ref.embed.weight.copy_(q.embed.qweight.dequantize())
        ref.proj.weight.copy_(q.proj.qweight.dequantize())
        ref.lm_head.weight.copy_(q.lm_head.qweight.dequantize())
        assert (q(ids) - ref(ids)).abs().max() < 1e-5
    fresh = quantize_model(_LM(tie), "mxfp8_e4m3", embedding=True, tied_embeddings=True)
    fresh.load_state_dict(q.state_dict())
    assert torch.equal(fresh(ids), q(ids))
