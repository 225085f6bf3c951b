"""The fp8-codes kernel of ``scaled_mm(..., fast_accum=True)`` (fp8 block-128, MXFP8): vs the oracle
under the interpreter (exact sums there), its eligibility, and on a GPU within the stated allowance."""
from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

import microscale as ms
from microscale.formats import get_format
from microscale.linear.backends.scaled_fp8 import (Fp8Config, choose_fp8_config, fp8_codes_kind, scaled_fp8_launch,
                                                   scaled_fp8_reason, scaled_fp8_ws_reason)
from microscale.linear.scaled import prepare_operand
from microscale.reference_scaled import scaled_mm_reference

INTERP = os.environ.get("TRITON_INTERPRET", "0") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="kernels run on CPU only under TRITON_INTERPRET=1")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SMALL = Fp8Config(block_m=16, block_n=16, num_warps=1, num_stages=1, group_m=2)

PAIRS = [("fp8_e4m3_block128", "fp8_e4m3_block128x128"), ("mxfp8_e4m3", "mxfp8_e4m3"),
         ("mxfp8_e5m2", "mxfp8_e5m2"), ("fp8_e4m3_fp32", "fp8_e4m3_block128x128"), ("fp8_e4m3_fp16", "mxfp8_e4m3")]


def _q(name: str, rows: int, k: int, gen: torch.Generator, scale: float = 1.0, device: str = "cpu") -> ms.QTensor:
    return ms.quantize((torch.randn(rows, k, generator=gen) * scale).to(device), name, pad=True)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    return float((out - ref).norm() / ref.norm())


def test_which_formats_are_fp8_codes() -> None:
    """Exhaustive over the 256 codes: E4M3 and E5M2 8-bit elements are their fp8 bytes; others are not."""
    f = get_format
    assert fp8_codes_kind(f("fp8_e4m3_block128"), f("fp8_e4m3_block128x128")) == 1
    assert fp8_codes_kind(f("mxfp8_e5m2"), f("mxfp8_e5m2")) == 2
    assert fp8_codes_kind(f("mxfp8_e4m3"), f("mxfp8_e5m2")) == 0  # (one fp8 type per MMA here)
    assert fp8_codes_kind(f("mxfp8_e4m3"), f("mxfp4")) == 0
    assert fp8_codes_kind(f("mxint8"), f("mxint8")) == 0
    assert "one fp8 type" in scaled_fp8_reason(f("mxfp8_e4m3"), f("mxfp4"))
    assert scaled_fp8_reason(f("mxfp8_e4m3"), f("mxfp8_e4m3")) is None


def test_tiles_by_token_count() -> None:
    small, big = choose_fp8_config(1, 8192, 128, 132), choose_fp8_config(4096, 8192, 128, 132)
    assert (small.block_m, big.block_m) == (64, 128)
    assert 2 <= big.num_stages <= small.num_stages <= 5
    # 128 columns only where they still give every SM a tile
    assert (small.block_n, choose_fp8_config(16, 28672, 128, 132).block_n) == (64, 128)


@needs_interp
@pytest.mark.parametrize("tma", [True, False])
@pytest.mark.parametrize("fa,fb", PAIRS)
def test_kernel_equals_oracle(fa: str, fb: str, tma: bool) -> None:
    """Ragged M and N (not multiples of the tile), K not a multiple of the chunk, bias, grouped tile order
    over several row tiles; tiles through TMA descriptors (zero-filled past the ends) or pointer loads.
    The interpreter's sums are float32, so the bound is float32 ordering."""
    gen = torch.Generator().manual_seed(0)
    m, k = 37, 304
    n = 140 if "128x128" in fb else 21
    a, b = _q(fa, m, k, gen), _q(fb, n, k, gen, 0.25)
    bias = torch.randn(n, generator=gen)
    ref = scaled_mm_reference(a, b, bias, torch.float32)
    out = torch.full((m, n), float("nan"), dtype=torch.float32)  # poisoned: every element must be written
    scaled_fp8_launch(prepare_operand(a), prepare_operand(b), bias, torch.float32, replace(SMALL, tma=tma), out)
    assert _rel(out, ref) <= 1e-5


