"""The attention reference vs an independent float64 loop over the dequantized cache:
GQA / MQA / MHA, ragged extend, sliding window, gpt-oss sinks, soft-cap; argument errors."""
import math

import pytest
import torch

from microscale.attention import PagedKVCache, attention_reference, decode_attention


def _naive(q, k, v, qpos, scale, window, sinks, softcap):
    """One query [Hq, D] at position qpos over k, v [L, Hkv, D], float64, one head at a time."""
    hq, hkv = q.shape[0], k.shape[1]
    out = torch.zeros(hq, q.shape[1], dtype=torch.float64)
    for h in range(hq):
        kh, vh = k[:, h // (hq // hkv)].double(), v[:, h // (hq // hkv)].double()
        logits = []
        for j in range(k.shape[0]):
            if j > qpos or (window is not None and qpos - j >= window):
                continue
            x = float(q[h].double() @ kh[j]) * scale
            if softcap is not None:
                x = softcap * math.tanh(x / softcap)
            logits.append((x, j))
        m = max([x for x, _ in logits] + ([float(sinks[h])] if sinks is not None else []))
        den = sum(math.exp(x - m) for x, _ in logits) + (math.exp(float(sinks[h]) - m) if sinks is not None else 0)
        for x, j in logits:
            out[h] += math.exp(x - m) / den * vh[j]
    return out


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (8, 1)])
@pytest.mark.parametrize("opts", [{}, {"sliding_window": 3, "softmax_scale": 0.3},
                                  {"sinks": True, "softcap": 2.0}])
def test_reference_vs_float64_loop(hq, hkv, opts, gen):
    c = PagedKVCache("nvfp4", num_layers=1, num_kv_heads=hkv, head_dim=16, num_pages=8, page_size=4, max_seqs=2,
                     global_scale=0.01)
    c.append(0, torch.randn(6, hkv, 16, generator=gen), torch.randn(6, hkv, 16, generator=gen), seqs=[0])
    c.append(0, torch.randn(2, hkv, 16, generator=gen), torch.randn(2, hkv, 16, generator=gen), seqs=[1])
    opts = dict(opts)
    if opts.pop("sinks", False):
        opts["sinks"] = torch.randn(hq, generator=gen)
    q_lens = [3, 2]
    q = torch.randn(5, hq, 16, generator=gen)
    got = attention_reference(q, c, 0, q_lens=q_lens, **opts)
    scale = opts.get("softmax_scale", 1 / 4)
    rows, t = [], 0
    for s, n in enumerate(q_lens):
        k, v = c.dequantize(0, s, torch.float64)
        for i in range(n):
            rows.append(_naive(q[t], k, v, k.shape[0] - n + i, scale, opts.get("sliding_window"), opts.get("sinks"),
                               opts.get("softcap")))
            t += 1
    want = torch.stack(rows)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)


def test_argument_errors(gen):
    c = PagedKVCache("mxfp4", num_layers=1, num_kv_heads=2, head_dim=32, num_pages=4, page_size=4, max_seqs=2)
    c.append(0, torch.randn(2, 2, 32), torch.randn(2, 2, 32), seqs=[0])
    q = torch.randn(1, 4, 32)
    with pytest.raises(ValueError, match="q_heads=3"):
        attention_reference(torch.randn(1, 3, 32), c, 0)
    with pytest.raises(ValueError, match="head_dim=16"):
        attention_reference(torch.randn(1, 4, 16), c, 0)
    with pytest.raises(ValueError, match="holds 0 tokens"):
        attention_reference(q, c, 0, seqs=[1])
    with pytest.raises(ValueError, match="sinks must be"):
        attention_reference(q, c, 0, sinks=torch.zeros(2))
    with pytest.raises(ValueError, match="sliding_window"):
        attention_reference(q, c, 0, sliding_window=0)
    with pytest.raises(ValueError, match="q has 1 tokens"):
        attention_reference(q, c, 0, q_lens=[2])
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        decode_attention(q.numpy(), c, 0)
