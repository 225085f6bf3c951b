"""quantize_model with method / rotate / calibration, on a tiny BERT built from a config
(no download) and on toy modules; microscale.nn.quantize_model delegates to it."""
import pytest
import torch
from torch import nn

from microscale import io as msio
from microscale.accuracy import HadamardLinear, quantize_model
from microscale.nn import QuantLinear, load_quantized_state, quantized_state
from microscale.nn import quantize_model as nn_quantize_model

transformers = pytest.importorskip("transformers")


def _bert(seed=0):
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=128, max_position_embeddings=32)
    torch.manual_seed(seed)
    return transformers.BertModel(cfg).eval()


def _calib(seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 50, (4, 16), generator=g)} for _ in range(4)]


_IDS = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(2))


def _rel_err(model, ref):
    with torch.no_grad():
        out = model(input_ids=_IDS).last_hidden_state
    return float((out - ref).norm() / ref.norm())


def _weights(model):
    return {n: (m.weight_data, m.weight_scales) for n, m in model.named_modules() if isinstance(m, QuantLinear)}


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("rotate", [None, "hadamard"])
def test_gptq_on_a_tiny_bert_beats_rtn(fmt, rotate):
    model = _bert()
    with torch.no_grad():
        ref = model(input_ids=_IDS).last_hidden_state
    rtn = quantize_model(model, fmt, skip=["pooler*"], inplace=False)
    gptq = quantize_model(model, fmt, method="gptq", calibration=_calib(), rotate=rotate, skip=["pooler*"],
                          inplace=False)
    assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear))  # (not inplace)
    assert sum(isinstance(m, QuantLinear) for m in gptq.modules()) == 2 * 6
    assert sum(isinstance(m, HadamardLinear) for m in gptq.modules()) == (2 * 6 if rotate else 0)
    assert type(gptq.pooler.dense) is nn.Linear
    # measured (4 seeds): gptq/rtn 0.37-0.46 for nvfp4 and mxfp4, with or without rotation
    assert _rel_err(gptq, ref) < 0.75 * _rel_err(rtn, ref), (_rel_err(gptq, ref), _rel_err(rtn, ref))


def test_calibration_hessians_leave_out_padding():
    from microscale.accuracy.model import _hessians

    model = _bert()
    g = torch.Generator().manual_seed(5)
    a, b = torch.randint(1, 50, (16,), generator=g), torch.randint(1, 50, (9,), generator=g)
    ids = torch.zeros(2, 16, dtype=torch.long)
    mask = torch.zeros(2, 16, dtype=torch.long)
    ids[0], mask[0] = a, 1
    ids[1, :9], mask[1, :9] = b, 1
    rots = {n: None for n, m in model.named_modules() if isinstance(m, nn.Linear) and "pooler" not in n}
    padded = _hessians(model, rots, [{"input_ids": ids, "attention_mask": mask}])
    alone = _hessians(model, rots, [{"input_ids": a[None]}, {"input_ids": b[None]}])
    keyword = _hessians(model, rots, lambda m: m(ids, attention_mask=mask))

    class Features(nn.Module):  # sentence-transformers' style: one BatchEncoding of features
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, features):
            return self.bert(**features)

    feats = _hessians(Features(model), {f"bert.{n}": None for n in rots},
                      [(transformers.BatchEncoding({"input_ids": ids, "attention_mask": mask}),)])
    for n in rots:  # the same 25 token rows each way: padding rows left out
        assert torch.allclose(padded[n], alone[n], rtol=1e-4, atol=1e-6), n
        assert torch.allclose(keyword[n], alone[n], rtol=1e-4, atol=1e-6), n
        assert torch.allclose(feats[f"bert.{n}"], alone[n], rtol=1e-4, atol=1e-6), n


def test_nn_quantize_model_delegates(gen):
    """microscale.nn.quantize_model with method / calibration / rotate / GPTQ options is the
    calibrated quantizer; without them it is the plain one (the same weights as method='rtn')."""
    torch.manual_seed(0)
    model, cal = Toy(), torch.randn(64, 64, generator=gen)
    for kw in ({"method": "gptq", "calibration": cal}, {"method": "gptq", "calibration": cal, "act_order": True},
               {"method": "4over6"}, {"rotate": "hadamard"}):
        a = nn_quantize_model(model, "nvfp4", inplace=False, skip=["unused"], **kw)
        b = quantize_model(model, "nvfp4", inplace=False, skip=["unused"], **kw)
        wa, wb = _weights(a), _weights(b)
        assert wa.keys() == wb.keys() and len(wa) == 2, kw
        assert all(torch.equal(wa[k][0], wb[k][0]) and torch.equal(wa[k][1].view(torch.uint8),
                                                                    wb[k][1].view(torch.uint8)) for k in wa), kw
    plain, rtn = nn_quantize_model(model, "mxfp4", inplace=False), quantize_model(model, "mxfp4", inplace=False)
    assert len(_weights(plain)) == 3
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
               for x, y in zip(_weights(plain).values(), _weights(rtn).values()))
    gptq = _weights(nn_quantize_model(model, "mxfp4", method="gptq", calibration=cal, skip=["unused"],
                                      inplace=False))
    assert any(not torch.equal(x[0], y[0]) for x, y in zip(gptq.values(), _weights(rtn).values()))


