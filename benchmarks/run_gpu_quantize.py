"""GPU quantize / dequantize: correctness at realistic shapes, then timings (H200).

One run: (1) kernels vs the CPU reference, bit for bit, on realistic shapes for formats
covering every kernel path (element kinds, scale codecs and rules, two-level
conventions static and dynamic, affine, 2-D blocks, swizzled scale layouts, NaN/Inf);
(2) the device copy bandwidth (bytes read + written); (3) timings of the kernel-level
functions under CUDA graphs (median of replays, inputs alternated, outputs allocated
in the graph), as a fraction of copy bandwidth counting each byte the op must move
once: input read + codes + scales written (dequantize: codes + scales read + output
written); (4) torchao's NVFP4 quantize under torch.compile as a peer, when importable.

Usage (on the GPU machine): ``PYTHONPATH=. python3 benchmarks/run_gpu_quantize.py``;
JSON goes to ``$OUT/quantize_bench.json`` (or ./quantize_bench.json). The short table
is printed last.

``DEQ_SWEEP=1`` (with ``CHECKS_ONLY`` unset) runs only the dequantize part: every
dequantize path on the GPU vs the reference (random codes and raw scales), then the
default config and ``DEQ_CONFIGS`` for NVFP4 / MXFP4 / MXFP8 / int4-affine at 8192^2 and
28672x8192 -> bf16 (JSON ``$OUT/dequant_sweep.json``; table last; well under 90 s).
``BENCH_DRY=1 DEQ_SWEEP=1 TRITON_INTERPRET=1``: the same on the CPU at tiny shapes.

``SWEEP_ONLY=1``: the traffic ceilings (torch's own kernels) and the tile sweep alone, at
``SWEEP_N``^2 (default 16384) for ``SWEEP_FORMATS`` (default nvfp4,mxfp4,mxfp8_e4m3),
``SWEEP_ROUNDS`` interleaved rounds (default 3).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import torch

from microscale import reference
from microscale.formats import get_format, get_scale_layout, registry
from microscale import quant as kq

DRY = os.environ.get("BENCH_DRY") == "1"  # CPU dry run of the checks (interpreter, tiny shapes)
DEV = "cpu" if DRY else "cuda"
LOG: list[str] = []


def log(msg: str) -> None:
    print(msg, flush=True)
    LOG.append(msg)


def bits_of(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_floating_point:
        return t.view({4: torch.int32, 2: torch.int16, 1: torch.uint8, 8: torch.int64}[t.element_size()])
    return t


def explain_mismatch(x: torch.Tensor, got, want, limit: int = 4) -> None:
    """Log where a quantize differs from the reference: data / scale mismatch counts, the
    rows they fall in, and the first few elements (input, scale, codes)."""
    gd, wd = got.data.cpu(), want.data
    gs, ws = bits_of(got.scales.cpu()), bits_of(want.scales)
    dm = (gd != wd).nonzero()
    sm = (gs != ws).nonzero()
    log(f"  mismatch: {len(dm)} data bytes, {len(sm)} scales; rows {sorted(set(dm[:, 0].tolist()))[:12]}")
    b = want.fmt.block_size
    epb = 8 // want.fmt.element.bits if want.fmt.element.bits < 8 else 1
    for r, c in sm[:limit].tolist():
        br = want.fmt.block_rows
        log(f"  scale[{r},{c}] got {gs[r, c].item():#x} want {ws[r, c].item():#x} block amax "
            f"{x[r * br:(r + 1) * br, c * b:(c + 1) * b].float().abs().max().item()!r}")
    for r, c in dm[:limit].tolist():
        e = c * epb
        log(f"  data[{r},{c}] got {gd[r, c].item():#04x} want {wd[r, c].item():#04x} x[{r},{e}:{e + epb}] = "
            f"{x[r, e:e + epb].float().tolist()} scale "
            f"{want.scales[r // want.fmt.block_rows, e // b].float().item()!r}")


def same_q(a, b) -> bool:
    ok = torch.equal(a.data.cpu(), b.data) and torch.equal(bits_of(a.scales.cpu()), bits_of(b.scales))
    if b.zero_points is not None:
        ok &= torch.equal(a.zero_points.cpu(), b.zero_points)
    if b.global_scale is not None:
        ok &= torch.equal(bits_of(a.global_scale.cpu().reshape(1)), bits_of(b.global_scale.reshape(1)))
    return bool(ok) and a.meta == b.meta


def same_vals(a: torch.Tensor, b: torch.Tensor) -> bool:
    a = a.cpu()
    na, nb = torch.isnan(a), torch.isnan(b)
    return bool(torch.equal(na, nb) and torch.equal(bits_of(a)[~na], bits_of(b)[~nb]))


def make_input(shape, seed, dtype=torch.bfloat16, nonfinite=False, realistic=False, ties=False):
    """Adversarial check input; ``realistic``: activation-like (per-row magnitudes
    2^-4..2^4, no planted extremes) for timing."""
    g = torch.Generator(device=DEV)
    g.manual_seed(seed)
    x = torch.randn(shape, device=DEV, generator=g)
    x = x * torch.exp2(torch.randint(-4 if realistic else -10, 4 if realistic else 10, shape[:-1] + (1,), device=DEV,
                                     generator=g).float())
    if realistic:
        if ties:  # exact E2M1/E4M3 grid points and midpoints (x a power of two) in some rows: RNE ties on the fast path
            t = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -2.5, -5.0, 5.5, 7.0, 0.375, 13.0,
                              15.0, 112.0, 240.0, 448.0, 0.0625, 0.1875, 1.0, -6.0, 0.0, -0.0, 3.0, 4.0, 0.5, 1.5, 2.0,
                              0.125], device=DEV)
            k = shape[-1]
            for r in range(0, shape[0], 7):
                x[r] = t.repeat(k // 32 + 1)[:k] * 2.0 ** (r % 9 - 4)
            x[-1] *= 2.0 ** 90  # its tiles take the general path
        return x.to(dtype)
    x[0, :64] = 0.0
    x[1, :32] *= 2.0 ** -120
    x[2, :32] *= 2.0 ** 100
    if nonfinite:
        x[3, 5] = float("nan")
        x[4, 7] = float("inf")
        x[5, 9] = -float("nan")
    return x.to(dtype)


# ----------------------------------------------------------------------------------
# correctness
# ----------------------------------------------------------------------------------
def check_correctness() -> list[dict]:
    res = []
    cases = [  # (format, kwargs, shape)
        ("nvfp4", {}, (2048, 4096)),
        ("nvfp4", {}, (512, 4096)),
        ("nvfp4", {"convention": "torchao"}, (512, 4096)),
        ("nvfp4", {"convention": "compressed-tensors"}, (512, 4096)),
        ("nvfp4", {"global_scale": "static"}, (2048, 4096)),
        ("nvfp4", {"global_scale": "static"}, (512, 4096)),
        ("mxfp4", {}, (2048, 4096)),
        ("mxfp4", {}, (512, 4096)),
        ("mxfp4", {"scale_rule": "rceil"}, (512, 4096)),
        ("mxfp4", {"scale_rule": "even"}, (512, 4096)),
        ("mxfp6_e3m2", {"scale_rule": "ceil"}, (512, 4096)),
        ("mxfp8_e4m3", {}, (2048, 4096)),
        ("mxfp8_e4m3", {}, (512, 4096)),
        ("mxfp8_e5m2", {"overflow": "native"}, (512, 4096)),
        ("mxint8", {}, (512, 4096)),
        ("nvfp8", {}, (512, 4096)),
        ("fp4_fp16", {"rounding": "nearest_away"}, (512, 4096)),
        ("int4_fp32", {}, (512, 4096)),
        ("int3_fp16", {}, (512, 4096)),
        ("int8_affine_g128", {}, (512, 4096)),
        ("fp8_e4m3_block128x128", {}, (512, 4096)),
    ]
    # activation-like inputs: these tiles take the kernel's clean-tile fast path
    # (Markstein division, hardware FP8 conversion); the adversarial ones above mostly don't
    real = [("nvfp4", {}), ("nvfp4", {"convention": "compressed-tensors"}), ("nvfp4", {"convention": "torchao"}),
            ("nvfp4", {"global_scale": "static"}), ("nvfp8", {}), ("fp4_fp16", {}), ("int4_fp32", {}),
            ("mxfp8_e4m3", {}), ("mxfp8_e5m2", {}), ("mxfp4", {}), ("fp8_e4m3_block128x128", {})]
    cases += [(n, dict(kw, realistic=True), (2048, 4096)) for n, kw in real]
    # the fast path's encoders (one-add RNE for E2M1/E2M3/E3M2, hardware FP8, direct byte stores) on grid
    # ties, other scale rules, conventions and input dtypes
    tied = [("nvfp4", {}), ("nvfp4", {"convention": "compressed-tensors"}), ("nvfp4", {"convention": "torchao"}),
            ("nvfp4", {"global_scale": "static"}), ("mxfp4", {}), ("mxfp4", {"scale_rule": "rceil"}),
            ("mxfp4", {"scale_rule": "even"}), ("mxfp4", {"scale_rule": "ceil"}), ("mxfp6_e2m3", {}),
            ("mxfp6_e3m2", {}), ("mxfp8_e4m3", {}), ("mxfp8_e5m2", {}), ("mxint8", {}), ("nvfp8", {}),
            ("mxfp8_e4m3", {"overflow": "native"}), ("mxfp4", {"dtype": "float32"}), ("nvfp4", {"dtype": "float16"}),
            ("mxfp8_e4m3", {"dtype": "float32"})]
    cases += [(n, dict(kw, realistic=True, ties=True), (1024, 4096)) for n, kw in tied]
    only = os.environ.get("ONLY")  # e.g. ONLY=nvfp8: just that format's checks
    for i, (name, kw, shape) in enumerate(cases):
        if only and name != only:
            continue
        for nonfinite in ((False,) if shape[0] > 512 else (False, True)):
            if DRY:
                shape = (128, 256)
            kw2 = dict(kw)
            dt = getattr(torch, kw2.pop("dtype", "bfloat16"))
            x = make_input(shape, 100 + i, dtype=dt, nonfinite=nonfinite, realistic=kw2.pop("realistic", False),
                           ties=kw2.pop("ties", False))
            if kw2.get("global_scale") == "static":
                xf = x[:-1].float().abs() if kw.get("ties") else x.float().abs()
                kw2["global_scale"] = float(torch.where(torch.isfinite(xf), xf, 0).amax()) / 2688.0 * 0.5
            t0 = time.time()
            got = kq.quantize(x, name, **kw2)
            want = reference.quantize(x.cpu(), name, **kw2)
            okq = same_q(got, want)
            if not okq:
                explain_mismatch(x.cpu(), got, want)
            okd = same_vals(kq.dequantize(want.to(DEV), torch.bfloat16), reference.dequantize(want, torch.bfloat16))
            okd &= same_vals(kq.dequantize(want.to(DEV), torch.float32), reference.dequantize(want, torch.float32))
            r = dict(fmt=name, kwargs={k: str(v) for k, v in kw.items()}, shape=list(shape), nonfinite=nonfinite,
                     quantize_exact=okq, dequantize_exact=okd, s=round(time.time() - t0, 2))
            res.append(r)
            log(f"check {name:22s} {str(kw):40s} nan/inf={nonfinite!s:5s} quantize={okq} dequantize={okd}")
    for name in ("nvfp4", "mxfp4", "mxfp8_e4m3"):
        x = make_input((40, 320) if DRY else (1000, 4096 + 64), 7)  # rows and scale columns pad
        want = reference.quantize(x.cpu(), name)
        for lay in ("swizzled_128x4", "swizzled_8x4"):
            got = kq.quantize_for_gemm(x, name, scale_layout=lay)
            ok = torch.equal(got.data.cpu(), want.data) and torch.equal(
                bits_of(got.scales.cpu()), bits_of(get_scale_layout(lay).swizzle(want.scales)))
            res.append(dict(fmt=name, layout=lay, shape=list(x.shape), quantize_exact=bool(ok)))
            log(f"check {name:22s} layout={lay:15s} exact={ok}")
    # fused (tolerance: float32 prologue rounding differs from torch's)
    from microscale import reference_fused
    from microscale.quant import fused
    x = make_input((16, 256) if DRY else (2048, 4096), 9)
    w = (torch.rand(x.shape[-1], device=DEV) + 0.5).to(torch.bfloat16)
    for name in ("nvfp4", "mxfp8_e4m3"):
        gs = 1.0 / 448 if registry[name].global_scale else None
        got = fused.rmsnorm_quantize(x, w, name, global_scale=gs)
        want = reference_fused.rmsnorm_quantize(x.cpu(), w.cpu(), name, global_scale=gs)
        frac = float((got.data.cpu() != want.data).float().mean())
        res.append(dict(fmt=name, fused="rmsnorm", byte_mismatch_frac=frac))
        log(f"check fused rmsnorm {name}: packed-byte mismatch fraction {frac:.2e}")
        got = fused.silu_mul_quantize(x, x.flip(0), name, global_scale=gs)
        want = reference_fused.silu_mul_quantize(x.cpu(), x.flip(0).cpu(), name, global_scale=gs)
        frac = float((got.data.cpu() != want.data).float().mean())
        res.append(dict(fmt=name, fused="silu_mul", byte_mismatch_frac=frac))
        log(f"check fused silu_mul {name}: packed-byte mismatch fraction {frac:.2e}")
    return res


# ----------------------------------------------------------------------------------
# timing
# ----------------------------------------------------------------------------------
def graph_time(fn, inputs, reps=20, per_graph=4) -> float:
    """Median ms of one call: ``per_graph`` calls (alternating inputs) captured in a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            fn(inputs[i % len(inputs)])
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(per_graph):
            fn(inputs[i % len(inputs)])
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / per_graph)
    return statistics.median(ts)