def _nan_operands() -> tuple[ms.QTensor, ms.QTensor]:
    """fp8 block-128 operands with an E4M3 NaN code in a's row 3 and a NaN block scale of b (rows 128..139,
    first 128 K)."""
    gen = torch.Generator().manual_seed(1)
    a, b = _q("fp8_e4m3_block128", 18, 256, gen), _q("fp8_e4m3_block128x128", 140, 256, gen)
    a.data[3, 7] = 0x7F  # E4M3 NaN
    b.scales[1, 0] = float("nan")
    return a, b


@needs_interp
def test_kernel_nan_scale() -> None:
    """A NaN fp32 block scale of the weight makes its 128 rows NaN for every token; the rest equals the
    oracle. (The interpreter converts fp8 NaN codes to numbers, so the NaN code is checked on a GPU.)"""
    a, b = _nan_operands()
    a.data[3, 7] = 0
    ref = scaled_mm_reference(a, b, None, torch.float32)
    out = scaled_fp8_launch(prepare_operand(a), prepare_operand(b), None, torch.float32, SMALL)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and bool(torch.isnan(ref[:, 128:]).all())
    fin = torch.isfinite(ref)
    assert _rel(out[fin], ref[fin]) <= 1e-5


@needs_gpu
def test_gpu_nan_code_and_scale() -> None:
    """On the GPU the MMA takes the E4M3 NaN code as NaN: row 3 and the NaN scale's rows are NaN, as in the
    oracle."""
    a, b = _nan_operands()
    ref = scaled_mm_reference(a, b, None, torch.float32)
    out = scaled_fp8_launch(prepare_operand(a.to("cuda")), prepare_operand(b.to("cuda")), None, torch.float32).cpu()
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and bool(torch.isnan(ref[3]).all())
    fin = torch.isfinite(ref)
    assert _rel(out[fin], ref[fin]) <= 5e-4


def test_kernel_refuses_other_formats() -> None:
    gen = torch.Generator().manual_seed(2)
    a, b = _q("mxfp8_e4m3", 4, 64, gen), _q("mxfp4", 8, 64, gen)
    with pytest.raises(ValueError, match="fp8 kernel needs both operands' codes"):
        scaled_fp8_launch(prepare_operand(a), prepare_operand(b), None, torch.float32)


def test_fast_accum_on_cpu_is_the_oracle() -> None:
    """CPU operands run the oracle with or without fast_accum (the allowance is the GPU's)."""
    gen = torch.Generator().manual_seed(3)
    a, b = _q("fp8_e4m3_block128", 5, 256, gen), _q("fp8_e4m3_block128x128", 130, 256, gen)
    ref = scaled_mm_reference(a, b, None, torch.bfloat16)
    assert torch.equal(ms.scaled_mm(a, b, fast_accum=True), ref)
    x = torch.randn(2, 256, generator=gen)
    assert torch.equal(ms.linear(x, b, act_format="fp8_e4m3_block128", fast_accum=True),
                       ms.linear(x, b, act_format="fp8_e4m3_block128"))


@needs_gpu
@pytest.mark.parametrize("m", [1, 70, 512])
@pytest.mark.parametrize("fa,fb", PAIRS[:3])
def test_gpu_fast_accum_within_allowance(m: int, fa: str, fb: str) -> None:
    """On the GPU the fp8 kernel lands within 5e-4 (relative, float32 output) of the exact oracle (Hopper's fp8
    MMA measured ~1.3e-4 at 128-element chunks, 4.5e-5 at 32), and fast_accum runs it where its rule says."""
    gen = torch.Generator().manual_seed(4)
    k, n = 1000, 300
    a, b = _q(fa, m, k, gen, device="cuda"), _q(fb, n, k, gen, 0.25, device="cuda")
    bias = torch.randn(n, generator=gen).cuda()
    ref = scaled_mm_reference(a.to("cpu"), b.to("cpu"), bias.cpu(), torch.float32)
    from microscale.linear.backends.scaled_fp8 import fast_accum_takes

    out = ms.scaled_mm(a, b, bias=bias, out_dtype=torch.float32, fast_accum=True)
    direct = scaled_fp8_launch(prepare_operand(a), prepare_operand(b), bias, torch.float32)
    assert _rel(direct, ref) <= 5e-4
    if fast_accum_takes(a.fmt, b.fmt, m):
        assert torch.equal(out, direct)
    else:  # (MXFP8: the exact kernels)
        assert _rel(out, ref) <= 1e-5


