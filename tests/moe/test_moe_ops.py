"""The MoE ops: the references vs float64 math, the grouped Triton kernel (interpreter on CPU)
vs the float64 reference, the composed experts forward, the custom ops and their errors."""
import pytest
import torch

import microscale as ms
from microscale.moe import moe_experts_reference, op, prepare_experts
from microscale.moe import grouped, tuning
from microscale.moe.grouped import grouped_run, max_tiles, route, tile_map
from microscale.moe.reference import grouped_linear_reference, swiglu
from microscale.moe.tuning import GroupedConfig, choose_config

KDEV = "cuda" if torch.cuda.is_available() else "cpu"  # (kernels: the GPU, else the interpreter on CPU)
FORMATS = ["nvfp4", "mxfp4", "mxfp8_e4m3", "mxfp6_e3m2", "int4_affine_g32", "fp8_e4m3_block128x128", "int8_fp16"]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def dev(*ts):
    """The tensors and QTensors on KDEV, where the kernels run (anything else, packed experts or None, as is:
    packed experts are made from a QTensor already there)."""
    out = tuple(t.to(KDEV) if isinstance(t, (torch.Tensor, ms.QTensor)) else t for t in ts)
    return out if len(out) > 1 else out[0]


def offsets_of(counts):
    o = torch.zeros(len(counts) + 1, dtype=torch.int32)
    o[1:] = torch.cumsum(torch.tensor(counts), 0)
    return o


def test_experts_qtensor_is_per_expert_quantization(gen):
    """A 3-D QTensor [E, N, K] holds each expert quantized along K exactly as its 2-D slice
    (formats without a per-tensor scale; nvfp4's global scale is one for the whole tensor)."""
    w = torch.randn(3, 32, 64, generator=gen)
    for fmt in ("mxfp4", "mxfp8_e4m3", "int4_affine_g32"):
        q = ms.quantize(w, fmt)
        for e in range(3):
            qe = ms.quantize(w[e], fmt)
            assert torch.equal(q.data[e], qe.data) and torch.equal(q.scales[e].view(torch.uint8),
                                                                   qe.scales.view(torch.uint8))
            assert torch.equal(q.dequantize()[e], qe.dequantize())


def test_references_match_per_token_math(gen):
    e, h, i, t, k = 4, 8, 6, 5, 2
    wgu = torch.randn(e, 2 * i, h, generator=gen, dtype=torch.float64)
    wd = torch.randn(e, h, i, generator=gen, dtype=torch.float64)
    b1 = torch.randn(e, 2 * i, generator=gen, dtype=torch.float64)
    b2 = torch.randn(e, h, generator=gen, dtype=torch.float64)
    x = torch.randn(t, h, generator=gen, dtype=torch.float64) * 3
    idx = torch.randint(0, e, (t, k), generator=gen)
    wt = torch.rand(t, k, generator=gen, dtype=torch.float64)
    got = moe_experts_reference(x, wgu, wd, idx, wt, activation="swiglu_clamped", gate_up_bias=b1, down_bias=b2,
                                alpha=1.702, limit=7.0, layout="interleaved")
    want = torch.zeros(t, h, dtype=torch.float64)
    for a in range(t):
        for j in range(k):
            ex = int(idx[a, j])
            g = (wgu[ex] @ x[a] + b1[ex])
            gate, up = g[0::2].clamp(max=7.0), g[1::2].clamp(-7.0, 7.0)  # transformers' GptOssExperts
            want[a] += wt[a, j] * (wd[ex] @ ((up + 1) * gate * torch.sigmoid(gate * 1.702)) + b2[ex])
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    h2 = torch.randn(3, 2 * i, generator=gen, dtype=torch.float64)
    assert torch.allclose(swiglu(h2), torch.nn.functional.silu(h2[:, :i]) * h2[:, i:])
    offs = offsets_of([2, 0, 3, 0])
    y = grouped_linear_reference(x, wgu, offs, b1)
    assert torch.allclose(y[2:5], x[2:5] @ wgu[2].T + b1[2])


