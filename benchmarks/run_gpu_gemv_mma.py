"""H200 check + benchmark of the tensor-core decode path (``microscale.qlinear.gemv_mma``).

One call: copy bandwidth; correctness for NVFP4 / MXFP4 on ragged and real shapes, 1-16
tokens, bias, split-K, every config of the sweep, adversarial codes and scales, each
element against float64 ``x @ dequant(W)^T`` within bf16 rounding plus an fp32
accumulation bound; then CUDA-graph timings (weights rotated past L2) of the config
sweep, the f16x2 GEMV, what ``ms.linear`` routes to today and cuBLAS bf16. Short table
last; JSON to $OUT/gemv_mma.json.

    PYTHONPATH=. python benchmarks/run_gpu_gemv_mma.py [--quick]
    MMA_SWEEP=1 PYTHONPATH=. python benchmarks/run_gpu_gemv_mma.py   (tile sweep only)
    MMA_SWEEP=rg [MMA_SWEEP_M=8,16] [MMA_SWEEP_CHECKS=2] ...        (row groups, explicit splits)
    MMA_SWEEP=xf ...                                                 (fragment-ordered activations)
    MMA_TIME=1 PYTHONPATH=. python benchmarks/run_gpu_gemv_mma.py    (routed ms.linear, 4-16 tokens)
"""
from __future__ import annotations

import json
from dataclasses import replace
import os
import sys

import torch
import torch.nn.functional as F

import microscale as ms
from microscale import qlinear as L

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_gpu_gemv import bench, start_run  # noqa: E402  (graph timing over rotated weights; header + copy)

OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
C = L.GemvMmaConfig
SWEEP = [C(2, 8, 2), C(2, 8, 4), C(2, 4, 4), C(1, 8, 2), C(1, 4, 4)]
#: MMA_SWEEP=rg: more row groups per warp (activation loads shared by more weight rows) and
#: K splits given explicitly (split_k > 1 is kept: grid waves), against the defaults
RG_SWEEP = [C(2, 8, 2), C(3, 8, 1), C(3, 8, 2), C(2, 4, 4), C(3, 4, 4), C(3, 4, 2), C(4, 4, 2), C(4, 4, 1),
            C(2, 4, 4, split_k=4), C(2, 8, 2, split_k=4)]
#: MMA_SWEEP=xf: fragment-ordered activations and the select decode over tiles, against the defaults
XF_SWEEP = [C(2, 8, 2), C(2, 4, 4)] + [C(*t, xfrag=True, select=True) for t in
                                       [(2, 8, 2), (2, 4, 4), (2, 4, 2), (2, 8, 4), (1, 8, 2), (1, 4, 4), (3, 4, 2)]]


def _split(c: L.GemvMmaConfig, n: int, k: int) -> L.GemvMmaConfig:
    """``c`` as given when it names a K split, else with the default split."""
    return c if c.split_k > 1 else L.with_gemv_mma_split(c, n, k, dev)


def sweep_label(c: L.GemvMmaConfig) -> str:
    tail = (" xf" if c.xfrag else "") + (" sel" if c.select else "")
    return f"mma {c.row_groups}x{c.words_per_lane}w{c.num_warps}s{c.split_k}{tail}"


def check(out: torch.Tensor, x: torch.Tensor, q, bias) -> tuple[bool, float, float]:
    """Every element within bf16 rounding of the float64 result plus 2^-16 of sum |x||w|
    (fp32 accumulation on tensor cores)."""
    wd = q.dequantize(torch.float64)
    ref = x.double() @ wd.T
    cond = x.double().abs() @ wd.abs().T
    if bias is not None:
        ref = ref + bias.double()
        cond = cond + bias.double().abs()
    err = (out.double() - ref).abs()
    bound = 2.0 ** -8 * ref.abs() + 2.0 ** -16 * cond + 1e-30
    fro = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()
    ok = bool(torch.isfinite(out).all()) and bool((err <= bound).all()) and out.dtype == x.dtype
    return ok, fro, (err / bound).max().item()