def test_quant_linear_carries_fast_accum(monkeypatch) -> None:
    """quantize_model(..., fast_accum=True) makes layers that pass the flag to linear; it survives a state_dict
    round trip; without act_format it is refused."""
    import sys

    from microscale.nn import QuantLinear, quantize_model

    model = torch.nn.Sequential(torch.nn.Linear(256, 128))
    qm = quantize_model(model, "fp8_e4m3_block128x128", act_format="fp8_e4m3_block128", fast_accum=True,
                        inplace=False)
    layer = qm[0]
    assert layer.fast_accum and "fast_accum=True" in repr(layer)
    seen = []
    msl = sys.modules["microscale.linear"]  # (the package; ``microscale.linear`` the attribute is the function)
    real = msl.linear
    monkeypatch.setattr(msl, "linear", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    x = torch.randn(3, 256)
    layer(x)
    assert seen and seen[-1]["fast_accum"] is True
    fresh = quantize_model(torch.nn.Sequential(torch.nn.Linear(256, 128)), "fp8_e4m3_block128x128",
                           act_format="fp8_e4m3_block128", inplace=False)
    assert not fresh[0].fast_accum
    fresh.load_state_dict(qm.state_dict())
    assert fresh[0].fast_accum
    with pytest.raises(ValueError, match="fast_accum=True needs act_format"):
        QuantLinear(256, 128, fmt="nvfp4", fast_accum=True)
    with pytest.raises(ValueError, match="quantize_model: fast_accum=True needs act_format"):
        quantize_model(torch.nn.Sequential(), "nvfp4", fast_accum=True)
    with pytest.raises(ValueError, match="fast_accum=True needs act_format"):
        ms.linear(x.bfloat16(), layer.qweight, fast_accum=True)


def test_fast_accum_route() -> None:
    """fp8 block-128 (float32 scales) takes the fp8 kernel at any M; MXFP8 (exact in bf16) keeps the exact
    kernels; pairs the kernel cannot take never go there."""
    from microscale.linear.backends.scaled_fp8 import fast_accum_takes

    f = get_format
    assert fast_accum_takes(f("fp8_e4m3_block128"), f("fp8_e4m3_block128x128"), 1)
    assert fast_accum_takes(f("fp8_e4m3_fp16"), f("fp8_e4m3_block128x128"), 4096)
    assert not fast_accum_takes(f("mxfp8_e4m3"), f("mxfp8_e4m3"), 4096)
    assert not fast_accum_takes(f("mxfp8_e4m3"), f("mxfp4"), 4096)


def test_custom_op_takes_fast_accum() -> None:
    """The registered op's schema carries fast_accum (opcheck: schema, fake kernel, autograd registration), and
    scaled_mm with fast_accum=True runs under torch.compile (eager backend; the operand's JSON meta is a graph
    break) to the same result."""
    gen = torch.Generator().manual_seed(5)
    a, b = _q("fp8_e4m3_block128", 4, 256, gen), _q("fp8_e4m3_block128x128", 130, 256, gen)
    oa, ob = prepare_operand(a), prepare_operand(b)
    args = (oa.codes, oa.scales, oa.global_scale, oa.zero_points, oa.meta, ob.codes, ob.scales, ob.global_scale,
            ob.zero_points, ob.meta, None, "float32", True)
    torch.library.opcheck(torch.ops.microscale.scaled_mm.default, args)
    f = torch.compile(lambda x, w: ms.scaled_mm(x, w, fast_accum=True), backend="eager")
    assert torch.equal(f(a, b), ms.scaled_mm(a, b, fast_accum=True))


@needs_gpu
def test_gpu_fast_accum_in_a_cuda_graph() -> None:
    """fast_accum at 1 and 256 rows (pointer loads, TMA descriptors) captured in a CUDA graph replays the eager
    result bit for bit."""
    gen = torch.Generator().manual_seed(6)
    b = _q("fp8_e4m3_block128x128", 384, 512, gen, device="cuda")
    for m in (1, 256):
        a = _q("fp8_e4m3_block128", m, 512, gen, device="cuda")
        want = ms.scaled_mm(a, b, fast_accum=True)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = ms.scaled_mm(a, b, fast_accum=True)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


def test_gluon_kernel_reasons() -> None:
    """The warp-specialized Gluon kernel takes 128-multiple K blocks on a Hopper, 16-byte code rows and its own
    tile shapes; each refusal says why, and the launcher refuses with it."""
    import dataclasses

    from microscale.linear._compile_cases import _dev
    from microscale.runtime import target

    gen = torch.Generator().manual_seed(7)
    a, b = _q("fp8_e4m3_block128", 4, 256, gen), _q("fp8_e4m3_block128x128", 130, 256, gen)
    oa, ob = prepare_operand(a), prepare_operand(b)
    assert "Hopper" in scaled_fp8_ws_reason(oa, ob)
    with pytest.raises(ValueError, match="fp8 kernel needs a Hopper"):
        scaled_fp8_launch(oa, ob, None, torch.float32, Fp8Config(128, 128, 4, 4, gluon=True))
    da, db = (dataclasses.replace(o, codes=_dev(o.codes)) for o in (oa, ob))
    with target.override(capability=(9, 0)):
        assert scaled_fp8_ws_reason(da, db) is None
        assert scaled_fp8_ws_reason(da, db, Fp8Config(128, 128, 4, 4, gluon=True)) is None
        assert "block_n 64 / 128" in scaled_fp8_ws_reason(da, db, Fp8Config(128, 256, 4, 3, gluon=True))
        assert "stages" in scaled_fp8_ws_reason(da, db, Fp8Config(128, 128, 4, 7, gluon=True))
        assert "block_m 128" in scaled_fp8_ws_reason(da, db, Fp8Config(64, 128, 4, 4, gluon=True))
        mx = [prepare_operand(_q(f, 4, 256, gen)) for f in ("mxfp8_e4m3", "mxfp8_e4m3")]
        assert "multiples of 128" in scaled_fp8_ws_reason(*(dataclasses.replace(o, codes=_dev(o.codes)) for o in mx))
        rows = torch.zeros(4, 264, dtype=torch.uint8)[:, :256]  # rows 264 bytes apart: no TMA
        rows.copy_(oa.codes)
        assert "16-byte" in scaled_fp8_ws_reason(dataclasses.replace(oa, codes=_dev(rows)), db)
        ue = get_format("fp8_e4m3_block128").replace(scale="ue4m3", name="e4m3_ue4m3_block128")  # (no UE4M3 read)
        u = [prepare_operand(ms.quantize(torch.randn(r, 256, generator=gen), ue)) for r in (4, 128)]
        assert "not ue4m3 x ue4m3" in scaled_fp8_ws_reason(*(dataclasses.replace(o, codes=_dev(o.codes)) for o in u))
    with target.override(capability=(8, 0)):
        assert "Hopper" in scaled_fp8_ws_reason(da, db)


@pytest.mark.parametrize("bn,act", [(128, "fp8_e4m3_block128"), (64, "fp8_e4m3_block128")])
def test_gluon_kernel_compiles_for_sm90(bn: int, act: str, tmp_path, run_tool) -> None:
    """Compiled for sm_90 as launched: no spills, the fp8 wgmma at the tile's width, and a K loop with no
    CTA-wide barrier and three scale loads per chunk (two activation rows a thread, one weight scale for the
    whole 128 x 128 block)."""
    sys_path = __import__("sys").path
    tools = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "tools")
    if tools not in sys_path:
        sys_path.insert(0, tools)
    from sass import instructions, loop_counts

    r = run_tool("gemv_ptx.py", str(tmp_path), "--fp8", "--act", act, "--fmt", "fp8_e4m3_block128x128", "--m", "512",
                 "--n", "512", "--k", "1024", "--config", f"{{'gluon': True, 'block_n': {bn}, 'num_stages': 4}}",
                 "--sass")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "0 bytes spill stores" in r.stdout and "C7512" not in r.stdout, r.stdout[-2000:]
    sass = (tmp_path / "_scaled_fp8_ws_kernel.sass").read_text()
    assert f"QGMMA.64x{bn}x32.F32.E4M3.E4M3" in sass
    k_loop = min((lp for lp in loop_counts(sass) if lp["hist"].get("QGMMA", 0)), key=lambda lp: lp["count"])
    assert k_loop["hist"]["LDG"] == 3 and k_loop["hist"]["QGMMA"] == 4, k_loop
    body = "\n".join(line for addr, _, line in instructions(sass) if k_loop["start"] <= addr < k_loop["end"])
    assert "BAR.SYNC.DEFER_BLOCKING 0x0" not in body


