"""The Triton attention kernels (interpreter) vs float64 attention over the dequantized cache:
every KV format, GQA ratios 1/4/8, ragged batches crossing page boundaries, one-token
sequences, key-range splits, sliding window, sinks, soft-cap, prefill/extend."""
import pytest
import torch

from microscale.attention import AttentionConfig, PagedKVCache, attention_reference, choose_config, \
    decode_attention, extend_attention
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


def test_decode_splits_fill_the_resident_slots():
    """Decode splits: one round of programs where one fits (no short second round), the fewest splits on
    a tie, at least one block a split; 32k keys, 8 KV heads on 132 SMs (264 slots of the default tile)."""
    from microscale.attention.op import DECODE_PROGRAMS_PER_SM, decode_splits

    slots = DECODE_PROGRAMS_PER_SM * 132
    assert decode_splits(8, 256, slots) == 32  # batch 1: 256 programs of 8 blocks
    assert decode_splits(64, 256, slots) == 4  # batch 8: not 5 (320 programs, two rounds of 52 blocks)
    assert decode_splits(512, 256, slots) == 1  # batch 64: already two full rounds
    assert decode_splits(8, 2, slots) == 2 and decode_splits(8, 1, slots) == 1
    for pairs in (1, 3, 8, 64, 100, 512):
        for nb in (1, 5, 256, 1024):
            s = decode_splits(pairs, nb, slots)
            assert 1 <= s <= min(nb, 256)
            cost = lambda k: -(-pairs * k // slots) * (-(-nb // k) + 1)  # noqa: E731
            assert all(cost(s) <= cost(k) for k in range(1, min(nb, 256) + 1))
    with target.override(num_sms=132):
        cfg = choose_config(8, 8, 8, 32768, 1, torch.device("cpu"))
        assert (cfg.block_n, cfg.rows, cfg.num_splits) == (128, 16, 4)


def _recorded_launches(monkeypatch, what):
    """The attention launches recorded instead of run: ``(seen, kernels)``; each launch appends
    ``what(fn, kwargs)`` to ``seen``."""
    from microscale.attention import op

    kern = op._device()[1]
    seen = []

    class Rec:
        @staticmethod
        def launch(fn, grid, *a, **kw):
            seen.append(what(fn, kw))

    monkeypatch.setattr(op, "_device", lambda: (Rec, kern))
    return seen, kern


def test_register_cap_reaches_the_compiler(gen, monkeypatch):
    """``AttentionConfig.maxnreg`` goes to the attention kernel's launch as ``maxnreg`` (off the interpreter, which
    has no registers), only there, and a value outside [24, 255] is refused by name."""
    from microscale.attention import op

    c = _filled("nvfp4", False, 0.5, 1, [40], gen)
    q = torch.randn(1, 8, 32, generator=gen).to(torch.bfloat16)
    seen, kern = _recorded_launches(monkeypatch, lambda fn, kw: (fn, kw.get("maxnreg")))
    monkeypatch.setattr(op, "_INTERPRET", False)
    for cap in (None, 168):
        decode_attention(q, c, 0, config=AttentionConfig(block_n=16, rows=16, num_splits=2, maxnreg=cap))
        assert seen == [(kern._paged_attn_kernel, cap), (kern._combine_kernel, None)], seen
        seen.clear()
    for bad in (0, 16, 300, 168.0, True):
        with pytest.raises(ValueError, match="maxnreg"):
            decode_attention(q, c, 0, config=AttentionConfig(block_n=16, rows=16, num_splits=2, maxnreg=bad))


def test_programmatic_launches_where_the_device_has_them(gen, monkeypatch):
    """On a device with programmatic dependent launch both kernels launch as dependents (``launch_pdl`` and the
    kernels' ``PDL``: each waits for the previous kernel before reading); ``AttentionConfig(pdl=False)``, a device
    without it and the interpreter launch them plainly."""
    from microscale.attention import op

    c = _filled("mxfp4", False, None, 1, [40], gen)
    q = torch.randn(1, 8, 32, generator=gen).to(torch.bfloat16)
    seen, kern = _recorded_launches(monkeypatch, lambda fn, kw: (fn, kw.get("launch_pdl", False), kw["PDL"]))
    for interp, capable, on, want in ((False, True, True, True), (False, True, False, False),
                                      (False, False, True, False), (True, True, True, False)):
        monkeypatch.setattr(op, "_INTERPRET", interp)
        with target.override(pdl=capable):
            decode_attention(q, c, 0, config=AttentionConfig(block_n=16, rows=16, num_splits=2, pdl=on))
        assert seen == [(kern._paged_attn_kernel, want, want), (kern._combine_kernel, want, want)], seen
        seen.clear()


def test_splits_cover_keys_appended_after_the_split_count_was_fixed(gen, monkeypatch):
    """A decode call captured in a CUDA graph keeps its split count; replayed after the cache grew, every key
    must still be read: the kernel sizes each split from the device length. Emulated here by a host length
    (what the split count comes from) older than the device's."""
    c = PagedKVCache("nvfp4", num_layers=1, num_kv_heads=2, head_dim=32, num_pages=40, page_size=16, max_seqs=1,
                     global_scale=0.5)
    for n in (40, 300):
        c.append(0, torch.randn(n, 2, 32, generator=gen) * 2, torch.randn(n, 2, 32, generator=gen), seqs=[0])
    q = torch.randn(1, 8, 32, generator=gen)
    want = attention_reference(q, c, 0, dtype=torch.float64)
    monkeypatch.setattr(c, "lengths", lambda layer: [40])  # 2 splits of 32 keys: 64 of the 340 keys
    got = decode_attention(q, c, 0, config=AttentionConfig(block_n=32, rows=16, num_splits=2))
    assert _rel(got, want) < 1e-2


def test_cpu_without_interpreter_runs_the_reference(gen):
    c = _filled("mxfp4", False, None, 2, [5], gen)
    q = torch.randn(1, 4, 32, generator=gen)
    with target.override(interpreting=False):
        got = decode_attention(q, c, 0)
    assert torch.equal(got, attention_reference(q, c, 0))


def _poison_before(c, seq, upto):
    """NaN block scales for the K and V of tokens ``0 .. upto-1`` of ``seq`` (read, they would make the output NaN)."""
    pos = torch.arange(upto)
    slots = c.page_table[seq].long()[pos // c.page_size] * c.page_size + pos % c.page_size
    nan = {torch.uint8: 0xFF, torch.float8_e4m3fn: 0x7F}  # E8M0 / UE4M3 NaN bytes
    for sc in (c.k_scales[0], c.v_scales[0]):
        if sc.dtype in nan:
            sc.view(torch.uint8).view(-1, c.num_kv_heads, sc.shape[-1])[slots] = nan[sc.dtype]
        else:
            sc.view(-1, c.num_kv_heads, sc.shape[-1])[slots] = float("nan")


@pytest.mark.parametrize("fmt,per_token,gs", [("nvfp4", False, 0.02), ("fp8_e4m3_fp32", True, None),
                                              ("mxfp4", False, None)])
@pytest.mark.parametrize("window,lens", [(7, [37, 3, 50]), (1, [18, 9]), (21, [64, 5])])
def test_decode_window_skips_the_keys_before_it(fmt, per_token, gs, window, lens, gen):
    """Window starts mid-page, short sequences whose later splits are empty, and the pages before each
    window's first key block poisoned with NaN scales: the kernel never reads them."""
    c = _filled(fmt, per_token, gs, 2, lens, gen)
    q = torch.randn(len(lens), 8, 32, generator=gen)
    want = attention_reference(q, c, 0, sliding_window=window, dtype=torch.float64)
    block_n = 16
    for s, n in enumerate(lens):
        _poison_before(c, s, max(0, n - window) // block_n * block_n)
    got = decode_attention(q, c, 0, sliding_window=window,
                           config=AttentionConfig(block_n=block_n, rows=16, num_splits=3))
    assert _rel(got, want) < 1e-2


def test_extend_window_tiles_skip_earlier_keys(gen):
    """Prefill of 24 tokens with a window of 6 in query tiles of 4: each tile's splits start at its own
    window; the keys before the first tile's window are poisoned and never read."""
    c = _filled("nvfp4", False, 0.02, 2, [24, 23], gen)
    q_lens = [24, 5]
    q = torch.randn(sum(q_lens), 8, 32, generator=gen)
    want = attention_reference(q, c, 0, q_lens=q_lens, sliding_window=6, dtype=torch.float64)
    _poison_before(c, 1, (23 - 5 - 6 + 1) // 16 * 16)  # (no key of sequence 1 before 13 is visible)
    got = extend_attention(q, c, 0, q_lens, sliding_window=6, config=AttentionConfig(block_n=16, rows=16, num_splits=2))
    assert _rel(got, want) < 1e-2


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the interpreter's numpy meets the NaN)
@pytest.mark.parametrize("fmt,per_token,gs", KV_FORMATS[:4])
def test_decode_nan_blocks_as_the_reference(fmt, per_token, gs, gen):
    """A NaN in K or V: the cache's block scale is NaN, and the word-wide decode (which does not test
    codes for NaN) gives NaN exactly where the reference does."""
    c = PagedKVCache(fmt, num_layers=1, num_kv_heads=2, head_dim=32, num_pages=8, page_size=4, max_seqs=2,
                     per_token=per_token, global_scale=gs)
    k, v = torch.randn(2, 9, 2, 32, generator=gen), torch.randn(2, 9, 2, 32, generator=gen)
    k[0, 3, 1, 5] = float("nan")  # sequence 0, kv head 1: every logit of its queries
    v[1, 6, 0, 20] = float("nan")  # sequence 1, kv head 0: the output columns of that block
    c.append(0, k, v)
    q = torch.randn(2, 8, 32, generator=gen)
    got = decode_attention(q, c, 0, config=AttentionConfig(block_n=16, rows=16, num_splits=2))
    want = attention_reference(q, c, 0, dtype=torch.float64)
    assert torch.isnan(want).any() and torch.equal(torch.isnan(got), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert float((got.double()[ok] - want[ok]).norm() / want[ok].norm()) < 1e-2
