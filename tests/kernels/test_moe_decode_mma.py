"""The MoE decode path (``moe.decode``) without a GPU.

Its arithmetic is the linear op's ``gemv_mma`` PTX, which the Triton interpreter cannot run; as in
``test_gemv_mma.py`` the generated PTX runs in the emulator (``Warp``), driven by a Python mirror
of ``_decode_mma_kernel``'s per-lane addressing with its expert axis: tile map, routing gather,
K ranges past the row (clamped words, zeroed activations), K split, and the activation and
scatter epilogues; compared with float64 math. The GPU check runs the kernel itself
(``benchmarks/run_gpu_families.py --only moe``).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import microscale as ms
from microscale.linear._kernels import _gemv_mma as mk
from microscale.linear.backends.gemv_mma import split_words
from microscale.moe import decode, prepare_experts
from microscale.moe.grouped import max_tiles, route, tile_map
from microscale.moe.reference import grouped_linear_reference, swiglu
from microscale.runtime.launch import cdiv
from test_gemv_mma import Warp  # noqa: E402  (the PTX emulator)


def _row(base, half, n, act, concat):
    if act:
        h = np.minimum(base, n // 2 - 1)
        return h + half * (n // 2) if concat else 2 * h + half
    return np.minimum(base + 8 * half, n - 1)


def emulate(x, pe, offsets, c: decode.DecodeConfig, rows=None, gather_div=1, act=None, scatter=None, bias=None):
    """``_decode_mma_kernel``'s schedule, one warp at a time; returns float64 ``out``."""
    e, n, k = pe.e, pe.n, pe.k
    kw, wpg = k // 8, pe.fmt.block_size // 8
    rg, wpl, nw, split = c.row_groups, c.words_per_lane, c.num_warps, c.split_k
    step = 4 * wpl
    per = split_words(kw, split, wpl)  # (the host's rule)
    even = per * split == kw
    sk, ke, post = pe.mma
    codes = pe.words.contiguous().view(torch.uint8).numpy().reshape(-1)
    sb = pe.wscales.contiguous().numpy().reshape(-1)
    xb = x.contiguous().view(torch.uint8).numpy().reshape(-1)
    mem = np.concatenate([codes, sb, xb, np.zeros(64, np.uint8)])
    w0, s0, x0 = 0, codes.size, codes.size + sb.size
    lasm, lcons, _ = mk.load_asm(rg, wpl, 0, wpl // wpg)
    xasm, xcons, _ = mk.load_asm(0, wpl, 1, 0, 16)
    sasm, scons = mk.step_asm(rg, wpl, 1, wpg, sk)
    r_all = rows.numel() if rows is not None else x.shape[0]
    te, tb = tile_map(offsets, 8, max_tiles(r_all, e, 8))
    offs = offsets.tolist()
    rws = rows.numpy().astype(np.int64) if rows is not None else None
    gather = rows is not None and scatter is None
    out = np.full((r_all, n // 2 if act else n), np.nan)
    warp = Warp(mem)
    g, t = warp.g, warp.t
    scale = 2.0 ** post * (float(pe.global_scale.reshape(-1)[0]) if pe.global_scale is not None else 1.0)
    grid_n = cdiv(n // 2, 8 * rg * nw) if act else cdiv(n, 16 * rg * nw)
    for ti in range(te.numel()):
        ex = int(te[ti])
        if ex >= e:
            continue
        row0, row_end = offs[ex] + int(tb[ti]) * 8, offs[ex + 1]
        for pid_n in range(grid_n):
            for wi in range(nw):
                base = pid_n * 8 * rg * nw + wi * 8 * rg + g if act else pid_n * 16 * rg * nw + wi * 16 * rg + g
                total = None
                for pid_k in range(split):
                    k0 = pid_k * per + t * wpl
                    wrows = [_row(base + (8 if act else 16) * (r // 2), r % 2, n, act, act and act[3] == "concat")
                             for r in range(2 * rg)]
                    ws = [w0 + (ex * n + wr) * kw * 4 + k0 * 4 for wr in wrows]
                    ss = [s0 + (ex * n + wr) * (kw // wpg) + k0 // wpg for wr in wrows]
                    xr = np.minimum(row0 + g, row_end - 1)
                    src = rws[xr] // gather_div if gather else xr
                    xs = x0 + src * (k * 2) + k0 * 16
                    last_w = kw - wpl - k0
                    accs = [np.zeros(32) for _ in range(4 * rg)]
                    for i in range(0, per, step):
                        off = np.full(32, i) if even else np.minimum(i, last_w)
                        d = warp.run(lasm, lcons, [a + off * 4 for a in ws] + [a + off // wpg for a in ss])
                        dx = warp.run(xasm, xcons, [xs + off * 16])
                        if not even:
                            dx = [np.where(k0 + i < kw, v, 0).astype(np.uint32) for v in dx]
                        extra = [np.full(32, ke)] if sk == mk.SK_E8M0 else []
                        accs = warp.run(sasm, scons, d + dx + accs + extra)
                    # (the kernel sums the splits' fp32 partials in split order)
                    total = accs if total is None else [np.float32(a) + np.float32(b) for a, b in zip(total, accs)]
                for ri in range(rg):
                    for ci in range(4):
                        gr = row0 + 2 * t + ci % 2
                        if act:
                            if ci >= 2:
                                continue
                            col = base + 8 * ri
                            ok = (gr < row_end) & (col < n // 2)
                            gate = total[ri * 4 + ci] * scale
                            up = total[ri * 4 + ci + 2] * scale
                            if bias is not None:
                                b = bias[ex].double().numpy()
                                gate = gate + b[_row(col, 0, n, act, act[3] == "concat")]
                                up = up + b[_row(col, 1, n, act, act[3] == "concat")]
                            h = swiglu(torch.from_numpy(np.concatenate([gate[:, None], up[:, None]], 1)), act[0],
                                       act[1], act[2], "concat").numpy()[:, 0]
                            out[gr[ok], col[ok]] = h[ok]
                        else:
                            wr = base + 16 * ri + 8 * (ci // 2)
                            ok = (gr < row_end) & (wr < n)
                            v = total[ri * 4 + ci] * scale
                            if bias is not None:
                                v = v + bias[ex].double().numpy()[np.minimum(wr, n - 1)]
                            if scatter is not None:
                                p = rws[np.minimum(gr, r_all - 1)]
                                v = v * scatter.double().numpy()[p]
                                out[p[ok], wr[ok]] = v[ok]
                            else:
                                out[gr[ok], wr[ok]] = v[ok]
    return out


def _offsets(counts):
    o = torch.zeros(len(counts) + 1, dtype=torch.int32)
    o[1:] = torch.cumsum(torch.tensor(counts), 0)
    return o


def _close(got, want, cond):
    assert not np.isnan(got).any()
    err = np.abs(got - want)
    assert (err <= 2.0 ** -18 * cond + 1e-30).all(), float((err / (cond + 1e-30)).max())


@pytest.mark.parametrize("fmt,k,counts,cfg,bias", [
    ("mxfp4", 320, [2, 0, 11], decode.DecodeConfig(2, 8, 2, 1), False),  # K past the step; two tiles of one expert
    ("nvfp4", 512, [1, 3, 0, 2], decode.DecodeConfig(2, 8, 2, 2), True),  # K split, even
    ("mxfp4", 448, [4, 1], decode.DecodeConfig(1, 8, 1, 2), True),  # the second K range partly past the row
])
def test_decode_ptx_grouped_rows_match_float64(fmt, k, counts, cfg, bias, gen):
    n = 40  # a partial row group
    q = ms.quantize(torch.randn(len(counts), n, k, generator=gen), fmt)
    pe = prepare_experts(q)
    assert pe.mma is not None
    offs = _offsets(counts)
    x = (torch.randn(sum(counts), k, generator=gen) * 2).bfloat16()
    b = torch.randn(len(counts), n, generator=gen) if bias else None
    got = emulate(x, pe, offs, cfg, bias=b)
    wd = q.dequantize(torch.float64)
    want = grouped_linear_reference(x.double(), wd, offs, None if b is None else b.double()).numpy()
    cond = grouped_linear_reference(x.double().abs(), wd.abs(), offs, None if b is None else b.double().abs())
    _close(got, want, cond.numpy())


@pytest.mark.parametrize("layout,activation,fmt", [("interleaved", "swiglu_clamped", "mxfp4"),
                                                   ("concat", "swiglu", "nvfp4")])
def test_decode_ptx_experts_epilogues(layout, activation, fmt, gen):
    """Gate/up with the routing gather and the activation, then down with the routing weight and
    the un-sort (K = 320 / 192: ranges past the row), vs float64."""
    e, i, h, t, top = 4, 64, 320, 3, 2
    gu = ms.quantize(torch.randn(e, 2 * i, h, generator=gen), fmt)
    idx = torch.stack([torch.randperm(e, generator=gen)[:top] for _ in range(t)])
    perm, offs, te, tb = route(idx, e, 8)
    x = (torch.randn(t, h, generator=gen) * 2).bfloat16()
    b1 = torch.randn(e, 2 * i, generator=gen)
    a, lim = (1.702, 7.0) if activation == "swiglu_clamped" else (None, None)
    act = (activation, a, lim, layout)
    hk = emulate(x, prepare_experts(gu), offs, decode.DecodeConfig(2, 8, 1, 2), rows=perm, gather_div=top, act=act,
                 bias=b1)
    xg = x.double()[perm.long() // top]
    pre = grouped_linear_reference(xg, gu.dequantize(torch.float64), offs, b1.double())
    want = swiglu(pre, activation, a, lim, layout).numpy()
    cond = grouped_linear_reference(xg.abs(), gu.dequantize(torch.float64).abs(), offs, b1.double().abs()).numpy()
    cond = np.concatenate([cond[:, 0::2], cond[:, 1::2]], 1) if layout == "interleaved" else cond
    cond = (cond[:, :i] + cond[:, i:] + 1.0) * 8.0  # (the activation's slope is below 8 here)
    _close(hk, want, cond)
    # the down GEMM on the bf16 activations the gate/up GEMM stored: K = 64, one partial step
    hb = torch.from_numpy(hk).to(torch.bfloat16)
    dn = ms.quantize(torch.randn(e, 64, i, generator=gen), fmt)
    w = torch.rand(t * top, generator=gen)
    y = emulate(hb, prepare_experts(dn), offs, decode.DecodeConfig(2, 8, 2, 1), rows=perm, scatter=w)
    wd = dn.dequantize(torch.float64)
    p = perm.long().numpy()
    want = np.empty((t * top, 64))
    want[p] = (grouped_linear_reference(hb.double(), wd, offs) * w.double()[perm.long()][:, None]).numpy()
    cond = np.empty_like(want)
    cond[p] = grouped_linear_reference(hb.double().abs(), wd.abs(), offs).numpy()
    _close(y, want, cond)


def test_decode_view_and_eligibility(gen):
    """E2M1 experts carry the decode view (the QTensor's own bytes); other formats and K not a
    multiple of 64 do not; the config splits K until ~6 warps per SM stream the touched experts; a split
    that would leave a K range empty is refused."""
    from microscale.runtime import target

    q = ms.quantize(torch.randn(3, 64, 2880, generator=gen), "mxfp4")
    pe = prepare_experts(q)
    assert pe.mma is not None and pe.words.data_ptr() == q.data.data_ptr()
    assert tuple(pe.words.shape) == (3, 64, 360) and tuple(pe.wscales.shape) == (3, 64, 90)
    assert prepare_experts(ms.quantize(torch.randn(2, 64, 256, generator=gen), "mxfp8_e4m3")).mma is None
    assert prepare_experts(ms.quantize(torch.randn(2, 64, 96, generator=gen), "nvfp4")).mma is None
    assert not decode.decode_eligible(pe, torch.zeros(4, 2880, dtype=torch.bfloat16), 4)  # (CPU tensors)
    small = prepare_experts(ms.quantize(torch.randn(2, 16, 192, generator=gen), "mxfp4"))
    with pytest.raises(ValueError, match="does not split into 2 ranges"):  # 24 words: the second range empty
        decode.decode_run(torch.randn(1, 192).to(torch.bfloat16), small, torch.tensor([0, 1, 1], dtype=torch.int32),
                          config=decode.DecodeConfig(1, 8, 1, 2))
    with target.override(num_sms=132):
        c = decode.choose_decode_config(4, 32, 5760, 2880, torch.device("cpu"))
        assert (5760 // 32) * 4 * c.split_k >= 6 * 132 and c.split_k <= 16
        assert decode.choose_decode_config(4, 32, 5760, 128, torch.device("cpu")).split_k == 1