@needs_gpu
@pytest.mark.parametrize("m,n,k", [(70, 300, 1040), (512, 384, 1024), (300, 256, 4096)])
@pytest.mark.parametrize("fb", ["fp8_e4m3_block128x128", "fp8_e4m3_block128"])
@pytest.mark.parametrize("bn,stages", [(128, 4), (64, 5)])
def test_gpu_gluon_kernel_within_allowance(m: int, n: int, k: int, fb: str, bn: int, stages: int) -> None:
    """The Gluon kernel on the GPU: within 5e-4 of the exact oracle (as the Triton kernel), ragged M and N, K not a
    multiple of the chunk, 128 x 128 and 1 x 128 weight blocks, bias, both output dtypes, more tiles than SMs."""
    gen = torch.Generator().manual_seed(8)
    a, b = _q("fp8_e4m3_block128", m, k, gen, device="cuda"), _q(fb, n, k, gen, 0.25, device="cuda")
    bias = torch.randn(n, generator=gen).cuda()
    ref = scaled_mm_reference(a.to("cpu"), b.to("cpu"), bias.cpu(), torch.float32)
    cfg = Fp8Config(128, bn, 4, stages, gluon=True)
    assert scaled_fp8_ws_reason(prepare_operand(a), prepare_operand(b), cfg) is None
    out = scaled_fp8_launch(prepare_operand(a), prepare_operand(b), bias, torch.float32, cfg)
    assert _rel(out, ref) <= 5e-4
    triton_out = scaled_fp8_launch(prepare_operand(a), prepare_operand(b), bias, torch.float32)
    assert _rel(out, triton_out) <= 5e-4
    bf = scaled_fp8_launch(prepare_operand(a), prepare_operand(b), bias, torch.bfloat16, cfg)
    assert bf.dtype == torch.bfloat16 and _rel(bf.float(), out) <= 1e-2


