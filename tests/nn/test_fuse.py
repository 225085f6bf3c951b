"""fuse_projections: tiny transformers decoders (random weights from a config), quantized, then
fused: logits equal the unfused quantized model's, the fused op really runs, generate agrees,
non-matching groups stay unfused with one warning, and every unsafe call falls back."""
import copy
import warnings

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from microscale.linear import batched as batched_mod  # noqa: E402
from microscale.linear import norm_linear as norm_linear_mod  # noqa: E402
from microscale.nn import QuantLinear, fuse_projections, quantize_model, quantized_state, \
    unfuse_projections  # noqa: E402
from microscale.nn.fuse import FusedQuantLinear, FusedRMSNorm  # noqa: E402

_COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-5,
               tie_word_embeddings=False)
_FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),  # q/k/v biases
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"hidden_activation": "gelu_pytorch_tanh"}),  # 1 + weight
}


def _model(family: str) -> nn.Module:
    cfg_name, cls_name, extra = _FAMILIES[family]
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_name)(**_COMMON, **extra)
    m = getattr(transformers, cls_name)(cfg).eval()
    with torch.no_grad():  # norm weights away from their init (ones / zeros) so a lost weight shows
        for n, p in m.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    return m


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


class _Count:
    def __init__(self, monkeypatch, module, name):
        self.n = 0
        fn = getattr(module, name)

        def counted(*a, **k):
            self.n += 1
            return fn(*a, **k)

        monkeypatch.setattr(module, name, counted)