def sweep_main(configs: list) -> None:
    """MMA_SWEEP=1: each config checked on small shapes, then timed on 28672x8192 at 1, 8,
    12 and 16 tokens (with the f16x2 GEMV at 1 token)."""
    res, bw = start_run()
    g = torch.Generator(device=dev).manual_seed(5)
    ok = True
    for name in ("nvfp4", "mxfp4"):
        shapes = [(3, 520, 2048), (16, 256, 4096), (1, 1000, 8192)]
        for (m, n, k) in shapes[:int(os.environ.get("MMA_SWEEP_CHECKS", 3))]:
            q = ms.quantize(torch.randn(n, k, device=dev, generator=g), name)
            x = (torch.randn(m, k, device=dev, generator=g) * 2).to(torch.bfloat16)
            for c in configs:
                good = check(L.gemv_mma(x, q, None, _split(c, n, k)), x, q, None)[0]
                ok &= good
                if not good:
                    print(f"check {name} {m}x{n}x{k} {c} FAIL", flush=True)
    print(f"checks {'all ok' if ok else 'FAILED'}", flush=True)
    n, k = 28672, 8192
    w = torch.randn(n, k, device=dev, generator=g)
    wb = [w.to(torch.bfloat16) for _ in range(2)]
    for name in ("nvfp4", "mxfp4"):
        ql = [ms.quantize(w, name) for _ in range(4)]
        for m in [int(v) for v in os.environ.get("MMA_SWEEP_M", "1,8,12,16").split(",")]:
            x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            cub = bench([lambda wt=wt: F.linear(x, wt) for wt in wb])
            variants = [(sweep_label(c), lambda q, x=x, c=c: L.gemv_mma(x, q, None, c))
                        for c in (_split(c, n, k) for c in configs)]
            if m == 1:
                variants.append(("f16x2 gemv", lambda q, x=x: L.gemv(x, q)))
            for label, fn in variants:
                t = bench([lambda q=q: fn(q) for q in ql])
                r = dict(fmt=name, m=m, n=n, k=k, variant=label, ms=t, cublas_ms=cub, speedup=cub / t,
                         pct_copy=ql[0].nbytes / (t * 1e-3) / 1e9 / bw)
                res["timings"].append(r)
                print(f"{name:6s} M={m:2d} {label:16s} {t * 1e3:7.1f} us {r['speedup']:5.2f}x cuBLAS "
                      f"{100 * r['pct_copy']:5.1f}% copy", flush=True)
    with open(os.path.join(OUT, "gemv_mma_sweep.json"), "w") as f:
        json.dump(res, f, indent=1)


