"""The paged KV cache: codes written by append are bit-identical to ms.quantize of the same
K/V (ragged sequences, page boundaries, decode steps), bookkeeping and errors."""
import os

import pytest
import torch

import microscale as ms
from microscale.attention import PagedKVCache
from microscale.runtime import target

#: (preset, per_token, global_scale): fp8 per token, MX formats, NVFP4 two-level, int with group scales
KV_FORMATS = [("fp8_e4m3_fp32", True, None), ("mxfp8_e4m3", False, None), ("nvfp4", False, 0.02),
              ("mxfp4", False, None), ("int8_fp16", False, None), ("int4_fp16", False, None),
              ("int4_affine_g32", False, None)]


#: the kernel path on CPU tensors needs the interpreter (a GPU machine compiles the kernels for CUDA tensors)
INTERP = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _cache(fmt, per_token, gs, **kw):
    args = dict(num_layers=2, num_kv_heads=2, head_dim=64, num_pages=12, page_size=4, max_seqs=3)
    args.update(kw)
    return PagedKVCache(fmt, per_token=per_token, global_scale=gs, **args)


@pytest.mark.parametrize("fmt,per_token,gs,kernel", [f + (True,) for f in KV_FORMATS] +
                         [KV_FORMATS[0] + (False,), KV_FORMATS[2] + (False,), KV_FORMATS[6] + (False,)])
def test_append_codes_match_quantize(fmt, per_token, gs, kernel, gen):
    """``kernel``: the quantize kernel writes K and V into their slots in one launch (the interpreter here);
    else the reference quantize and a scatter (a CPU without the interpreter). Slots no token was
    appended to stay zero."""
    if kernel and not INTERP:
        pytest.skip("the kernel path on CPU tensors runs under TRITON_INTERPRET=1 (the CUDA variant is below)")
    c = _cache(fmt, per_token, gs)
    with target.override(interpreting=kernel):
        assert c._kernel_append() is kernel
        _append_and_check(c, gs, gen)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt,per_token,gs", KV_FORMATS)
def test_gpu_append_codes_match_quantize(fmt, per_token, gs, gen):
    """The fused append on CUDA: the bytes in the pages equal the CPU reference quantize's."""
    c = _cache(fmt, per_token, gs, device="cuda")
    assert c._kernel_append()
    _append_and_check(c, gs, gen)