@pytest.mark.parametrize("fmt", FORMATS)
def test_grouped_kernel_formats(fmt, gen):
    """Ragged groups with empty experts, bias, poisoned output: every row written, < 1e-2."""
    e, n, k = 4, 128, 256
    q = ms.quantize(torch.randn(e, n, k, generator=gen), fmt)
    counts = [3, 0, 9, 1]
    offs = offsets_of(counts)
    x = torch.randn(sum(counts), k, generator=gen).bfloat16()
    bias = torch.randn(e, n, generator=gen)
    ref = grouped_linear_reference(x.double(), q.dequantize(torch.float64), offs, bias.double())
    out = torch.full((x.shape[0], n), float("nan"), dtype=torch.bfloat16, device=KDEV)
    grouped_run(*dev(x, prepare_experts(dev(q)), offs, bias), out=out)
    assert not out.isnan().any()
    assert rel(out.cpu(), ref) < 1e-2


@pytest.mark.parametrize("fmt,cfg", [
    ("mxfp4", GroupedConfig(block_n=64, block_m=16, block_kw=64, split_k=1, pair=True)),
    ("nvfp4", GroupedConfig(block_n=64, block_m=32, block_kw=64, num_warps=8)),
    ("mxfp8_e4m3", GroupedConfig(block_n=64, block_m=16, block_kw=128, split_k=2)),
    ("int4_affine_g32", GroupedConfig(block_n=64, block_m=16, block_kw=64, split_k=1))])
def test_grouped_kernel_ragged_k_steps(fmt, cfg, gen):
    """K steps that do not divide a row's packed words (K = 768: 96 words of 4-bit codes, 192 of
    8-bit): the last step of each K range is partial, and every row still equals the float64
    reference (poisoned output, empty experts)."""
    e, n, k = 3, 64, 768
    q = ms.quantize(torch.randn(e, n, k, generator=gen), fmt)
    pe = prepare_experts(dev(q))
    assert pe.codes.shape[2] % cfg.block_kw
    offs = offsets_of([2, 0, 19])
    x = torch.randn(21, k, generator=gen).bfloat16()
    out = torch.full((21, n), float("nan"), dtype=torch.bfloat16, device=KDEV)
    grouped_run(*dev(x, pe, offs), config=cfg, out=out)
    assert not out.isnan().any()
    assert rel(out.cpu(), grouped_linear_reference(x.double(), q.dequantize(torch.float64), offs)) < 1e-2


@pytest.mark.parametrize("case", ["one_expert", "t1", "split_k", "prefill_tiles", "gather"])
def test_grouped_kernel_routes(case, gen):
    e, n, k = 6, 64, 256
    q = ms.quantize(torch.randn(e, n, k, generator=gen), "nvfp4")
    pe = prepare_experts(dev(q))
    counts = {"one_expert": [0, 0, 0, 37, 0, 0], "t1": [0, 1, 0, 0, 0, 0], "split_k": [2, 0, 5, 0, 0, 1],
              "prefill_tiles": [33, 0, 40, 1, 0, 0], "gather": [4, 0, 2, 0, 3, 0]}[case]
    cfg = {"split_k": GroupedConfig(block_n=64, block_m=16, block_kw=8, split_k=3),
           "prefill_tiles": GroupedConfig(block_n=64, block_m=32, block_kw=8, num_warps=8)}.get(case)
    offs = offsets_of(counts)
    r = sum(counts)
    x = torch.randn(r if case != "gather" else 4, k, generator=gen).bfloat16()
    rows = torch.randint(0, x.shape[0], (r,), generator=gen, dtype=torch.int32) if case == "gather" else None
    xg = x[rows.long()] if rows is not None else x
    ref = grouped_linear_reference(xg.double(), q.dequantize(torch.float64), offs)
    out = torch.full((r, n), float("nan"), dtype=torch.bfloat16, device=KDEV)
    grouped_run(*dev(x, pe, offs), rows=dev(rows), config=cfg, out=out)
    assert not out.isnan().any()
    assert rel(out.cpu(), ref) < 1e-2