def test_gptq_model_checkpoint_round_trip(tmp_path):
    """GPTQ's weights are ordinary QTensors: saved in a convention and loaded into a fresh
    float model, the outputs are the same."""
    qm = quantize_model(_bert(), "nvfp4", method="gptq", calibration=_calib(), skip=["pooler*"])
    msio.save(quantized_state(qm), tmp_path / "ck", convention="modelopt")
    fresh = load_quantized_state(_bert(seed=5), msio.load(tmp_path / "ck"))
    with torch.no_grad():
        assert torch.equal(fresh(input_ids=_IDS).last_hidden_state, qm(input_ids=_IDS).last_hidden_state)


def test_rotated_model_state_dict_round_trip():
    qm = quantize_model(_bert(), "mxfp4", method="gptq", calibration=_calib(), rotate="hadamard", rotate_block=64)
    assert {m.block for m in qm.modules() if isinstance(m, HadamardLinear)} == {64}
    fresh = quantize_model(_bert(seed=5), "mxfp4", rotate="hadamard", rotate_block=64)
    fresh.load_state_dict(qm.state_dict())
    with torch.no_grad():
        assert torch.equal(fresh(input_ids=_IDS).last_hidden_state, qm(input_ids=_IDS).last_hidden_state)


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 48)
        self.b = nn.Linear(48, 32)  # 48 in-features: no 32-block rotation
        self.unused = nn.Linear(32, 8)

    def forward(self, x, scale=1.0):
        return self.b(torch.relu(self.a(x))) * scale


def test_rotation_skips_layers_it_does_not_divide(gen):
    m = quantize_model(Toy(), "mxfp4", rotate="hadamard")
    assert isinstance(m.a, HadamardLinear) and m.a.block == 32 and isinstance(m.b, QuantLinear)
    assert m(torch.randn(3, 64, generator=gen)).shape == (3, 32)


def test_calibration_forms_and_a_layer_never_reached(gen):
    x = torch.randn(16, 64, generator=gen)
    forms = [x, [x[:8], x[8:]], [(x, 2.0)], lambda model: model(x)]
    outs = []
    for cal in forms:
        torch.manual_seed(0)
        m = quantize_model(Toy(), "nvfp4", method="gptq", calibration=cal, skip=["unused"])
        outs.append(m.a.weight_data)
    assert all(torch.equal(o, outs[0]) for o in outs[1:])  # the scale (2.0) only scales b's output
    torch.manual_seed(0)
    model = Toy()
    before = dict(model.named_children())
    with pytest.raises(ValueError, match="never ran Linear 'unused'"):
        quantize_model(model, "nvfp4", method="gptq", calibration=x)
    assert dict(model.named_children()) == before  # unchanged


def test_a_bare_linear(gen):
    lin = nn.Linear(64, 16)
    x = torch.randn(32, 64, generator=gen)
    q = quantize_model(lin, "mxfp4", method="gptq", calibration=x, inplace=False)
    assert isinstance(q, QuantLinear) and q.qweight.shape == (16, 64)
    r = nn_quantize_model(lin, "mxfp4", rotate="hadamard", inplace=False)
    assert isinstance(r, HadamardLinear)
    with torch.no_grad():
        torch.testing.assert_close(r(x), lin(x), rtol=0.2, atol=0.2)  # (4-bit weights)


def test_errors_leave_the_model_unchanged(gen):
    model = Toy()
    before = dict(model.named_children())
    x = torch.randn(8, 64, generator=gen)
    cases = [
        ({"method": "awq"}, "method='awq' is not known"),
        ({"method": "gptq"}, "needs calibration"),
        ({"calibration": x}, "method='gptq' only"),
        ({"rotate": "random"}, "rotate='random'"),
        ({"rotate": "hadamard", "rotate_block": 16}, "multiple of the mxfp4 block size 32"),
        ({"rotate": "hadamard", "rotate_block": 48}, "power of two"),
        ({"rotate_block": 64}, "needs rotate='hadamard'"),
        ({"act_order": True}, "GPTQ options"),
        ({"method": "mse", "scale_method": "mse"}, "GPTQ options"),
        ({"static_scales": False}, "GPTQ options"),
        ({"method": "gptq", "calibration": x, "scale_rule": "ceil"}, "no quantize options"),
        ({"method": "4over6"}, "4over6"),
    ]
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            nn_quantize_model(model, "mxfp4", skip=["unused"], **kw)
    with pytest.raises(ValueError, match="affine"):  # fails after calibration, before any replacement
        quantize_model(model, "int4_affine_g32", method="gptq", calibration=x, skip=["unused"])
    assert dict(model.named_children()) == before
