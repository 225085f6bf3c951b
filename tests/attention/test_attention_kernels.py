"""The Triton attention kernels (interpreter) vs float64 attention over the dequantized cache:
every KV format, GQA ratios 1/4/8, ragged batches crossing page boundaries, one-token
sequences, key-range splits, sliding window, sinks, soft-cap, prefill/extend."""
import pytest
import torch

from microscale.attention import AttentionConfig, PagedKVCache, attention_reference, decode_attention, \
    extend_attention
from microscale.runtime import target

KV_FORMATS = [("fp8_e4m3_fp32", True, None), ("mxfp8_e4m3", False, None), ("nvfp4", False, 0.02),
              ("mxfp4", False, None), ("int8_fp16", False, None), ("int4_fp16", False, None),
              ("int4_affine_g32", False, None)]


def _filled(fmt, per_token, gs, hkv, lens, gen, d=32, page=4):
    c = PagedKVCache(fmt, num_layers=1, num_kv_heads=hkv, head_dim=d, num_pages=sum(-(-n // page) for n in lens) + 1,
                     page_size=page, max_seqs=len(lens), per_token=per_token, global_scale=gs)
    for s, n in enumerate(lens):
        c.append(0, torch.randn(n, hkv, d, generator=gen) * 2, torch.randn(n, hkv, d, generator=gen), seqs=[s])
    return c


def _rel(got, want):
    assert torch.isfinite(got).all()  # every output element written (outputs start as torch.empty)
    return float((got.double() - want).norm() / want.norm())


@pytest.mark.parametrize("fmt,per_token,gs", KV_FORMATS)
def test_decode_every_format(fmt, per_token, gs, gen):
    c = _filled(fmt, per_token, gs, 2, [9, 1, 17], gen)  # ragged; one-token sequence; page boundaries
    q = torch.randn(3, 8, 32, generator=gen)
    got = decode_attention(q, c, 0, config=AttentionConfig(block_n=16, rows=16, num_splits=2))
    assert _rel(got, attention_reference(q, c, 0, dtype=torch.float64)) < 1e-2


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("opts", [{}, {"sliding_window": 5}, {"sinks": True, "softcap": 3.0, "softmax_scale": 0.2}])
def test_decode_gqa_and_options(group, opts, gen):
    hkv = 2 if group < 8 else 1
    c = _filled("nvfp4", False, 0.02, hkv, [21, 1, 6], gen)
    opts = dict(opts)
    if opts.pop("sinks", False):
        opts["sinks"] = torch.randn(hkv * group, generator=gen)
    q = torch.randn(3, hkv * group, 32, generator=gen)
    got = decode_attention(q, c, 0, config=AttentionConfig(block_n=16, rows=max(16, group), num_splits=3), **opts)
    assert _rel(got, attention_reference(q, c, 0, dtype=torch.float64, **opts)) < 1e-2


@pytest.mark.parametrize("opts", [{}, {"sliding_window": 4, "sinks": True}])
def test_extend_ragged(opts, gen):
    c = _filled("mxfp4", False, None, 2, [13, 2, 7], gen)
    opts = dict(opts)
    if opts.pop("sinks", False):
        opts["sinks"] = torch.randn(8, generator=gen)
    q_lens = [13, 1, 4]  # a whole prefill, one new token, an extend of 4 after 3 cached
    q = torch.randn(sum(q_lens), 8, 32, generator=gen).to(torch.bfloat16)
    got = extend_attention(q, c, 0, q_lens, config=AttentionConfig(block_n=16, rows=16, num_splits=1), **opts)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    assert _rel(got, attention_reference(q, c, 0, q_lens=q_lens, dtype=torch.float64, **opts)) < 1e-2


def test_default_config_and_seq_subset(gen):
    c = _filled("fp8_e4m3_fp32", True, None, 2, [40, 3], gen)
    q = torch.randn(1, 8, 32, generator=gen)
    got = decode_attention(q, c, 0, seqs=[0])  # choose_config: splits by the stand-in SM count
    assert _rel(got, attention_reference(q, c, 0, seqs=[0], dtype=torch.float64)) < 1e-2


def test_cpu_without_interpreter_runs_the_reference(gen):
    c = _filled("mxfp4", False, None, 2, [5], gen)
    q = torch.randn(1, 4, 32, generator=gen)
    with target.override(interpreting=False):
        got = decode_attention(q, c, 0)
    assert torch.equal(got, attention_reference(q, c, 0))