def test_tile_map_covers_every_row_once():
    offs = offsets_of([0, 5, 16, 0, 17, 1])
    te, tb = tile_map(offs, 16, 4 + 6)
    seen = []
    for s in range(te.numel()):
        ex = int(te[s])
        if ex < 6:
            a = int(offs[ex]) + 16 * int(tb[s])
            assert a < int(offs[ex + 1])
            seen += list(range(a, min(a + 16, int(offs[ex + 1]))))
    assert sorted(seen) == list(range(39))


@pytest.mark.parametrize("t,top,e,bm", [(1, 4, 32, 16), (5, 4, 16, 16), (60, 8, 128, 16), (200, 4, 8, 64),
                                        (3, 2, 3, 16)])
@pytest.mark.parametrize("kernel", [True, False])
def test_route_matches_stable_sort(t, top, e, bm, kernel, gen, monkeypatch):
    """The routing (the one-program kernel, and the torch path above its size limit) vs a stable
    argsort, the counts and :func:`tile_map`."""
    if not kernel:
        monkeypatch.setattr(grouped, "ROUTE_KERNEL_MAX_ROWS", 0)
    idx = torch.randint(0, e, (t, top), generator=gen)
    idx[0, 0] = e - 1  # the last expert in use
    perm, offs, te, tb = (t_.cpu() for t_ in route(dev(idx), e, bm))
    flat = idx.reshape(-1)
    assert torch.equal(perm.long(), torch.argsort(flat, stable=True))
    assert torch.equal(offs, offsets_of(torch.bincount(flat, minlength=e).tolist()))
    rte, rtb = tile_map(offs, bm, max_tiles(flat.numel(), e, bm))
    assert torch.equal(te, rte) and torch.equal(tb[te < e], rtb[te < e])


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_pair_decode_equals_element_decode(fmt, gen):
    """The bf16x2 pair decode and the per-element decode give the same products (both exact):
    bit-identical outputs."""
    q = ms.quantize(torch.randn(3, 64, 512, generator=gen), fmt)
    pe = prepare_experts(dev(q))
    assert grouped.pair_eligible(pe, torch.bfloat16) and not grouped.pair_eligible(pe, torch.float16)
    offs = offsets_of([2, 0, 5])
    x = torch.randn(7, 512, generator=gen).bfloat16()
    outs = [grouped_run(*dev(x, pe, offs), config=GroupedConfig(block_n=64, block_m=16, block_kw=16, split_k=2,
                                                                 pair=p)).cpu()
            for p in (True, False)]
    assert torch.equal(outs[0], outs[1])
    assert rel(outs[0], grouped_linear_reference(x.double(), q.dequantize(torch.float64), offs)) < 1e-2


@pytest.mark.parametrize("layout,activation,pair", [("concat", "swiglu", True), ("interleaved", "swiglu_clamped", True),
                                                    ("concat", "swiglu_clamped", False)])