def _append_and_check(c, gs, gen):
    ks = {s: [] for s in range(3)}
    vs = {s: [] for s in range(3)}
    for s, n in ((0, 5), (1, 1), (2, 9), (0, 3)):  # ragged prefill chunks crossing page boundaries
        k, v = torch.randn(n, 2, 64, generator=gen) * 3, torch.randn(n, 2, 64, generator=gen)
        c.append(1, k.to(c.device), v.to(c.device), seqs=[s])
        ks[s].append(k)
        vs[s].append(v)
    for _ in range(2):  # decode steps: one token for every sequence
        k, v = torch.randn(3, 1, 2, 64, generator=gen), torch.randn(3, 1, 2, 64, generator=gen)
        c.append(1, k.to(c.device), v.to(c.device))
        for s in range(3):
            ks[s].append(k[s])
            vs[s].append(v[s])
    assert c.lengths(1) == [10, 3, 11] and c.lengths(0) == [0, 0, 0]
    assert c.seq_lens[1].tolist() == [10, 3, 11]
    for s in range(3):
        for which, parts in (("k", ks[s]), ("v", vs[s])):
            got = c.gather(1, s, which).to("cpu")
            want = ms.quantize(torch.cat(parts), c.fmt, global_scale=gs)
            assert torch.equal(got.data, want.data), (fmt, s, which)
            assert torch.equal(got.scales.view(torch.uint8), want.scales.view(torch.uint8)), (fmt, s, which)
            if want.zero_points is not None:
                assert torch.equal(got.zero_points, want.zero_points)
            if gs is not None:
                assert float(got.global_scale) == float(want.global_scale)
    used = torch.zeros(c.num_pages * c.page_size, dtype=torch.bool)
    for s in range(3):
        pos = torch.arange(c.lengths(1)[s])
        used[torch.tensor(c._pages[s])[pos // c.page_size] * c.page_size + pos % c.page_size] = True
    for pool in (c._codes, c._scales) + ((c._zps,) if c._zps is not None else ()):
        pool = [t.cpu() for t in pool]
        raw = pool[1].view(torch.uint8) if pool[1].element_size() == 1 else pool[1]
        assert not raw.reshape(2, -1, *raw.shape[3:])[:, ~used].any()  # nothing written outside the slots
        assert not pool[0].view(torch.uint8).any() if pool[0].element_size() == 1 else not pool[0].any()


def test_pages_are_shared_and_returned(gen):
    c = _cache("mxfp4", False, None, num_pages=4, page_size=4, max_seqs=2)
    c.append(0, torch.randn(8, 2, 64, generator=gen), torch.randn(8, 2, 64, generator=gen), seqs=[0])
    c.append(0, torch.randn(5, 2, 64, generator=gen), torch.randn(5, 2, 64, generator=gen), seqs=[1])
    pages = c.page_table[:, :2].flatten().tolist()
    assert sorted(pages) == [0, 1, 2, 3]  # every page used once
    with pytest.raises(ValueError, match="out of pages"):
        c.append(0, torch.randn(4, 2, 64), torch.randn(4, 2, 64), seqs=[1])
    c.reset(0)
    assert c.lengths(0) == [0, 5]
    c.append(0, torch.randn(4, 2, 64), torch.randn(4, 2, 64), seqs=[1])  # the freed pages serve sequence 1
    assert c.lengths(0) == [0, 9]


@pytest.mark.parametrize("kernel", [True, False])
def test_empty_append_is_a_no_op(kernel):
    c = _cache("nvfp4", False, 0.02)
    with target.override(interpreting=kernel):
        c.append(0, torch.zeros(0, 2, 64), torch.zeros(0, 2, 64), seqs=[1])
        c.append(0, torch.zeros(3, 0, 2, 64), torch.zeros(3, 0, 2, 64))
    assert c.lengths(0) == [0, 0, 0] and not c._codes[0].any()


def test_nbytes_per_token():
    c = _cache("nvfp4", False, None)
    assert c.nbytes_per_token == 2 * 2 * (32 + 4)  # K+V, 2 heads, 64 nibbles + 4 ue4m3 scales
    c = _cache("fp8_e4m3_fp32", True, None)
    assert c.nbytes_per_token == 2 * 2 * (64 + 4)


def test_errors():
    with pytest.raises(ValueError, match="not a multiple"):
        PagedKVCache("mxfp4", num_layers=1, num_kv_heads=1, head_dim=48, num_pages=1)
    with pytest.raises(ValueError, match="global_scale applies only"):
        PagedKVCache("mxfp4", num_layers=1, num_kv_heads=1, head_dim=64, num_pages=1, global_scale=2.0)
    with pytest.raises(NotImplementedError, match="6-bit"):
        PagedKVCache("mxfp6_e2m3", num_layers=1, num_kv_heads=1, head_dim=64, num_pages=1)
    c = _cache("mxfp4", False, None, max_pages_per_seq=2)
    with pytest.raises(ValueError, match=r"k has shape"):
        c.append(0, torch.randn(3, 4, 64), torch.randn(3, 4, 64), seqs=[0])
    with pytest.raises(ValueError, match="max_pages_per_seq"):
        c.append(0, torch.randn(9, 2, 64), torch.randn(9, 2, 64), seqs=[0])
    with pytest.raises(ValueError, match="layer=2"):
        c.append(2, torch.randn(1, 2, 64), torch.randn(1, 2, 64), seqs=[0])
    with pytest.raises(ValueError, match="seqs=\\[one sequence\\]"):
        c.append(0, torch.randn(1, 2, 64), torch.randn(1, 2, 64))
    with pytest.raises(TypeError, match="v has dtype torch.int32"):
        c.append(0, torch.randn(1, 2, 64), torch.ones(1, 2, 64, dtype=torch.int32), seqs=[0])
    assert c.lengths(0) == [0, 0, 0]  # nothing half-written by the refused calls
    assert c._pages == [[], [], []]  # and no page reserved


@pytest.mark.parametrize("kernel", [True, False])
def test_float64_beyond_float32_is_stored_as_quantize_stores_it(kernel, gen):
    """float64 K/V are fitted to float32 as ms.quantize fits them (saturated), on both append paths."""
    if kernel and not INTERP:
        pytest.skip("the kernel path on CPU tensors runs under TRITON_INTERPRET=1")
    c = _cache("mxfp8_e4m3", False, None)
    k = torch.randn(3, 2, 64, generator=gen, dtype=torch.float64)
    k[0, 0, 0], k[1, 1, 5] = 1e39, -1e300
    v = torch.randn(3, 2, 64, generator=gen, dtype=torch.float64)
    with target.override(interpreting=kernel):
        c.append(0, k, v, seqs=[0])
    want, got = ms.quantize(k, "mxfp8_e4m3"), c.gather(0, 0, "k")
    assert torch.equal(got.data, want.data) and torch.equal(got.scales, want.scales)


@pytest.mark.skipif(not INTERP, reason="the kernel path on CPU tensors runs under TRITON_INTERPRET=1")
def test_quantize_into_rows_refuses_what_would_corrupt_memory(gen):
    from microscale.formats import get_format
    from microscale.quant.quantize import quantize_into_rows

    fmt = get_format("int4_affine_g32")
    x = torch.randn(2, 64, generator=gen)
    data, sc, zp = torch.zeros(4, 32, dtype=torch.uint8), torch.zeros(4, 2, dtype=fmt.scale.storage), \
        torch.zeros(4, 2, dtype=torch.uint8)
    rows = torch.tensor([0, 3])
    with target.override(interpreting=True):
        with pytest.raises(ValueError, match="int4_affine_g32 needs zero_points"):
            quantize_into_rows(x, fmt, None, rows, data, sc, None)
        with pytest.raises(IndexError, match=r"rows span \[0, 9\]; data has 4 rows"):
            quantize_into_rows(x, fmt, None, torch.tensor([0, 9]), data, sc, zp)
        with pytest.raises(TypeError, match="data has dtype torch.int8"):
            quantize_into_rows(x, fmt, None, rows, data.view(torch.int8), sc, zp)
        with pytest.raises(TypeError, match="x has dtype torch.int32"):
            quantize_into_rows(x.to(torch.int32), fmt, None, rows, data, sc, zp)
        assert not data.any() and not zp.any()  # nothing written by the refused calls
        quantize_into_rows(x, fmt, None, rows, data, sc, zp)
    q = ms.quantize(x, fmt)
    assert torch.equal(data[[0, 3]], q.data) and torch.equal(zp[[0, 3]], q.zero_points) and not data[1:3].any()
