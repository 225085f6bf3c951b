"""transformers integration: tiny Llama-like and gpt-oss-like models (random weights) generate
with MicroscaleKVCache and the registered "microscale" attention (Triton interpreter)."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from microscale.attention.hf import MicroscaleKVCache, register  # noqa: E402


def _generate(model, ids, cache=None, steps=6):
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=steps,
                             do_sample=False)
    return out[:, ids.shape[1]:]


def test_llama_fp8_kv_greedy_tokens_match_unquantized():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (2, 6))
    want = _generate(model, ids)  # float32 K/V, sdpa
    register()
    model.set_attn_implementation("microscale")
    cache = MicroscaleKVCache(model.config, "fp8_e4m3_fp32", per_token=True, max_cache_len=64)
    assert not cache.materialize
    got = _generate(model, ids, cache)
    assert cache.paged.lengths(1) == [11, 11]  # prompt + steps - 1 tokens written per layer
    assert torch.equal(got, want)


def _teacher_forced_logits(model, ids, cache, prompt=6):
    """Logits of a prefill of ``prompt`` tokens then one decode step per remaining token."""
    out = []
    with torch.no_grad():
        out.append(model(ids[:, :prompt], cache=cache, use_cache=True).logits)
        for i in range(prompt, ids.shape[1]):
            out.append(model(ids[:, i:i + 1], cache=cache, use_cache=True).logits)
    return torch.cat(out, dim=1).double()


def test_gpt_oss_sinks_and_window_match_eager_over_the_same_cache():
    torch.manual_seed(0)
    cfg = transformers.GptOssConfig(vocab_size=128, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=8, num_key_value_heads=2, head_dim=32, num_local_experts=4,
                                    num_experts_per_tok=2, sliding_window=4, max_position_embeddings=256,
                                    layer_types=["sliding_attention", "full_attention"])
    model = transformers.GptOssForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)  # sinks that matter
    ids = torch.randint(0, 128, (2, 9))
    register()
    model.set_attn_implementation("microscale")
    got = _teacher_forced_logits(model, ids, MicroscaleKVCache(model.config, "nvfp4", global_scale=0.01,
                                                               max_cache_len=64))
    # transformers' own eager attention (sinks, sliding window) over the decoded K/V of the same cache
    model.set_attn_implementation("eager")
    ref_cache = MicroscaleKVCache(model.config, "nvfp4", global_scale=0.01, max_cache_len=64)
    assert ref_cache.materialize
    want = _teacher_forced_logits(model, ids, ref_cache)
    assert float((got - want).norm() / want.norm()) < 1e-2