def copy_bandwidth() -> float:
    """Device copy of 1 GiB (bytes read + written), ``copy_`` timed with events outside a
    graph (inside a graph a memcpy node measured 2.7 TB/s: the copy engine)."""
    n = 1 << 29  # 1 GiB of bf16
    src = torch.randn(n // 2, device=DEV).to(torch.bfloat16).repeat(2)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ts = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ms = statistics.median(ts)
    log(f"copy: {ms:.4f} ms for 2 x {src.numel() * 2 / 2**30:.1f} GiB")
    return 2 * src.numel() * 2 / (ms * 1e-3)


def traffic_ceilings(copy_bw: float) -> list[dict]:
    """torch's own elementwise kernels with the traffic mix of quantize (2 bytes read per
    1 written) and dequantize (1 read per 2 written) and a pure write (``fill_``), each as a
    fraction of the copy: what "memory speed" means for those mixes on this device."""
    n = 1 << 28
    x16 = torch.randn(n, device=DEV).to(torch.bfloat16)
    x8 = torch.randint(0, 255, (n,), device=DEV, dtype=torch.uint8)
    out = []
    for label, fn, byts in (("fill_ bf16 (write only)", lambda: x16.fill_(1.0), 2 * n),
                            ("bf16 -> uint8 (read 2 : write 1)", lambda: x16.to(torch.uint8), 3 * n),
                            ("uint8 -> bf16 (read 1 : write 2)", lambda: x8.to(torch.bfloat16), 3 * n)):
        for _ in range(3):
            fn()
        ts = []
        for _ in range(10):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        ms = statistics.median(ts)
        out.append(dict(op=label, ms=ms, tbps=byts / ms / 1e9, frac_copy=byts / ms / 1e9 / (copy_bw / 1e12)))
        log(f"ceiling {label:34s}: {ms:.4f} ms {out[-1]['tbps']:.3f} TB/s {out[-1]['frac_copy']:.3f} of copy")
    del x16, x8
    for m in (8192, 16384):  # an elementwise copy (read 2 B, write 2 B per element) in a CUDA graph, as the
        xs = [torch.randn(m, m, device=DEV).to(torch.bfloat16) for _ in range(2)]  # kernels are timed
        ys = [torch.empty_like(x) for x in xs]
        ms = graph_time(lambda x: torch.mul(x, 1.0, out=ys[0] if x is xs[0] else ys[1]), xs)
        byts = 4 * m * m
        out.append(dict(op=f"graph elementwise copy {m}^2", ms=ms, tbps=byts / ms / 1e9,
                        frac_copy=byts / ms / 1e9 / (copy_bw / 1e12)))
        log(f"ceiling graph elementwise copy {m}^2 bf16   : {ms:.4f} ms {out[-1]['tbps']:.3f} TB/s "
            f"{out[-1]['frac_copy']:.3f} of copy")
        del xs, ys
    torch.cuda.empty_cache()
    return out


def q_bytes(fmt, n: int, in_bytes: int = 2) -> int:
    f = get_format(fmt)
    return n * in_bytes + n * f.element.bits // 8 + (n // (f.block_size * f.block_rows)) * f.scale.storage.itemsize


def run_timings(copy_bw: float) -> list[dict]:
    rows = []
    for n in (8192, 16384):
        xs = [make_input((n, n), 1000 + j, realistic=True) for j in range(2)]
        numel = n * n
        gs = torch.tensor(float(xs[0].float().abs().amax()) / 2688.0, device=DEV)
        variants = [
            ("quantize nvfp4 static", "nvfp4", lambda x: kq.quantize(x, "nvfp4", global_scale=gs), 1),
            ("quantize mxfp4", "mxfp4", lambda x: kq.quantize(x, "mxfp4"), 1),
            ("quantize mxfp8_e4m3", "mxfp8_e4m3", lambda x: kq.quantize(x, "mxfp8_e4m3"), 1),
            ("quantize nvfp4 dynamic", "nvfp4", lambda x: kq.quantize(x, "nvfp4"), 2),
            ("quantize nvfp4 swizzled128x4", "nvfp4",
             lambda x: kq.quantize_for_gemm(x, "nvfp4", global_scale=gs), 1),
        ]
        for label, fmt, fn, reads in variants:
            ms = graph_time(fn, xs)
            byts = q_bytes(fmt, numel)
            moved = byts + (reads - 1) * numel * 2
            rows.append(dict(op=label, shape=[n, n], ms=ms, bytes=byts, bytes_moved=moved, tbps=byts / ms / 1e9,
                             frac_copy=byts / ms / 1e9 / (copy_bw / 1e12)))
        for fmt in ("nvfp4", "mxfp4", "mxfp8_e4m3"):
            qs = [kq.quantize(x, fmt, global_scale=gs if fmt == "nvfp4" else None) for x in xs]
            ms = graph_time(lambda q: kq.dequantize(q, torch.bfloat16), qs)
            byts = q_bytes(fmt, numel)
            rows.append(dict(op=f"dequantize {fmt} -> bf16", shape=[n, n], ms=ms, bytes=byts, bytes_moved=byts,
                             tbps=byts / ms / 1e9, frac_copy=byts / ms / 1e9 / (copy_bw / 1e12)))
        del xs
        torch.cuda.empty_cache()
    return rows


SWEEP_Q = {  # quantize tiles (rows, cols, warps[, column tiles per program]) timed by the sweep, besides the default
    "nvfp4": ((1, 1024, 1), (1, 1024, 1, 2), (1, 1024, 1, 8), (1, 512, 1, 4), (1, 512, 1, 8)),
    "mxfp4": ((2, 2048, 4, 2), (2, 2048, 4, 4), (2, 1024, 2, 4)),
    "mxfp8_e4m3": ((2, 2048, 4, 2), (2, 2048, 4, 4), (2, 1024, 2, 4)),
}
PREFETCH_OFF = {"nvfp4": ((1, 1024, 1, 4), (1, 1024, 1, 2)), "mxfp4": ((2, 2048, 4, 2),)}
SWEEP_D = ((2, 2048, 2),)  # dequantize, hints
SWEEP_ROUNDS = int(os.environ.get("SWEEP_ROUNDS", "3"))


def config_sweep(copy_bw: float) -> list[dict]:
    """Quantize tiles (``SWEEP_Q``; NVFP4 / MXFP4 also with the packed bf16 path off, and the
    ``PREFETCH_OFF`` tiles without the next tile's prefetch; NVFP4 dynamic too) and dequantize
    tiles (``SWEEP_D``, cache hints on; the default also without), at ``SWEEP_N``^2. Every
    variant's output is compared bit for bit with the default's; the variants of a format
    are timed ``SWEEP_ROUNDS`` times in interleaved order (run-to-run drift of a few
    percent showed between single timings); min and median reported."""
    n = int(os.environ.get("SWEEP_N", "16384"))
    xs = [make_input((n, n), 2000 + j, realistic=True) for j in range(2)]
    gs = torch.tensor(float(xs[0].float().abs().amax()) / 2688.0, device=DEV)
    out = []
    for fmt in os.environ.get("SWEEP_FORMATS", "nvfp4,mxfp4,mxfp8_e4m3").split(","):
        kw = {"global_scale": gs} if fmt == "nvfp4" else {}
        byts = q_bytes(fmt, n * n)
        ref = kq.quantize(xs[0], fmt, **kw).to("cpu")
        q = [kq.quantize(x, fmt, **kw) for x in xs]
        dref = kq.dequantize(q[0], torch.bfloat16)
        dyn_ref = kq.quantize(xs[0], fmt).to("cpu") if fmt == "nvfp4" else None
        variants = []  # (label, "q" / "d", config, quantize kwargs, reference, module switches)
        on = {}  # the defaults (quant.tuning fields to override)
        for c in (None,) + SWEEP_Q[fmt]:
            cfg = None if c is None else kq.QuantizeConfig(*c)
            name = "default" if c is None else f"{c[0]}x{c[1]}w{c[2]}" + (f"k{c[3]}" if len(c) > 3 else "")
            variants.append((f"quantize {fmt} {name}", "q", cfg, kw, ref, on))
        if fmt in ("mxfp4", "nvfp4"):
            variants.append((f"quantize {fmt} default, packed off", "q", None, kw, ref, dict(on, packed=False)))
            for c in PREFETCH_OFF.get(fmt, ()):  # the same tiles without the next tile's prefetch
                variants.append((f"quantize {fmt} {c[0]}x{c[1]}w{c[2]}k{c[3]}, no prefetch", "q",
                                 kq.QuantizeConfig(*c), kw, ref, dict(on, prefetch=False)))
        if fmt == "nvfp4":  # dynamic (global amax pass + quantize): bytes counted once, as in the table
            for c in (None, (1, 1024, 1)):
                name = "default" if c is None else f"{c[0]}x{c[1]}w{c[2]}"
                variants.append((f"quantize {fmt} dynamic {name}", "q", c and kq.QuantizeConfig(*c), {}, dyn_ref, on))
        variants.append((f"dequantize {fmt} default, no hints", "d", None, {}, dref, dict(on, deq_cache_hints=False)))
        for c in (None,) + SWEEP_D:
            name = "default" if c is None else f"{c[0]}x{c[1]}w{c[2]}"
            variants.append((f"dequantize {fmt} {name}", "d", None if c is None else kq.QuantizeConfig(*c), {}, dref,
                             on))
        times = {v[0]: [] for v in variants}
        same = {}
        for rnd in range(SWEEP_ROUNDS):
            for label, kind, cfg, qkw, want, switches in variants:
                with kq.tuning.override(**switches):
                    if kind == "q":
                        if rnd == 0:
                            same[label] = same_q(kq.quantize(xs[0], fmt, config=cfg, **qkw), want)
                        times[label].append(graph_time(lambda x: kq.quantize(x, fmt, config=cfg, **qkw), xs))
                    else:
                        if rnd == 0:
                            same[label] = torch.equal(kq.dequantize(q[0], torch.bfloat16, config=cfg), want)
                        times[label].append(graph_time(lambda qq: kq.dequantize(qq, torch.bfloat16, config=cfg), q))
        for label, *_ in variants:
            ts = times[label]
            ms = min(ts)
            out.append(dict(op=label, shape=[n, n], ms=ms, ms_all=ts, tbps=byts / ms / 1e9,
                            frac_copy=byts / ms / 1e9 / (copy_bw / 1e12),
                            frac_copy_median=byts / statistics.median(ts) / 1e9 / (copy_bw / 1e12),
                            same_as_default=same[label]))
            log(f"sweep {label:42s}: {ms:.4f} ms  {out[-1]['frac_copy']:.3f} of copy (best of {len(ts)}; "
                f"median {out[-1]['frac_copy_median']:.3f})" + ("" if same[label] else "  OUTPUT DIFFERS"))
        del q
    return out


# ----------------------------------------------------------------------------------
# dequantize sweep (DEQ_SWEEP=1): GPU checks of every dequantize path, then timings
# ----------------------------------------------------------------------------------
DEQ_FORMATS = ("nvfp4", "mxfp4", "mxfp8_e4m3", "int4_affine_g128")
DEQ_SHAPES = ((8192, 8192), (28672, 8192))
DEQ_CONFIGS = ((16, 512, 8), (32, 512, 8), (16, 1024, 8), (64, 512, 8), (32, 1024, 8), (8, 512, 4), (32, 256, 4))
# every dequantize path (tables for 4-bit codes, the byte path of 8-bit codes, the general path)
DEQ_CHECK_FORMATS = ("nvfp4", "mxfp4", "fp4_fp16", "int4_affine_g128", "int4_affine_g32", "int4_fp32", "mxint4",
                     "mxfp8_e4m3", "mxfp8_e5m2", "mxint8", "int8_affine_g32", "fp8_e4m3_block128x128", "mxfp6_e2m3",
                     "int3_fp16")


def _random_codes(q, g):
    """``q`` with random element codes and raw scales: every E8M0 byte (0, 254, 255 = NaN),
    every UE4M3 byte (subnormal, NaN), wide-range float scales, random zero points."""
    from microscale.formats import pack_codes
    fmt = q.fmt
    bits = fmt.element.bits
    codes = torch.randint(0, 1 << bits, tuple(q.padded_shape), generator=g, dtype=torch.int64).to(torch.uint8)
    q.data = pack_codes(codes, bits)
    m = q.scales.numel()
    if fmt.scale.name == "e8m0":
        q.scales = torch.randint(0, 256, (m,), generator=g, dtype=torch.int64).to(torch.uint8).reshape(q.scales.shape)
    elif fmt.scale.name == "ue4m3":
        q.scales = torch.randint(0, 256, (m,), generator=g, dtype=torch.int64).to(torch.uint8).view(
            torch.float8_e4m3fn).reshape(q.scales.shape)
    else:
        q.scales = (torch.randn(m, generator=g) * 2.0 ** torch.randint(-30, 30, (m,), generator=g)).to(
            q.scales.dtype).reshape(q.scales.shape)
    if q.zero_points is not None:
        q.zero_points = torch.randint(0, 256, tuple(q.zero_points.shape), generator=g,
                                      dtype=torch.int64).to(torch.uint8)
    if q.global_scale is not None:
        q.global_scale = torch.tensor(3.0e-3)
    return q


def dequant_checks() -> list[dict]:
    """Each dequantize path on the GPU vs the CPU reference, bit for bit (NaNs as NaN):
    random codes and raw scales; every format on a ragged tile (masks), the sweep formats
    also on whole tiles (no masks) in bf16 / f16 / f32 and under every sweep config (the
    timing runs' own specializations: 256 x 2048 tiles like 8192^2 exactly)."""
    res = []
    g = torch.Generator()
    g.manual_seed(5)
    bf16 = (torch.bfloat16,)
    for name in DEQ_CHECK_FORMATS:
        fmt = registry[name]
        cases = [((37, 384 + 128), None, (torch.bfloat16, torch.float16) if name in DEQ_FORMATS else bf16)]
        if name in DEQ_FORMATS and not DRY:
            cases.append(((256, 2048), None, (torch.bfloat16, torch.float16, torch.float32)))
            cases += [((256, 2048), kq.QuantizeConfig(*c), bf16) for c in DEQ_CONFIGS]
        for (r, k), cfg, dts in cases:
            r = max(r // fmt.block_rows, 1) * fmt.block_rows
            k = max(k // fmt.block_size, 1) * fmt.block_size
            q = _random_codes(reference.quantize(torch.randn(r, k, generator=g), name), g)
            qd = q.to(DEV)
            ok = True
            for dt in dts:
                ok &= same_vals(kq.dequantize(qd, dt, config=cfg), reference.dequantize(q, dt))
            tile = "default" if cfg is None else f"{cfg.tile_rows}x{cfg.tile_cols}w{cfg.num_warps}"
            res.append(dict(fmt=name, shape=[r, k], config=tile, dtypes=[str(d) for d in dts],
                            dequantize_exact=bool(ok), random_codes=True))
            log(f"deq check {name:22s} {r}x{k} {tile:10s} random codes/scales {len(dts)} dtypes: exact={ok}")
    return res


def _precompile(fns) -> None:
    """Compile every kernel specialization that ``fns`` launch, in parallel, into Triton's
    cache (``tools/compile_check.py``'s launch interception, on CPU tensors), so that the
    timed run does not compile ~60 specializations one after another. Call before CUDA is
    initialised (the pool forks)."""
    global DEV, log
    import multiprocessing as mp
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
    interpret = os.environ.get("TRITON_INTERPRET")
    import compile_check as cc  # (it drops TRITON_INTERPRET from the environment)
    if interpret is not None:
        os.environ["TRITON_INTERPRET"] = interpret
    t0 = time.time()
    saved = DEV, log
    DEV, log = "cpu", (lambda msg: None)
    try:
        with cc.intercept():
            for f in fns:
                f()
    finally:
        DEV, log = saved
    specs = list(cc.SPECS.values())
    with mp.get_context("fork").Pool(min(len(specs), os.cpu_count() or 1)) as pool:
        done = pool.map(cc.compile_one, specs)
    bad = [cc._label(s) for s, (ok, _, _) in zip(specs, done) if not ok]
    log(f"precompiled {len(specs) - len(bad)}/{len(specs)} specializations ({time.time() - t0:.0f}s)"
        + (f"; FAILED: {bad}" if bad else ""))


def _time_eager(fn, inputs, reps=3) -> float:
    t0 = time.perf_counter()
    for i in range(reps):
        fn(inputs[i % len(inputs)])
    return (time.perf_counter() - t0) / reps * 1e3


def dequant_sweep(copy_bw: float, shapes=None, timer=None) -> list[dict]:
    """Default dequantize config and DEQ_CONFIGS for DEQ_FORMATS x DEQ_SHAPES -> bf16: CUDA-graph timings as a
    fraction of copy bandwidth (codes + scales read + output written); every variant's
    output compared bit for bit with the default's once."""
    out = []
    shapes = shapes or (((64, 1024),) if DRY else DEQ_SHAPES)
    timer = timer or (_time_eager if DRY else graph_time)
    for shape in shapes:
        xs = [make_input(shape, 4000 + j, realistic=True) for j in range(2)]
        gs = torch.tensor(float(xs[0].float().abs().amax()) / 2688.0, device=DEV)  # static: no amax pass
        for fmt in DEQ_FORMATS:
            qs = [kq.quantize(x, fmt, global_scale=gs if registry[fmt].global_scale else None) for x in xs]
            numel = shape[0] * shape[1]
            q0 = qs[0]
            byts = q0.data.nbytes + q0.scales.nbytes + (0 if q0.zero_points is None else q0.zero_points.nbytes) + \
                numel * 2
            dflt = kq.choose_dequantize_config(q0.fmt, shape[0], shape[1])
            ref = kq.dequantize(q0, torch.bfloat16)
            variants = [("default", dflt, False)] + [(f"{c[0]}x{c[1]}w{c[2]}", kq.QuantizeConfig(*c), False)
                                                     for c in DEQ_CONFIGS if kq.QuantizeConfig(*c) != dflt]
            for label, cfg, reg in variants:
                exact = bool(torch.equal(kq.dequantize(q0, torch.bfloat16, config=cfg).view(torch.int16),
                                         ref.view(torch.int16)))
                ms = timer(lambda q: kq.dequantize(q, torch.bfloat16, config=cfg), qs)
                frac = byts / ms / 1e9 / (copy_bw / 1e12)
                out.append(dict(fmt=fmt, shape=list(shape), config=label,
                                tile=[cfg.tile_rows, cfg.tile_cols, cfg.num_warps], reg_store=reg, ms=ms, bytes=byts,
                                frac_copy=frac, exact_vs_default=exact))
                log(f"deq sweep {fmt:18s} {shape[0]}x{shape[1]} {label:20s} {ms * 1e3:8.1f} us  {frac:.3f} of copy"
                    f"  exact_vs_default={exact}")
            del qs, ref
        del xs
        if not DRY:
            torch.cuda.empty_cache()
    return out


def deq_table(rows: list[dict], copy_bw: float, checks: list[dict]) -> None:
    """Fraction of copy per format x shape (columns: configs), best marked with *."""
    labels = []
    for r in rows:
        if r["config"] not in labels:
            labels.append(r["config"])
    print()
    print(f"dequantize -> bf16, fraction of copy ({copy_bw / 1e12:.3f} TB/s); us for the default; * best;"
          f" ! output differs from the default")
    short = {lb: lb.replace("default+reg-store", "dflt+reg") for lb in labels}
    print(f"{'format':18s} {'shape':>10s} {'us':>7s} " + " ".join(f"{short[lb]:>10s}" for lb in labels))
    keys = []
    for r in rows:
        if (r["fmt"], tuple(r["shape"])) not in keys:
            keys.append((r["fmt"], tuple(r["shape"])))
    for fmt, shape in keys:
        sel = {r["config"]: r for r in rows if r["fmt"] == fmt and tuple(r["shape"]) == shape}
        best = max(sel.values(), key=lambda r: r["frac_copy"])["config"]
        cells = []
        for lb in labels:
            r = sel.get(lb)
            cells.append(f"{'':>10s}" if r is None else
                         f"{r['frac_copy']:9.3f}{'*' if lb == best else '!' if not r['exact_vs_default'] else ' '}")
        print(f"{fmt:18s} {shape[0]:>5d}x{shape[1]:<4d} {sel['default']['ms'] * 1e3:7.1f} " + " ".join(cells))
    bad = [c for c in checks if not c.get("dequantize_exact", True)]
    print(f"dequantize checks: {len(checks) - len(bad)}/{len(checks)} exact" + (f"; FAILED: {bad}" if bad else ""))


def deq_main() -> int:
    """DEQ_SWEEP=1: dequantize checks and sweep only (no quantize checks, timings or sweep)."""
    t0 = time.time()
    if not DRY:
        _precompile([dequant_checks, lambda: dequant_sweep(1.0, shapes=((256, 2048),), timer=_time_eager)])
    checks = dequant_checks()
    n_ok = sum(c["dequantize_exact"] for c in checks)
    log(f"dequantize checks: {n_ok}/{len(checks)} exact ({time.time() - t0:.0f}s)")
    copy_bw = 1.0e12 if DRY else copy_bandwidth()
    rows = dequant_sweep(copy_bw)
    path = os.path.join(os.environ.get("OUT", "."), "dequant_sweep.json")
    with open(path, "w") as f:
        json.dump(dict(copy_tbps=copy_bw / 1e12, checks=checks, sweep=rows, log=LOG, s=time.time() - t0), f, indent=1)
    deq_table(rows, copy_bw, checks)
    print(f"DEQ_SWEEP done in {time.time() - t0:.0f}s")
    return 0 if all(c["dequantize_exact"] for c in checks) and all(r["exact_vs_default"] for r in rows) else 1

def torchao_peer(copy_bw: float) -> dict:
    try:
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return {"peer": "torchao nvfp4", "status": f"not importable: {type(e).__name__}: {e}"}
    try:
        n = 8192
        xs = [make_input((n, n), 3000 + j, realistic=True) for j in range(2)]
        pts = torch.tensor(float(xs[0].float().abs().amax()) / 2688.0, device=DEV)
        f = torch.compile(lambda x: NVFP4Tensor.to_nvfp4(x, per_tensor_scale=pts))
        ms = graph_time(f, xs)
        byts = q_bytes("nvfp4", n * n)
        return {"peer": "torchao nvfp4 (torch.compile)", "shape": [n, n], "ms": ms,
                "frac_copy": byts / ms / 1e9 / (copy_bw / 1e12)}
    except Exception as e:  # noqa: BLE001
        return {"peer": "torchao nvfp4", "status": f"failed: {type(e).__name__}: {e}"}


def main() -> int:
    import triton

    if os.environ.get("DEQ_SWEEP") == "1" and os.environ.get("CHECKS_ONLY") != "1":
        return deq_main()
    if DRY:
        checks = check_correctness()
        print(all(c.get("quantize_exact", True) and c.get("dequantize_exact", True) for c in checks))
        return 0
    info = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    try:
        info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True).stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    log(str(info))
    if os.environ.get("SWEEP_ONLY") == "1":  # the tile sweep alone (no checks, no timings table)
        bw = copy_bandwidth()
        traffic_ceilings(bw)
        config_sweep(bw)
        return 0
    t0 = time.time()
    checks = check_correctness()
    log(f"correctness: {sum(c.get('quantize_exact', True) and c.get('dequantize_exact', True) for c in checks)}"
        f"/{len(checks)} exact ({time.time() - t0:.0f}s)")
    if os.environ.get("ONLY") or os.environ.get("CHECKS_ONLY") == "1":  # correctness only, no timings
        return 0 if all(c.get("quantize_exact", True) and c.get("dequantize_exact", True) for c in checks) else 1
    copy_bw = copy_bandwidth()
    timings = run_timings(copy_bw)
    peer = torchao_peer(copy_bw)
    path = os.path.join(os.environ.get("OUT", "."), "quantize_bench.json")
    out = dict(info=info, copy_tbps=copy_bw / 1e12, checks=checks, timings=timings, sweep=[], peer=peer, log=LOG)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    table(info, copy_bw, timings, peer, checks)
    if os.environ.get("SWEEP", "1") == "1":
        out["sweep"] = config_sweep(copy_bw)
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    table(info, copy_bw, timings, peer, checks)
    return 0 if all(c.get("quantize_exact", True) and c.get("dequantize_exact", True) for c in checks) else 1


def table(info, copy_bw, timings, peer, checks) -> None:
    print()
    print(f"{info['device']}  torch {info['torch']}  triton {info['triton']}  driver {info.get('driver')}  "
          f"{info['date']}")
    print(f"device copy bandwidth (read+write): {copy_bw / 1e12:.3f} TB/s")
    print(f"{'op':34s} {'shape':>12s} {'ms':>8s} {'TB/s':>7s} {'of copy':>8s}")
    for r in timings:
        extra = ""
        if r["bytes_moved"] != r["bytes"]:
            extra = f"  (actual traffic {r['bytes_moved'] / r['ms'] / 1e9 / copy_bw * 1e12:.2f} of copy)"
        print(f"{r['op']:34s} {'x'.join(map(str, r['shape'])):>12s} {r['ms']:8.4f} {r['tbps']:7.3f} "
              f"{r['frac_copy']:8.2f}{extra}")
    print("peer:", json.dumps(peer))
    bad = [c for c in checks if not (c.get("quantize_exact", True) and c.get("dequantize_exact", True))]
    print(f"correctness: {len(checks) - len(bad)}/{len(checks)} exact" + (f"; FAILED: {bad}" if bad else ""))


if __name__ == "__main__":
    sys.exit(main())