def test_grouped_epilogues(layout, activation, pair, gen):
    """The gate/up epilogue's activation and the down epilogue's weighted un-sort, with a K split,
    vs float64; poisoned outputs fully written (every row the routing uses)."""
    e, i, h, t, top = 4, 48, 512, 6, 2
    gu = ms.quantize(torch.randn(e, 2 * i, h, generator=gen), "mxfp4" if pair else "mxfp8_e4m3")
    pgu = prepare_experts(dev(gu))
    idx = torch.stack([torch.randperm(e, generator=gen)[:top] for _ in range(t)])
    perm, offs, te, tb = route(dev(idx), e, 16)
    x = torch.randn(t, h, generator=gen).bfloat16() * 2
    b1 = torch.randn(e, 2 * i, generator=gen)
    a, lim = (1.702, 7.0) if activation == "swiglu_clamped" else (None, None)
    cfg = GroupedConfig(block_n=64, block_m=16, block_kw=16, split_k=3, pair=pair)
    hout = torch.full((t * top, i), float("nan"), dtype=torch.bfloat16, device=KDEV)
    grouped_run(*dev(x, pgu, offs, b1), rows=perm, config=cfg, out=hout, gather_div=top, tiles=(te, tb),
                act=(activation, a, lim, layout))
    perm, offs, hout = perm.cpu(), offs.cpu(), hout.cpu()
    xg = x.double()[perm.long() // top]
    want = swiglu(grouped_linear_reference(xg, gu.dequantize(torch.float64), offs, b1.double()), activation, a, lim,
                  layout)
    assert not hout.isnan().any() and rel(hout, want) < 1e-2
    dn = ms.quantize(torch.randn(e, 64, i, generator=gen), "nvfp4")
    w = torch.rand(t * top, generator=gen)
    y = torch.full((t * top, 64), float("nan"), device=KDEV)
    grouped_run(*dev(hout, prepare_experts(dev(dn)), offs), rows=dev(perm), out=y, scatter=dev(w),
                config=GroupedConfig(block_n=64, block_m=16, block_kw=8, split_k=2))
    y = y.cpu()
    yr = grouped_linear_reference(hout.double(), dn.dequantize(torch.float64), offs)
    want = torch.empty_like(yr)
    want[perm.long()] = yr * w.double()[perm.long()][:, None]
    assert not y.isnan().any() and rel(y, want) < 1e-2


def test_decode_split_fills_the_sms():
    """At 1-8 tokens of a gpt-oss-20b-sized layer, N tiles x touched experts x K splits give at
    least two programs per SM (132 SMs)."""
    from microscale.runtime import target

    with target.override(num_sms=132):
        for t in (1, 2, 4, 8):
            for n, kw in ((5760, 384), (2880, 384)):
                c = choose_config(4 * t, 32, n, kw, 4, torch.device("cpu"), True)
                touched = min(4 * t, int(tuning.expected_touched(4 * t, 32)))
                assert c.block_m == 16 and c.pair
                assert (n // c.block_n) * touched * c.split_k >= 2 * 132, (t, n, c)


def test_choose_config_buckets():
    cpu = torch.device("cpu")
    assert choose_config(8, 128, 2880, 384, 4, cpu).block_m == 16
    assert choose_config(4096 * 4, 128, 2880, 384, 4, cpu).block_m == 128


@pytest.mark.parametrize("layout,activation,bias", [("concat", "swiglu", False),
                                                    ("interleaved", "swiglu_clamped", True)])
def test_experts_forward_kernel_path(layout, activation, bias, gen):
    """The composed CUDA forward (run by the interpreter on CPU) vs float64; E=128 top-8."""
    e, h, i, t, top = (128, 64, 32, 6, 8) if bias else (16, 64, 32, 5, 4)
    gu = ms.quantize(torch.randn(e, 2 * i, h, generator=gen), "mxfp4")
    dn = ms.quantize(torch.randn(e, h, i, generator=gen), "nvfp4")
    x = torch.randn(t, h, generator=gen).bfloat16()
    idx = torch.stack([torch.randperm(e, generator=gen)[:top] for _ in range(t)])
    w = torch.softmax(torch.randn(t, top, generator=gen), -1)
    b1 = torch.randn(e, 2 * i, generator=gen) if bias else None
    b2 = torch.randn(e, h, generator=gen) if bias else None
    a, lim = (1.702, 7.0) if activation == "swiglu_clamped" else (None, None)
    d = lambda v: None if v is None else v.double()  # noqa: E731
    ref = moe_experts_reference(x.double(), gu.dequantize(torch.float64), dn.dequantize(torch.float64), idx,
                                w.double(), activation=activation, gate_up_bias=d(b1), down_bias=d(b2), alpha=a,
                                limit=lim, layout=layout)
    y = op._experts_forward(*dev(x, prepare_experts(dev(gu)), prepare_experts(dev(dn)), idx, w, b1, b2), activation, a,
                            lim, layout)
    assert y.dtype == torch.bfloat16 and rel(y.cpu(), ref) < 1e-2


def _small_moe(e: int, h: int, i: int, t: int, gen) -> tuple:
    """MXFP4 gate/up [e, 2i, h] and down [e, h, i] experts, bf16 x [t, h], top-2 ids and weights."""
    gu = ms.quantize(torch.randn(e, 2 * i, h, generator=gen), "mxfp4")
    dn = ms.quantize(torch.randn(e, h, i, generator=gen), "mxfp4")
    return (gu, dn, torch.randn(t, h, generator=gen).bfloat16(), torch.randint(0, e, (t, 2), generator=gen),
            torch.rand(t, 2, generator=gen))


def test_public_ops_cpu_and_compile(gen):
    e, h, i, t = 4, 64, 32, 5
    gu, dn, x, idx, w = _small_moe(e, h, i, t, gen)
    ref = moe_experts_reference(x.double(), gu.dequantize(torch.float64), dn.dequantize(torch.float64), idx,
                                w.double())
    y = ms.moe_experts(x, gu, dn, idx, w)
    assert rel(y, ref) < 1e-2
    pgu, pdn = prepare_experts(gu), prepare_experts(dn)
    f = torch.compile(lambda a: ms.moe_experts(a, pgu, pdn, idx, w), fullgraph=True, backend="eager")
    assert torch.equal(f(x), y)
    offs = offsets_of([1, 0, 4, 0])
    g = ms.grouped_linear(x, gu, offs)
    assert rel(g, grouped_linear_reference(x.double(), gu.dequantize(torch.float64), offs)) < 1e-2


def test_errors(gen):
    gu = ms.quantize(torch.randn(4, 64, 64, generator=gen), "mxfp4")
    dn = ms.quantize(torch.randn(4, 64, 32, generator=gen), "mxfp4")
    x = torch.randn(3, 64).bfloat16()
    idx = torch.zeros(3, 2, dtype=torch.int64)
    w = torch.ones(3, 2)
    with pytest.raises(ValueError, match="offsets"):
        ms.grouped_linear(x, gu, torch.tensor([0, 1, 1, 1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="offsets"):
        ms.grouped_linear(x, gu, torch.tensor([0, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"x must be \[T, 64\]"):
        ms.grouped_linear(x[:, :32], gu, torch.tensor([0, 3, 3, 3, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="3-D"):
        ms.grouped_linear(x, ms.quantize(torch.randn(64, 64), "mxfp4"), torch.tensor([0, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="activation='gelu'"):
        ms.moe_experts(x, gu, dn, idx, w, activation="gelu")
    with pytest.raises(ValueError, match="outside"):
        ms.moe_experts(x, gu, dn, idx + 4, w)
    with pytest.raises(ValueError, match="do not fit"):
        ms.moe_experts(x, gu, gu, idx, w)
    with pytest.raises(ValueError, match="swiglu_clamped"):
        ms.moe_experts(x, gu, dn, idx, w, alpha=1.0)



@pytest.mark.parametrize("top,h,dtype", [(1, 96, torch.bfloat16), (4, 2880, torch.bfloat16), (8, 130, torch.float16),
                                         (4, 64, torch.float32)])
def test_slot_sum_adds_slots_in_order(top, h, dtype, gen):
    """The experts forward's last launch: each token's slots added in slot order in fp32, then cast."""
    t = 5
    y = (torch.randn(t * top, h, generator=gen) * torch.logspace(-6, 6, h)).to(KDEV)
    want = y.view(t, top, h)[:, 0].clone()
    for j in range(1, top):
        want = want + y.view(t, top, h)[:, j]
    got = grouped.slot_sum(y, top, dtype)
    assert got.shape == (t, h) and got.dtype == dtype
    if dtype == torch.bfloat16 and KDEV == "cpu":  # (the interpreter's fp32 -> bf16 cast truncates: one ulp)
        assert torch.equal(got.float(), (want.view(torch.int32) & -65536).view(torch.float32))
    else:
        assert torch.equal(got.cpu(), want.to(dtype).cpu())
    assert grouped.slot_sum(y[:0], top, dtype).shape == (0, h)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (call plans are eager CUDA calls)")
@pytest.mark.parametrize("bias", [False, True])
def test_gpu_eager_replays_equal_unplanned_calls(bias, gen):
    """From the third eager decode call with the same shapes, ``moe_experts`` replays a call plan kept with the
    gate/up weight: each call's x, routing, weights and biases reach it, and its outputs equal those of the same
    calls with plans off, bit for bit; an in-place change of the down weight is not served by the old plan."""
    from microscale.linear import tuning as lt
    from microscale.linear.plans import Plan
    from microscale.linear.weight_state import state

    e, h, i, t, top = 16, 256, 128, 2, 4
    gu = ms.quantize(torch.randn(e, 2 * i, h, generator=gen), "mxfp4").to("cuda")
    dn = ms.quantize(torch.randn(e, h, i, generator=gen), "mxfp4").to("cuda")
    calls = []
    for _ in range(6):
        b1 = torch.randn(e, 2 * i, generator=gen).cuda() if bias else None
        b2 = torch.randn(e, h, generator=gen).cuda() if bias else None
        calls.append((torch.randn(t, h, generator=gen).bfloat16().cuda(),
                      torch.stack([torch.randperm(e, generator=gen)[:top] for _ in range(t)]).cuda(),
                      torch.softmax(torch.randn(t, top, generator=gen), -1).cuda(), b1, b2))
    kw = dict(activation="swiglu_clamped", layout="interleaved")
    got = [ms.moe_experts(x, gu, dn, idx, w, gate_up_bias=b1, down_bias=b2, **kw) for x, idx, w, b1, b2 in calls]
    assert any(type(p) is Plan for p in state(gu).plans.values())
    with lt.override(plans=False):
        want = [ms.moe_experts(x, gu, dn, idx, w, gate_up_bias=b1, down_bias=b2, **kw) for x, idx, w, b1, b2 in calls]
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    x, idx, w, b1, b2 = calls[0]
    d = lambda v: None if v is None else v.double().cpu()  # noqa: E731
    ref = moe_experts_reference(x.double().cpu(), gu.dequantize(torch.float64).cpu(), dn.dequantize(torch.float64).cpu(),
                                idx.cpu(), w.double().cpu(), gate_up_bias=d(b1), down_bias=d(b2), alpha=1.702,
                                limit=7.0, activation="swiglu_clamped", layout="interleaved")
    assert rel(got[0].cpu(), ref) < 1e-2
    dn.data.copy_(torch.roll(dn.data, 1, 0))  # (a new version of the down weight: a new key)
    for _ in range(3):
        after = ms.moe_experts(x, gu, dn, idx, w, gate_up_bias=b1, down_bias=b2, **kw)
    with lt.override(plans=False):
        assert torch.equal(after, ms.moe_experts(x, gu, dn, idx, w, gate_up_bias=b1, down_bias=b2, **kw))
    assert not torch.equal(after, got[0])


def test_plan_key_refuses_strided_inputs(gen, monkeypatch):
    """A call plan replays its launches' scalar arguments (a bias's row stride among them), so strided
    routing, weights or biases get no plan key; contiguous ones do, and the key follows ``w_down``'s version
    (CPU: ``plannable`` stood in)."""
    monkeypatch.setattr(op, "plannable", lambda x: True)
    monkeypatch.setattr(op._kl, "current_stream", lambda: 0)  # (no CUDA stream on the CPU)
    e, h, i, t = 4, 64, 32, 2
    gu, dn, x, idx, w = _small_moe(e, h, i, t, gen)
    b1, b2 = torch.randn(e, 2 * i + 8, generator=gen), torch.randn(e, h, generator=gen)

    def key(**kw):
        a = dict(idx=idx, weights=w, gu_bias=b1[:, :2 * i].contiguous(), dn_bias=b2)
        a.update(kw)
        return op._plan_key(x, gu, dn, a["idx"], a["weights"], a["gu_bias"], a["dn_bias"], "swiglu", None, None,
                            "concat")
    k0 = key()
    assert k0 is not None and key() == k0
    assert key(gu_bias=b1[:, :2 * i]) is None  # (the row stride of a column slice)
    assert key(idx=torch.randint(0, e, (t, 4), generator=gen)[:, ::2]) is None
    assert key(weights=torch.rand(2, t, generator=gen).T) is None
    dn.data.add_(0)  # (a new version of the down weight: a new key)
    assert key() not in (None, k0)


def test_route_reads_strided_ids(gen):
    """Expert ids given as a strided view (every other column of a wider tensor) route as their contiguous copy."""
    wide = torch.randint(0, 16, (5, 8), generator=gen)
    idx = wide[:, ::2]
    assert idx.reshape(-1).stride(0) == 2  # (a view, not a copy: what the kernel must not read as unit-stride)
    got = route(idx.to(KDEV), 16, 8)
    want = route(idx.contiguous().to(KDEV), 16, 8)
    for a, b in zip(got, want):
        assert torch.equal(a.cpu(), b.cpu())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (call plans are eager CUDA calls)")
def test_gpu_strided_biases_and_ids_equal_unplanned_calls(gen):
    """Biases sliced from wider tensors (row strides that change from call to call) and strided expert ids give
    the outputs of the same calls with plans off."""
    from microscale.linear import tuning as lt

    e, h, i, t, top = 16, 256, 128, 2, 4
    gu = ms.quantize(torch.randn(e, 2 * i, h, generator=gen), "mxfp4").to("cuda")
    dn = ms.quantize(torch.randn(e, h, i, generator=gen), "mxfp4").to("cuda")
    x = torch.randn(t, h, generator=gen).bfloat16().cuda()
    w = torch.softmax(torch.randn(t, top, generator=gen), -1).cuda()
    for pad in (16, 16, 16, 48, 80):
        b1 = torch.randn(e, 2 * i + pad, generator=gen).cuda()[:, :2 * i]
        wide = torch.stack([torch.randperm(e, generator=gen)[:2 * top] for _ in range(t)]).cuda()
        idx = wide[:, ::2]
        got = ms.moe_experts(x, gu, dn, idx, w, gate_up_bias=b1)
        with lt.override(plans=False):
            assert torch.equal(got, ms.moe_experts(x, gu, dn, idx.contiguous(), w, gate_up_bias=b1.contiguous()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (programmatic dependent launches)")
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("t", [1, 2, 8])
def test_gpu_decode_chain_as_dependent_launches(fmt, t):
    """The decode chain launched as programmatic dependents (the down GEMM started before gate/up is done, its
    split-K partials in the workspace gate/up used) equals the same chain launched plainly, bit for bit, eagerly,
    replayed in a CUDA graph and replayed as an eager call plan, at gpt-oss's width (K = 2880: split K and lanes
    past the row)."""
    from microscale.linear import tuning as lt

    g = torch.Generator(device="cuda").manual_seed(t)
    e, h, i, top = 32, 2880, 2880, 4
    gu = ms.quantize(torch.randn(e, 2 * i, h, generator=g, device="cuda") * 0.05, fmt)
    dn = ms.quantize(torch.randn(e, h, i, generator=g, device="cuda") * 0.05, fmt)
    x = torch.randn(t, h, generator=g, device="cuda").bfloat16()
    idx = torch.stack([torch.randperm(e, generator=g, device="cuda")[:top] for _ in range(t)])
    w = torch.softmax(torch.randn(t, top, generator=g, device="cuda"), -1)
    kw = dict(activation="swiglu_clamped", layout="interleaved", alpha=1.702, limit=7.0)
    with lt.override(plans=False):
        saved, tuning.DECODE_PDL = tuning.DECODE_PDL, False
        try:
            want = ms.moe_experts(x, gu, dn, idx, w, **kw)
        finally:
            tuning.DECODE_PDL = saved
        assert tuning.DECODE_PDL
        for _ in range(3):  # (back to back: each call's chain after the last one's)
            assert torch.equal(ms.moe_experts(x, gu, dn, idx, w, **kw), want)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            ms.moe_experts(x, gu, dn, idx, w, **kw)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ms.moe_experts(x, gu, dn, idx, w, **kw)
        for _ in range(3):
            out.zero_()
            graph.replay()
            assert torch.equal(out, want)
    for _ in range(4):  # (eager calls with plans on replay the recorded dependent launches from the third)
        assert torch.equal(ms.moe_experts(x, gu, dn, idx, w, **kw), want)
    from microscale.bench.cases_moe import _experts_f64  # (only the first token's experts, in float64)

    used = idx[0].cpu()
    ref = moe_experts_reference(x[:1].double().cpu(), _experts_f64(gu, used), _experts_f64(dn, used),
                                torch.arange(top)[None], w[:1].double().cpu(), **kw)
    assert rel(want[:1].cpu(), ref) < 1e-2
