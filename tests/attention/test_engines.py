"""Engine fp8 KV pages (vLLM / FlashInfer / SGLang layouts) to and from PagedKVCache: lossless import (bytes and
decoded values), shared prefix blocks copied, lossless round trip, attention over imported pages, lossy export
only when asked, and refusals."""
import pytest
import torch

from microscale.attention import PagedKVCache, attention_reference
from microscale.attention.engines import from_engine_fp8, to_engine_fp8


def _engine(gen, layout="vllm", fp8="e4m3", layers=2, blocks=12, page=4, heads=2, dim=32, lens=(7, 0, 9)):
    """vLLM-style pages: codes of k / k_scale (k_scale = amax / 448, as a calibrated scale), a block table of
    distinct blocks padded with 0 (as engines pad), and the decoded values each sequence should read back."""
    dt = torch.float8_e4m3fn if fp8 == "e4m3" else torch.float8_e5m2
    top = 448.0 if fp8 == "e4m3" else 57344.0
    perm = torch.randperm(blocks, generator=gen).tolist()
    table = torch.zeros(len(lens), 4, dtype=torch.int32)
    used = 0
    for s, n in enumerate(lens):
        need = -(-n // page)
        table[s, :need] = torch.tensor(perm[used:used + need], dtype=torch.int32)
        used += need
    caches, ks, vs, want = [], [], [], []
    for _ in range(layers):
        vals = torch.randn(2, blocks, page, heads, dim, generator=gen) * 3
        scales = [float(vals[i].abs().max()) / top for i in range(2)]
        codes = torch.stack([(vals[i] / scales[i]).to(dt) for i in range(2)])
        decoded = torch.stack([codes[i].float() * scales[i] for i in range(2)])
        t = codes.view(torch.uint8)
        caches.append(t if layout == "vllm" else t.transpose(0, 1).contiguous())
        ks.append(torch.tensor(scales[0]))
        vs.append(scales[1])
        per = []
        for s, n in enumerate(lens):
            pos = torch.arange(n)
            pages = table[s].long()[pos // page]
            per.append((decoded[0][pages, pos % page], decoded[1][pages, pos % page]))
        want.append(per)
    return caches, ks, vs, table, list(lens), want


@pytest.mark.parametrize("layout,fp8", [("vllm", "e4m3"), ("flashinfer", "e4m3"), ("vllm", "e5m2")])
def test_import_is_lossless_and_round_trips(layout, fp8, gen):
    caches, ks, vs, table, lens, want = _engine(gen, layout, fp8)
    cache = from_engine_fp8(caches, ks, vs, table, lens, layout=layout, fp8=fp8)
    assert cache.lengths(0) == lens and cache.lengths(1) == lens
    for layer in range(2):
        for s, n in enumerate(lens):
            k, v = cache.dequantize(layer, s)
            assert torch.equal(k, want[layer][s][0]) and torch.equal(v, want[layer][s][1])
    back = to_engine_fp8(cache, layout=layout, fp8=fp8)
    assert back.lossless and back.seq_lens.tolist() == lens
    for layer in range(2):
        assert torch.equal(back.kv_caches[layer], caches[layer])
        f32 = lambda x: float(torch.tensor(float(x), dtype=torch.float32))  # noqa: E731 (scales are float32)
        assert back.k_scales[layer] == f32(ks[layer]) and back.v_scales[layer] == f32(vs[layer])
    assert back.block_table[1].tolist() == [-1] * 4 and back.block_table[0, 2:].tolist() == [-1, -1]
    # appending after the import takes free pages only (the engine's blocks stay with their sequences)
    before = {int(b) for b in cache.page_table.flatten() if b >= 0}
    cache.append(0, torch.randn(1, 5, 2, 32, generator=gen), torch.randn(1, 5, 2, 32, generator=gen), seqs=[1])
    new = {int(b) for b in cache.page_table[1] if b >= 0}
    assert new and not new & before


def test_attention_over_imported_pages(gen):
    """The reference attention over the imported cache equals float64 attention over the engine's decoded K/V."""
    caches, ks, vs, table, lens, want = _engine(gen, lens=(7, 3, 9))
    cache = from_engine_fp8(caches, ks, vs, table, lens)
    q = torch.randn(3, 4, 32, generator=gen)
    out = attention_reference(q, cache, 1, dtype=torch.float64)
    for s in range(3):
        k, v = (t.double() for t in want[1][s])
        kk, vv = k.repeat_interleave(2, 1).transpose(0, 1), v.repeat_interleave(2, 1).transpose(0, 1)
        p = torch.softmax(q[s].double()[:, None] @ kk.transpose(1, 2) / 32 ** 0.5, -1)
        assert torch.allclose(out[s], (p @ vv)[:, 0], rtol=1e-10, atol=1e-12)


def test_export_requantizes_only_when_asked(gen):
    cache = PagedKVCache("nvfp4", num_layers=1, num_kv_heads=2, head_dim=32, num_pages=8, page_size=4, max_seqs=2)
    k, v = torch.randn(2, 6, 2, 32, generator=gen), torch.randn(2, 6, 2, 32, generator=gen)
    cache.append(0, k, v)
    with pytest.raises(ValueError, match="allow_lossy=True"):
        to_engine_fp8(cache)
    e = to_engine_fp8(cache, allow_lossy=True, dtype=torch.float8_e4m3fn)
    assert not e.lossless and e.kv_caches[0].dtype == torch.float8_e4m3fn
    for s in range(2):
        ref_k, ref_v = cache.dequantize(0, s)
        pos = torch.arange(6)
        pages = e.block_table[s].long()[pos // 4]
        got_k = e.kv_caches[0][0][pages, pos % 4].float() * e.k_scales[0]
        got_v = e.kv_caches[0][1][pages, pos % 4].float() * e.v_scales[0]
        for got, ref in ((got_k, ref_k), (got_v, ref_v)):
            assert ((got - ref).norm() / ref.norm()) < 0.05  # (E4M3: 3 mantissa bits, one scale a layer)
    # a per-token fp8 cache with its own scales per token is not one-scale-a-layer either
    pt = PagedKVCache("fp8_e4m3_fp32", per_token=True, num_layers=1, num_kv_heads=2, head_dim=32, num_pages=8,
                      page_size=4, max_seqs=1)
    pt.append(0, k[:1], v[:1])
    with pytest.raises(ValueError, match="lossy"):
        to_engine_fp8(pt)


def test_refusals(gen):
    caches, ks, vs, table, lens, _ = _engine(gen)
    bad = table.clone()
    bad[0, 0] = 99
    with pytest.raises(ValueError, match="block 99, outside"):
        from_engine_fp8(caches, ks, vs, bad, lens)
    with pytest.raises(ValueError, match="one of each per layer"):
        from_engine_fp8(caches, ks[:1], vs, table, lens)
    with pytest.raises(ValueError, match="axis 1"):
        from_engine_fp8(caches, ks, vs, table, lens, layout="flashinfer")
    with pytest.raises(ValueError, match="finite and > 0"):
        from_engine_fp8(caches, [0.0, 1.0], vs, table, lens)
    with pytest.raises(ValueError, match="holds 4 blocks"):
        from_engine_fp8(caches, ks, vs, table, [7, 0, 99])
    with pytest.raises(ValueError, match="layout="):
        from_engine_fp8(caches, ks, vs, table, lens, layout="tgi")
    cache = from_engine_fp8(caches, ks, vs, table, lens)
    cache.append(1, torch.randn(1, 2, 32, generator=gen), torch.randn(1, 2, 32, generator=gen), seqs=[0])
    with pytest.raises(ValueError, match="one length per sequence"):
        to_engine_fp8(cache)


def test_shared_prefix_blocks_are_copied(gen):
    """Prefix caching: a block two sequences share stays with the first and is copied for the second into a block
    no sequence uses; both read the engine's values; with no block free the import says so."""
    caches, ks, vs, table, lens, _ = _engine(gen, lens=(7, 0, 9))
    table[2, 0] = table[0, 0]  # sequence 2's first block is sequence 0's (the same prefix)
    cache = from_engine_fp8(caches, ks, vs, table, lens)
    rows = [cache.page_table[s, :n].tolist() for s, n in ((0, 2), (2, 3))]
    assert rows[0][0] == int(table[0, 0]) and rows[1][0] != rows[0][0] and rows[1][1:] == table[2, 1:3].tolist()
    assert rows[1][0] not in table[0, :2].tolist() + table[2, :3].tolist()
    for s in (0, 2):
        k, _ = cache.dequantize(0, s)
        pos = torch.arange(lens[s])
        blocks = table[s].long()[pos // 4]
        want = caches[0][0][blocks, pos % 4].view(torch.float8_e4m3fn).float() * float(ks[0])
        assert torch.equal(k, want)
    small = [c[:, :5].contiguous() for c in caches]  # 5 blocks: all of them in use, none free for the copy
    t5 = torch.tensor([[0, 1, 0, 0], [2, 0, 0, 0], [0, 3, 4, 0]], dtype=torch.int32)
    with pytest.raises(ValueError, match="no block is free"):
        from_engine_fp8(small, ks, vs, t5, [7, 3, 9])


def test_sglang_token_pool_round_trip(gen):
    """SGLang's token pool: per layer a K and a V buffer [slots, heads, dim] and req_to_token (a slot per token)."""
    slots, heads, dim, lens = 40, 2, 32, [5, 11]
    perm = torch.randperm(slots, generator=gen)
    req_to_token = torch.zeros(2, 16, dtype=torch.int32)
    req_to_token[0, :5], req_to_token[1, :11] = perm[:5], perm[5:16]
    bufs, ks = [], []
    for _ in range(2):
        vals = torch.randn(2, slots, heads, dim, generator=gen)
        ks.append(float(vals.abs().max()) / 448)
        bufs.append(tuple((vals[i] / ks[-1]).to(torch.float8_e4m3fn) for i in range(2)))
    cache = from_engine_fp8(bufs, ks, ks, req_to_token, lens, layout="sglang")
    assert cache.page_size == 1
    k, v = cache.dequantize(1, 1)
    f32 = float(torch.tensor(ks[1], dtype=torch.float32))
    assert torch.equal(k, bufs[1][0][perm[5:16].long()].float() * f32)
    back = to_engine_fp8(cache, layout="sglang", dtype=torch.float8_e4m3fn)
    assert back.lossless and all(torch.equal(back.kv_caches[layer][i].view(torch.uint8), bufs[layer][i].view(torch.uint8))
                                 for layer in range(2) for i in range(2))
    assert back.block_table[0, :5].tolist() == perm[:5].tolist() and back.block_table[0, 5:].eq(-1).all()
    with pytest.raises(ValueError, match="k_buffer, v_buffer"):
        from_engine_fp8([bufs[0][0]], ks[:1], ks[:1], req_to_token, lens, layout="sglang")