def _pair(family: str, **qkw):
    """(unfused quantized model, fused copy)."""
    m = quantize_model(_model(family), "nvfp4", skip=["lm_head", "v_proj"], **qkw)
    m = quantize_model(m, "int4_affine_g32", skip=["lm_head"])  # v_proj in another format: mixed formats in one group
    ref = copy.deepcopy(m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fused = fuse_projections(m)
    return ref, fused


_IDS = torch.tensor([[3, 17, 42, 5, 88, 9, 61]])


@pytest.mark.parametrize("family", list(_FAMILIES))
def test_fused_logits_equal_unfused_fp32(family, monkeypatch):
    ref, fused = _pair(family)
    layers = fused.model.layers
    for layer in layers:
        assert isinstance(layer.input_layernorm, FusedRMSNorm)
        assert isinstance(layer.post_attention_layernorm, FusedRMSNorm)
        assert all(type(getattr(layer.self_attn, p)) is FusedQuantLinear for p in ("q_proj", "k_proj", "v_proj"))
    assert fused.state_dict().keys() == ref.state_dict().keys()
    assert quantized_state(fused).keys() == quantized_state(ref).keys()
    calls = _Count(monkeypatch, norm_linear_mod, "rmsnorm_linear_reference")
    with torch.no_grad():
        want = ref(_IDS).logits
        assert calls.n == 0
        got = fused(_IDS).logits
    assert calls.n == 5 * len(layers)  # q, k, v, gate, up of each layer, from the un-normalized input
    assert _rel(got, want) < 1e-3


def test_fused_bf16_runs_one_rmsnorm_linear_per_group(monkeypatch):
    ref, fused = _pair("llama")
    ref, fused = ref.to(torch.bfloat16), fused.to(torch.bfloat16)
    calls = _Count(monkeypatch, norm_linear_mod, "rmsnorm_linear")
    with torch.no_grad():
        want = ref(_IDS).logits
        assert calls.n == 0
        got = fused(_IDS).logits
    assert calls.n == 2 * len(fused.model.layers)
    # the fused norm skips transformers' bf16 roundings of the normalized activations
    assert _rel(got, want) < 3e-2


def test_generate_greedy_tokens_equal():
    ref, fused = _pair("llama")
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    a = ref.generate(_IDS, **kw)
    b = fused.generate(_IDS, **kw)
    assert a.shape == (1, _IDS.shape[1] + 5)
    assert torch.equal(a, b)


def test_quantize_model_fuse_option_and_deepcopy(monkeypatch):
    m = quantize_model(_model("qwen3"), "nvfp4", skip=["lm_head"], fuse=True)
    assert isinstance(m.model.layers[0].input_layernorm, FusedRMSNorm)
    c = copy.deepcopy(m)  # the copy's groups are its own modules
    calls = _Count(monkeypatch, norm_linear_mod, "rmsnorm_linear_reference")
    with torch.no_grad():
        assert torch.equal(c(_IDS).logits, m(_IDS).logits)
    assert calls.n == 2 * 5 * len(m.model.layers)


def test_non_matching_groups_stay_unfused_with_one_warning(monkeypatch):
    m = quantize_model(_model("llama"), "nvfp4", skip=["lm_head", "layers.1.self_attn.k_proj"])
    m.model.layers[0].post_attention_layernorm = nn.LayerNorm(64)  # a norm that cannot fold
    ref = copy.deepcopy(m)
    with pytest.warns(UserWarning, match="fuse_projections: 2 group") as rec:
        fuse_projections(m)
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert "model.layers.1.self_attn: k_proj is Linear, not QuantLinear" in msg
    assert "model.layers.0.mlp: post_attention_layernorm is LayerNorm" in msg and "batched" in msg
    l0, l1 = m.model.layers
    assert type(l1.self_attn.q_proj) is QuantLinear and type(l1.input_layernorm).__name__ == "LlamaRMSNorm"
    assert isinstance(l1.post_attention_layernorm, FusedRMSNorm)  # the layer's other group fuses
    assert type(l0.post_attention_layernorm) is nn.LayerNorm and type(l0.mlp.gate_proj) is FusedQuantLinear
    with torch.no_grad():
        assert _rel(m(_IDS).logits, ref(_IDS).logits) < 1e-3
    m, ref = m.to(torch.bfloat16), ref.to(torch.bfloat16)
    calls = _Count(monkeypatch, batched_mod, "linear_batched")
    with torch.no_grad():
        got, want = m(_IDS).logits, ref(_IDS).logits
    assert calls.n == 1  # layer 0's gate/up from the LayerNorm's output
    assert _rel(got, want) < 1e-2


def test_unsafe_calls_fall_back_to_unfused(monkeypatch):
    ref, fused = _pair("llama")
    calls = _Count(monkeypatch, norm_linear_mod, "rmsnorm_linear_reference")
    with torch.no_grad():
        want = ref(_IDS).logits
    # autograd on: the layer runs unfused, the same computation
    assert torch.equal(fused(_IDS).logits.detach(), want)
    assert calls.n == 0
    # a hook on a norm sees what the original norm returns
    seen = []
    h = fused.model.layers[0].input_layernorm.register_forward_hook(lambda mod, a, out: seen.append(out))
    seen_ref = []
    h2 = ref.model.layers[0].input_layernorm.register_forward_hook(lambda mod, a, out: seen_ref.append(out))
    with torch.no_grad():
        got = fused(_IDS).logits
        ref(_IDS)
    h.remove(), h2.remove()
    assert torch.equal(seen[0], seen_ref[0])
    assert _rel(got, want) < 1e-3
    assert calls.n == 2 + 5  # the hooked norm's group alone runs unfused
    # a projection replaced after fusing: its group's norm normalizes again
    l0 = fused.model.layers[0]
    l0.self_attn.k_proj = QuantLinear.from_qtensor(l0.self_attn.k_proj.qweight)
    calls.n = 0
    with torch.no_grad():
        got = fused(_IDS).logits
    assert calls.n == 2 + 5  # layer 0's MLP and layer 1
    assert _rel(got, want) < 1e-3
    # a projection called by itself on some tensor is a plain QuantLinear
    x = torch.randn(2, 64)
    q = fused.model.layers[1].self_attn.q_proj
    assert torch.equal(q(x), QuantLinear.forward(q, x))


def test_unfuse_restores_modules_and_outputs():
    ref, fused = _pair("qwen2")
    unfuse_projections(fused)
    for layer in fused.model.layers:
        assert type(layer.input_layernorm).__name__ == "Qwen2RMSNorm"
        assert type(layer.self_attn.q_proj) is QuantLinear and layer.self_attn.q_proj.bias is not None
    with torch.no_grad():
        assert torch.equal(fused(_IDS).logits, ref(_IDS).logits)
    assert fused.state_dict().keys() == ref.state_dict().keys()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused kernel path needs CUDA")
def test_fused_cuda_bf16_kernel_path(monkeypatch):
    ref, fused = _pair("qwen2")
    ref, fused = ref.to("cuda", torch.bfloat16), fused.to("cuda", torch.bfloat16)
    calls = _Count(monkeypatch, norm_linear_mod, "rmsnorm_linear")
    ids = _IDS.cuda()
    with torch.no_grad():
        want = ref(ids).logits
        got = fused(ids).logits
    assert calls.n == 2 * len(fused.model.layers)
    assert _rel(got, want) < 3e-2
    kw = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert fused.generate(ids, **kw).shape == (1, ids.shape[1] + 3)
