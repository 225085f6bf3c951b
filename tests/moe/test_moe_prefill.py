"""The MoE prefill path (the linear op's warp-specialized Gluon prefill with an expert axis): its activation
gather under the interpreter, its refusals and routing switch on CPU, its sm_90 compile (no spills, the linear
kernel's K loop), and on a Hopper every epilogue against the float64 reference."""
import os
import sys
from pathlib import Path

import pytest
import torch

import microscale as ms
from microscale.moe import moe_experts_reference, op, prepare_experts, tuning
from microscale.moe.grouped import route
from microscale.moe.prefill import PrefillConfig, choose_prefill_config, prefill_reason, prefill_run, prefill_takes
from microscale.moe.reference import grouped_linear_reference, swiglu

from test_moe_ops import offsets_of, rel  # noqa: E402  (the MoE tests' helpers)

INTERP = os.environ.get("TRITON_INTERPRET", "0") == "1"
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="needs a CUDA GPU (Hopper)")


@pytest.mark.skipif(not INTERP, reason="kernels run on CPU only under TRITON_INTERPRET=1")
@pytest.mark.parametrize("cb", [4, 8])
def test_gathered_xperm_is_xperm_of_the_gathered_rows(cb, gen):
    """The K permutation with the routing gather equals the plain one applied to x[rows // div] (the plain
    one's order: tests/kernels/test_prefill_gluon.py), ragged row counts included."""
    from microscale.linear._kernels import _prefill_gluon as pg
    from microscale.runtime.launch import cdiv

    t, k, div = 7, 192, 3
    x = torch.randn(t, k, generator=gen).bfloat16()
    rows = torch.randint(0, t * div, (20,), generator=gen, dtype=torch.int32)
    got = torch.empty(rows.numel(), k, dtype=x.dtype)
    pg._xperm_kernel[(cdiv(rows.numel(), 8), k // 64)](x, got, rows.numel(), x.stride(0), K=k, BLOCK_R=8, CB=cb,
                                                        rows_ptr=rows, gather_div=div, GATHER=True)
    xg = x[rows.long() // div].contiguous()
    want = torch.empty_like(xg)
    pg._xperm_kernel[(cdiv(xg.shape[0], 8), k // 64)](xg, want, xg.shape[0], xg.stride(0), K=k, BLOCK_R=8, CB=cb)
    assert torch.equal(got, want) and not torch.equal(got, xg)


def test_reasons_and_switch(gen, monkeypatch):
    """Refusals name the missing piece; the route takes the path at the stated rows per expert (128 by default;
    None switches it off), for E2M1 experts on a Hopper."""
    from microscale.linear._compile_cases import _dev
    from microscale.runtime import target

    mx = prepare_experts(ms.quantize(torch.randn(4, 128, 256, generator=gen), "mxfp4"))
    f8 = prepare_experts(ms.quantize(torch.randn(4, 128, 256, generator=gen), "mxfp8_e4m3"))
    x = torch.randn(512, 256, generator=gen).bfloat16()
    assert "E2M1" in prefill_reason(f8, x)
    assert "Hopper" in prefill_reason(mx, x)
    assert "bfloat16" in prefill_reason(mx, x.half())
    dx = _dev(x)
    with target.override(capability=(9, 0)):
        assert prefill_reason(mx, dx) is None
        # on by default from 128 rows an expert (4 experts: 512 rows take it, 256 do not)
        assert tuning.PREFILL_WS_MIN_PER_EXPERT == 128
        assert prefill_takes(mx, dx, 512) and not prefill_takes(mx, dx, 256) and not prefill_takes(f8, dx, 512)
        monkeypatch.setattr(tuning, "PREFILL_WS_MIN_PER_EXPERT", 64)
        assert prefill_takes(mx, dx, 256) and not prefill_takes(mx, dx, 128)
        monkeypatch.setattr(tuning, "PREFILL_WS_MIN_PER_EXPERT", None)  # (switched off)
        assert not prefill_takes(mx, dx, 4096)
    with pytest.raises(ValueError, match="prefill path needs a Hopper"):
        prefill_run(x, mx, offsets_of([128, 128, 128, 128]))
    with target.override(capability=(9, 0)):
        with pytest.raises(ValueError, match="block_t 64 or 128"):
            prefill_run(dx, mx, offsets_of([128, 128, 128, 128]), config=PrefillConfig(block_t=256))
    assert choose_prefill_config(40).block_t == 64 and choose_prefill_config(500).block_t == 128


@pytest.mark.parametrize("mode", ["plain", "act", "scatter"])
def test_compiles_for_sm90_without_spills(mode, tmp_path, run_tool):
    """Compiled as launched (MXFP4 experts, 128-row tiles): no spills, no serialized wgmma, and the K loop of the
    linear op's prefill_ws (bf16 wgmma from the decoded registers, no shared-memory round trip of the weights)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from sass import loop_counts

    r = run_tool("gemv_ptx.py", str(tmp_path), "--moe", mode, "--fmt", "mxfp4", "--m", "512", "--n", "256", "--k",
                 "1024", "--sass")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "0 bytes spill stores" in r.stdout and "C7512" not in r.stdout, r.stdout[-2000:]
    sass = (tmp_path / "_moe_prefill_ws_kernel.sass").read_text()
    k_loop = min((lp for lp in loop_counts(sass) if lp["hist"].get("HGMMA", 0)), key=lambda lp: lp["count"])
    assert "HGMMA.64x128x16.F32.BF16" in sass and k_loop["hist"].get("LDSM", 0) == 0, k_loop


def _experts(fmt, e, n, k, gen, device):
    q = ms.quantize(torch.randn(e, n, k, generator=gen) * 0.5, fmt)
    return q, prepare_experts(q.to(device))


@needs_hopper
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("counts", [[130, 0, 7, 300], [0, 0, 512, 0], [1, 64, 65, 129]])
@pytest.mark.parametrize("block_t", [64, 128])
def test_gpu_plain_grouped_rows(fmt, counts, block_t, gen):
    """grouped_linear's contract: every expert's rows (zero-token experts, all rows on one expert, ragged tiles)
    vs float64, bias per expert, N not a multiple of the tile; poisoned output rows fully written."""
    e, n, k = 4, 320, 1024
    q, pe = _experts(fmt, e, n, k, gen, "cuda")
    offs = offsets_of(counts)
    x = torch.randn(int(offs[-1]), k, generator=gen).bfloat16()
    b = torch.randn(e, n, generator=gen)
    out = torch.full((x.shape[0], n), float("nan"), dtype=torch.bfloat16, device="cuda")
    prefill_run(x.cuda(), pe, offs.cuda(), b.cuda(), config=PrefillConfig(block_t=block_t), out=out)
    want = grouped_linear_reference(x.double(), q.dequantize(torch.float64), offs, b.double())
    assert not out.isnan().any() and rel(out.cpu(), want) < 1e-2


@needs_hopper
@pytest.mark.parametrize("layout,activation", [("concat", "swiglu"), ("interleaved", "swiglu_clamped")])
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_gpu_epilogues(layout, activation, fmt, gen):
    """The gathered gate/up GEMM with its activation and the down GEMM with the weighted un-sort, vs float64."""
    e, i, h, t, top = 8, 192, 512, 300, 2
    gu, pgu = _experts(fmt, e, 2 * i, h, gen, "cuda")
    dn, pdn = _experts(fmt, e, h, i, gen, "cuda")
    idx = torch.stack([torch.randperm(e, generator=gen)[:top] for _ in range(t)])
    perm, offs, te, tb = route(idx.cuda(), e, 128)
    x = torch.randn(t, h, generator=gen).bfloat16()
    b1 = torch.randn(e, 2 * i, generator=gen)
    a, lim = (1.702, 7.0) if activation == "swiglu_clamped" else (None, None)
    hout = prefill_run(x.cuda(), pgu, offs, b1.cuda(), rows=perm, gather_div=top, tiles=(te, tb),
                       act=(activation, a, lim, layout))
    p = perm.long().cpu()
    want = swiglu(grouped_linear_reference(x.double()[p // top], gu.dequantize(torch.float64), offs.cpu(),
                                           b1.double()), activation, a, lim, layout)
    assert rel(hout.cpu(), want) < 1e-2
    w = torch.rand(t * top, generator=gen)
    y = prefill_run(hout, pdn, offs, rows=perm, tiles=(te, tb), scatter=w.cuda())
    yr = grouped_linear_reference(hout.cpu().double(), dn.dequantize(torch.float64), offs.cpu())
    want = torch.empty_like(yr)
    want[p] = yr * w.double()[p][:, None]
    assert y.dtype == torch.float32 and rel(y.cpu(), want) < 1e-2


@needs_hopper
def test_gpu_experts_forward_switched_on(gen, monkeypatch):
    """moe_experts with the path switched on (gpt-oss-like: interleaved, clamped, biases; E=32 top-4) equals the
    float64 reference, and the grouped kernel's result within the same allowance."""
    monkeypatch.setattr(tuning, "PREFILL_WS_MIN_PER_EXPERT", 16)
    e, h, i, t, top = 32, 512, 256, 512, 4
    gu = ms.quantize(torch.randn(e, 2 * i, h, generator=gen) * 0.5, "mxfp4")
    dn = ms.quantize(torch.randn(e, h, i, generator=gen) * 0.5, "mxfp4")
    x = torch.randn(t, h, generator=gen).bfloat16()
    idx = torch.stack([torch.randperm(e, generator=gen)[:top] for _ in range(t)])
    w = torch.softmax(torch.randn(t, top, generator=gen), -1)
    b1, b2 = torch.randn(e, 2 * i, generator=gen), torch.randn(e, h, generator=gen)
    ref = moe_experts_reference(x.double(), gu.dequantize(torch.float64), dn.dequantize(torch.float64), idx,
                                w.double(), activation="swiglu_clamped", gate_up_bias=b1.double(),
                                down_bias=b2.double(), alpha=1.702, limit=7.0, layout="interleaved")
    args = (x.cuda(), prepare_experts(gu.to("cuda")), prepare_experts(dn.to("cuda")), idx.cuda(), w.cuda(), b1.cuda(),
            b2.cuda(), "swiglu_clamped", 1.702, 7.0, "interleaved")
    assert prefill_takes(args[1], args[0], t * top)
    y = op._experts_forward(*args)
    assert rel(y.cpu(), ref) < 1e-2
    monkeypatch.setattr(tuning, "PREFILL_WS_MIN_PER_EXPERT", None)
    assert rel(y.cpu(), op._experts_forward(*args).cpu().double()) < 1e-2