def main() -> None:
    quick = "--quick" in sys.argv
    res, bw = start_run()
    g = torch.Generator(device=dev).manual_seed(11)
    ok = True
    nck = 0

    def run_check(label, x, q, bias, cfg):
        nonlocal ok, nck
        try:
            out = L.gemv_mma(x, q, bias, cfg)
            good, fro, worst = check(out, x, q, bias)
        except Exception as exc:  # reported, counted as a failure
            good, fro, worst = False, float("nan"), float("nan")
            print(f"check {label} raised {type(exc).__name__}: {exc}"[:400], flush=True)
        ok &= good
        nck += 1
        res["checks"].append(dict(label=label, rel_err=fro, worst=worst, ok=good))
        if not good:
            print(f"check {label:60s} rel {fro:.2e} worst/bound {worst:.2f} FAIL", flush=True)
        return good

    for name in ("nvfp4", "mxfp4"):
        for (m, n, k) in [(1, 4096, 4096), (3, 1000, 2048), (8, 8192, 8192), (9, 520, 1024), (16, 256, 28672),
                          (2, 24, 1024)]:
            w = torch.randn(n, k, device=dev, generator=g)
            q = ms.quantize(w, name)
            x = (torch.randn(m, k, device=dev, generator=g) * 2).to(torch.bfloat16)
            x[-1, 5] = 300.0
            bias = torch.randn(n, device=dev, generator=g)
            cfgs = [None] + SWEEP + [C(1, 8, 4, 2), C(1, 4, 4, 4)]
            cfgs += [replace(c, xfrag=True, select=i % 2 == 0) for i, c in enumerate(SWEEP)]
            for cfg in cfgs:
                if cfg is not None and (k % (32 * cfg.words_per_lane) or (k // 8) % (4 * cfg.words_per_lane
                                                                                       * cfg.split_k)):
                    continue
                for bb in ((bias, None) if cfg is None else (None,)):
                    run_check(f"{name} m={m} n={n} k={k} {cfg} bias={bb is not None}", x, q, bb, cfg)
        # adversarial: every code +-0.5 (bf16 subnormal after placement), tiny and huge scales
        n, k = 64, 2048
        w = torch.randn(n, k, device=dev, generator=g)
        q = ms.quantize(w, name)
        codes = q.data.view(torch.uint8)
        q.data.copy_(torch.where(torch.rand(codes.shape, device=dev, generator=g) < 0.5, 0x11, 0x99)
                     .to(torch.uint8).view(q.data.dtype))
        x = torch.randn(4, k, device=dev, generator=g).to(torch.bfloat16)
        run_check(f"{name} all codes +-0.5", x, q, None, None)
        sc = q.scales.view(torch.uint8)
        if name == "nvfp4":  # UE4M3 subnormal scales (1..7) and the largest (0x7E = 448)
            sc.copy_(torch.randint(1, 8, sc.shape, device=dev, generator=g).to(torch.uint8))
            sc[::2] = 0x7E
        else:  # E8M0 over a 120-binade window
            sc.copy_(torch.randint(60, 180, sc.shape, device=dev, generator=g).to(torch.uint8))
        run_check(f"{name} extreme scales", x, q, None, None)
    print(f"checks {'all ok' if ok else 'FAILED'} ({nck})", flush=True)

    rows = []
    shapes = [(28672, 8192)] if quick else [(28672, 8192), (8192, 8192), (8192, 28672)]
    for (n, k) in shapes:
        w = torch.randn(n, k, device=dev, generator=g)
        wb = [w.to(torch.bfloat16) for _ in range(2)]
        for name in ("nvfp4", "mxfp4"):
            ql = [ms.quantize(w, name) for _ in range(4)]
            qbytes = ql[0].nbytes
            for m in ((1, 2, 4, 8, 16) if (n, k) == (28672, 8192) else (1, 4, 8, 16)):
                x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
                cub = bench([lambda wt=wt: F.linear(x, wt) for wt in wb])
                auto = L.choose_gemv_mma_config(n, k, dev, m)
                variants = [("mma auto", lambda q, x=x: L.gemv_mma(x, q)),
                            ("mma auto xf", lambda q, x=x, c=replace(auto, xfrag=True): L.gemv_mma(x, q, None, c)),
                            ("mma auto sel", lambda q, x=x, c=replace(auto, select=True): L.gemv_mma(x, q, None, c)),
                            ("mma auto xf+sel", lambda q, x=x, c=replace(auto, xfrag=True, select=True):
                             L.gemv_mma(x, q, None, c))]
                if (n, k) == (28672, 8192) and m in (1, 8, 16):
                    cs = [L.with_gemv_mma_split(c, n, k, dev) for c in SWEEP]
                    cs += [replace(c, split_k=2 * c.split_k) for c in cs[:3]]
                    cs += [replace(c, xfrag=True, select=True) for c in cs[:3]]
                    variants += [(sweep_label(c), lambda q, x=x, c=c: L.gemv_mma(x, q, None, c)) for c in cs]
                if m <= 4:
                    variants.append(("f16x2 gemv", lambda q, x=x: L.gemv(x, q)))
                variants.append(("ms.linear", lambda q, x=x: ms.linear(x, q)))
                for label, fn in variants:
                    try:
                        t = bench([lambda q=q: fn(q) for q in ql])
                    except Exception as exc:
                        print(f"{label} failed: {type(exc).__name__}: {exc}"[:300], flush=True)
                        continue
                    r = dict(fmt=name, m=m, n=n, k=k, variant=label, ms=t, cublas_ms=cub, speedup=cub / t,
                             pct_copy=qbytes / (t * 1e-3) / 1e9 / bw)
                    res["timings"].append(r)
                    rows.append(r)
                    print(f"{name:6s} {n:5d}x{k:5d} M={m:2d} {label:14s} {t * 1e3:7.1f} us {r['speedup']:5.2f}x cuBLAS "
                          f"{100 * r['pct_copy']:5.1f}% copy", flush=True)
    with open(os.path.join(OUT, "gemv_mma.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"\ncopy {bw:.0f} GB/s; checks {'all ok' if ok else 'FAILED'} ({nck})")
    print(f"{'fmt':6s} {'shape':>11s} {'M':>2s} {'mma auto':>9s} {'xf+sel':>8s} {'best mma':>16s} {'ms.linear':>9s} "
          f"{'cuBLAS':>7s} {'x cuBLAS':>8s} {'%copy':>6s}")
    by: dict = {}
    for r in rows:
        by.setdefault((r["fmt"], r["n"], r["k"], r["m"]), []).append(r)
    for (fm, n, k, m), rs in by.items():
        d = {r["variant"]: r for r in rs}
        best = min((r for r in rs if r["variant"].startswith("mma")), key=lambda r: r["ms"], default=None)
        if best is None or "mma auto" not in d:
            continue
        lin = d.get("ms.linear", {}).get("ms", float("nan"))
        xf = d.get("mma auto xf+sel", {}).get("ms", float("nan"))
        print(f"{fm:6s} {n:5d}x{k:5d} {m:2d} {d['mma auto']['ms'] * 1e3:9.1f} {xf * 1e3:8.1f} {best['variant']:>10s} "
              f"{best['ms'] * 1e3:5.1f} {lin * 1e3:9.1f} {best['cublas_ms'] * 1e3:7.1f} "
              f"{d['mma auto']['speedup']:8.2f} {100 * d['mma auto']['pct_copy']:5.1f}%")


def time_main() -> None:
    """MMA_TIME=1: ``ms.linear`` (routed) on 28672x8192 at 4, 8 and 16 tokens, NVFP4 and
    MXFP4, with cuBLAS bf16 ``F.linear``, for A/B runs of the environment switches."""
    res, bw = start_run()
    g = torch.Generator(device=dev).manual_seed(9)
    n, k = 28672, 8192
    w = torch.randn(n, k, device=dev, generator=g)
    wb = [w.to(torch.bfloat16) for _ in range(2)]
    for name in ("nvfp4", "mxfp4"):
        ql = [ms.quantize(w, name) for _ in range(4)]
        for m in (4, 8, 16):
            x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            cub = bench([lambda wt=wt: F.linear(x, wt) for wt in wb])
            t = bench([lambda q=q: ms.linear(x, q) for q in ql])
            res["timings"].append(dict(fmt=name, m=m, ms=t, cublas_ms=cub))
            print(f"{name:6s} M={m:2d} ms.linear {t * 1e3:7.1f} us {cub / t:5.2f}x cuBLAS "
                  f"{100 * ql[0].nbytes / (t * 1e-3) / 1e9 / bw:5.1f}% copy", flush=True)
    with open(os.path.join(OUT, "gemv_mma_time.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    if os.environ.get("MMA_TIME") == "1":
        time_main()
    elif os.environ.get("MMA_SWEEP") == "1":
        sweep_main([C(2, 8, 2), C(2, 8, 1), C(2, 4, 4), C(2, 4, 2), C(2, 4, 1), C(1, 8, 1)])
    elif os.environ.get("MMA_SWEEP") == "rg":
        sweep_main(RG_SWEEP)
    elif os.environ.get("MMA_SWEEP") == "xf":
        sweep_main(XF_SWEEP)
    else:
        main()