def test_gluon_kernel_switch(monkeypatch) -> None:
    """tuning.fp8_gluon_min_m sends calls of at least that many rows to the Gluon kernel (128 columns) on 128-row
    weight blocks; per-row weight scales stay on the Triton kernel; 0 never takes it; the default is 1024."""
    import dataclasses

    from microscale.linear import tuning
    from microscale.linear._compile_cases import _dev
    from microscale.linear.backends import scaled_fp8 as sf
    from microscale.runtime import target

    seen = []
    monkeypatch.setattr(sf, "_ws_launch", lambda *a: seen.append(a[-1]))
    monkeypatch.setattr(sf, "launch", lambda fn, grid, *a, **kw: seen.append("triton"))
    gen = torch.Generator().manual_seed(9)
    assert tuning.Tuning().fp8_gluon_min_m == 1024
    for wfmt, bn in (("fp8_e4m3_block128x128", 128), ("fp8_e4m3_block128", "triton")):
        b = prepare_operand(_q(wfmt, 256, 512, gen))
        b = dataclasses.replace(b, codes=_dev(b.codes))
        for m, limit, want in ((128, 0, "triton"), (128, 64, bn), (32, 64, "triton")):
            a = prepare_operand(_q("fp8_e4m3_block128", m, 512, gen))
            with target.override(capability=(9, 0)), tuning.override(fp8_gluon_min_m=limit):
                sf.scaled_fp8_launch(dataclasses.replace(a, codes=_dev(a.codes)), b, None, torch.bfloat16)
            got = seen.pop()
            assert (got == "triton") if want == "triton" else (got.gluon and got.block_n == want), (wfmt, m, got)
