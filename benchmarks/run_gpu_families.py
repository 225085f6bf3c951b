"""The op families' CUDA kernels against their references, on a GPU (the unit tests run them on
the CPU under Triton's interpreter). Every case: the op on CUDA tensors vs the float64 / CPU
reference of the same inputs, ragged shapes, every registry format the family takes.

    python benchmarks/run_gpu_families.py [--only moe,scaled,attention,fused,hadamard,conv] [--formats 'mx*,nvfp4']
    python benchmarks/run_gpu_families.py --device cpu   # the script's own dry run: CPU tensors take
                                                         # the reference paths

One line per case (family, case, error, tolerance, ok); exit status 1 when any case fails.
"""
from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import sys
import time
import traceback

import torch

import microscale as ms
from microscale.formats import registry

DEV = torch.device("cuda")
PATTERNS = ["*"]  # --formats: which registry formats the per-format families sweep
ROWS: list[tuple[str, str, str, bool]] = []


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    if got.shape != want.shape or not bool(torch.isfinite(got).all()):
        return float("inf")
    return float((got - want).norm() / want.norm().clamp_min(1e-300))


def case(family: str, name: str, tol: float, fn) -> None:
    """Run ``fn() -> error``; record ok when error <= tol (an exception is a failure)."""
    try:
        err = fn()
        ok = err <= tol
        msg = f"{err:.3g} (tol {tol:g})"
    except Exception as e:  # noqa: BLE001  (reported, the sweep goes on)
        ok, msg = False, f"{type(e).__name__}: {e}".splitlines()[0][:300]
        traceback.print_exc(limit=3)
    ROWS.append((family, name, msg, ok))
    print(f"{'ok  ' if ok else 'FAIL'} {family:10s} {name:60s} {msg}", flush=True)


def formats() -> list[str]:
    """The registry formats matching ``--formats`` (glob patterns), in registry order."""
    return [n for n in registry if any(fnmatch.fnmatchcase(n, p) for p in PATTERNS)]


def offsets_of(counts: list[int]) -> torch.Tensor:
    o = torch.zeros(len(counts) + 1, dtype=torch.int32)
    o[1:] = torch.cumsum(torch.tensor(counts), 0)
    return o


def moe(gen: torch.Generator) -> None:
    from microscale.moe import grouped_linear_reference, moe_experts_reference

    e, n, k = 5, 384, 512
    for name in formats():
        for counts in ([3, 0, 9, 1, 0], [1, 0, 0, 0, 0], [70, 300, 0, 5, 133]):
            def run(name=name, counts=counts):
                q = ms.quantize(torch.randn(e, n, k, generator=gen), name)
                offs = offsets_of(counts)
                x = torch.randn(sum(counts), k, generator=gen).bfloat16()
                bias = torch.randn(e, n, generator=gen)
                got = ms.grouped_linear(x.to(DEV), q.to(DEV), offs.to(DEV), bias.to(DEV))
                want = grouped_linear_reference(x.double(), q.dequantize(torch.float64), offs, bias.double())
                return rel(got, want)
            case("moe", f"grouped_linear {name} rows={counts}", 1e-2, run)
    for name in ("mxfp4", "nvfp4", "mxfp8_e4m3", "int4_affine_g32"):
        for t, act, layout in ((1, "swiglu", "concat"), (8, "swiglu_clamped", "interleaved"),
                               (300, "swiglu_clamped", "interleaved")):
            def run(name=name, t=t, act=act, layout=layout):
                ee, h, i, top = 8, 256, 192, 2
                wgu = ms.quantize(torch.randn(ee, 2 * i, h, generator=gen) * 0.1, name)
                wd = ms.quantize(torch.randn(ee, h, i, generator=gen) * 0.1, name)
                x = torch.randn(t, h, generator=gen).bfloat16()
                idx = torch.randint(0, ee, (t, top), generator=gen)
                wt = torch.rand(t, top, generator=gen)
                b1, b2 = torch.randn(ee, 2 * i, generator=gen), torch.randn(ee, h, generator=gen)
                kw = dict(activation=act, layout=layout)
                got = ms.moe_experts(x.to(DEV), wgu.to(DEV), wd.to(DEV), idx.to(DEV), wt.to(DEV),
                                     gate_up_bias=b1.to(DEV), down_bias=b2.to(DEV), **kw)
                want = moe_experts_reference(x.double(), wgu.dequantize(torch.float64), wd.dequantize(torch.float64),
                                             idx, wt.double(), gate_up_bias=b1.double(), down_bias=b2.double(), **kw)
                return rel(got, want)
            case("moe", f"moe_experts {name} T={t} {act} {layout}", 1e-2, run)


SCALED_PAIRS = (("fp8_e4m3_block128", "fp8_e4m3_block128x128"), ("mxfp8_e4m3", "mxfp8_e4m3"),
                ("mxfp8_e4m3", "mxfp4"), ("mxfp8_e5m2", "mxfp6_e2m3"), ("mxfp8_e4m3", "mxfp6_e3m2"),
                ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4"), ("mxint8", "mxint8"), ("int8_fp32", "int4_fp16"),
                ("int8_affine_g32", "int4_affine_g64"), ("fp8_e4m3_block128", "mxfp4"), ("nvfp8", "nvfp4"),
                ("mxfp8_e4m3", "nvfp4"))


def scaled(gen: torch.Generator) -> None:
    from microscale.reference_scaled import scaled_mm_reference

    for fa, fb in SCALED_PAIRS:
        if fa not in registry or fb not in registry:
            continue
        for m, n, k in ((1, 256, 512), (19, 300, 640), (300, 1024, 1024), (4096, 512, 2048)):
            def run(fa=fa, fb=fb, m=m, n=n, k=k):
                a = ms.quantize(torch.randn(m, k, generator=gen), fa, pad=True)
                b = ms.quantize(torch.randn(n, k, generator=gen) * 0.25, fb, pad=True)
                bias = torch.randn(n, generator=gen)
                got = ms.scaled_mm(a.to(DEV), b.to(DEV), bias=bias.to(DEV), out_dtype=torch.float32)
                return rel(got, scaled_mm_reference(a, b, bias, torch.float32))
            case("scaled", f"scaled_mm {fa} x {fb} {m}x{n}x{k}", 1e-5, run)
        # bf16 output: the linear op's kernels where both formats are exact in bf16 (rounding flips at
        # ties of the float32 sums only: far below the bound; a lost scale is not)
        for m, n, k in ((1, 4096, 4096), (5, 1024, 2048), (16, 1000, 2048), (33, 512, 1024), (64, 512, 1024),
                        (100, 1024, 1024), (777, 2048, 4096)):
            def run_bf16(fa=fa, fb=fb, m=m, n=n, k=k):
                from microscale.linear.backends.scaled_exact import linear_choice

                a = ms.quantize(torch.randn(m, k, generator=gen), fa, pad=True)
                b = ms.quantize(torch.randn(n, k, generator=gen) * 0.25, fb, pad=True)
                bias = torch.randn(n, generator=gen)
                ad, bd = a.to(DEV), b.to(DEV)
                kernel = linear_choice(ad, bd, torch.bfloat16)[0] or "tile/dequantize"
                got = ms.scaled_mm(ad, bd, bias=bias.to(DEV), out_dtype=torch.bfloat16)
                got2 = ms.scaled_mm(ad, bd, bias=bias.to(DEV), out_dtype=torch.bfloat16)  # (kept tables)
                ref = scaled_mm_reference(a, b, bias, torch.bfloat16)
                print(f"   route {kernel}", flush=True)
                return max(rel(got.float(), ref.float()), rel(got2.float(), ref.float()))
            case("scaled", f"scaled_mm bf16 {fa} x {fb} {m}x{n}x{k}", 1e-3, run_bf16)


KV_FORMATS = (("fp8_e4m3_fp32", True, None), ("mxfp8_e4m3", False, None), ("nvfp4", False, 0.02),
              ("mxfp4", False, None), ("int8_fp16", False, None), ("int4_fp16", False, None),
              ("int4_affine_g32", False, None))


def attention(gen: torch.Generator) -> None:
    from microscale.attention import PagedKVCache, attention_reference, choose_config, decode_attention, \
        extend_attention

    for fmt, per_token, gs in KV_FORMATS:
        for d, hkv, group, lens in ((128, 8, 8, [4000, 1, 333]), (64, 8, 8, [77, 2049]), (128, 2, 1, [17])):
            def filled():
                c = PagedKVCache(fmt, num_layers=1, num_kv_heads=hkv, head_dim=d, device=DEV, page_size=16,
                                 num_pages=sum(-(-n // 16) for n in lens) + 1, max_seqs=len(lens),
                                 per_token=per_token, global_scale=gs)
                for s, n in enumerate(lens):
                    c.append(0, torch.randn(n, hkv, d, generator=gen).to(DEV) * 2,
                             torch.randn(n, hkv, d, generator=gen).to(DEV), seqs=[s])
                return c

            def run_decode(opts):
                c = filled()
                q = torch.randn(len(lens), hkv * group, d, generator=gen).bfloat16().to(DEV)
                o = dict(opts)
                if o.pop("sinks", False):
                    o["sinks"] = torch.randn(hkv * group, generator=gen).to(DEV)
                got = decode_attention(q, c, 0, **o)
                return rel(got, attention_reference(q, c, 0, dtype=torch.float64, **o))

            for opts in ({}, {"sliding_window": 128, "sinks": True, "softcap": 30.0}):
                case("attention", f"decode {fmt} d={d} hkv={hkv} g={group} lens={lens} {sorted(opts)}", 1e-2,
                     lambda opts=opts: run_decode(opts))

            def run_graph():
                # replays of a captured decode, q rewritten before each (the kernel before the programmatic launch)
                c = filled()
                q = torch.randn(len(lens), hkv * group, d, generator=gen).bfloat16().to(DEV)
                # the default tiling (5 stages) with programmatic launches on: choose_config leaves them off here
                # (more query heads than SMs), and the chain is what this replays
                cfg = dataclasses.replace(choose_config(len(lens), hkv, group, max(lens), 1, q.device), pdl=True)
                decode_attention(q, c, 0, config=cfg)  # compiled outside the capture
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    out = decode_attention(q, c, 0, config=cfg)
                worst = 0.0
                for _ in range(3):
                    q.copy_(torch.randn(q.shape, generator=gen).bfloat16().to(DEV))
                    g.replay()
                    worst = max(worst, rel(out.clone(), attention_reference(q, c, 0, dtype=torch.float64)))
                return worst
            if hkv == 8 and d == 128:
                case("attention", f"decode in a CUDA graph {fmt} d={d} lens={lens}", 1e-2, run_graph)

            def run_extend():
                c = filled()
                q_lens = [min(n, 40) for n in lens]
                q = torch.randn(sum(q_lens), hkv * group, d, generator=gen).bfloat16().to(DEV)
                got = extend_attention(q, c, 0, q_lens)
                return rel(got, attention_reference(q, c, 0, q_lens=q_lens, dtype=torch.float64))
            case("attention", f"extend {fmt} d={d} hkv={hkv} g={group} lens={lens}", 1e-2, run_extend)


def fused(gen: torch.Generator) -> None:
    from microscale.embedding import embedding_reference
    from microscale.linear.norm_linear import rmsnorm_linear_reference

    for name in formats():
        def run_norm(name=name, m=1, gated=False):
            k = 1024
            x = torch.randn(m, k, generator=gen).bfloat16()
            nw = (torch.rand(k, generator=gen) + 0.5).bfloat16()
            w = ms.quantize(torch.randn(768, k, generator=gen), name)
            gate = torch.randn(m, k, generator=gen).bfloat16() if gated else None
            got = ms.rmsnorm_linear(x.to(DEV), nw.to(DEV), w.to(DEV), eps=1e-6,
                                    gate=None if gate is None else gate.to(DEV))
            return rel(got, rmsnorm_linear_reference(x, nw, w, eps=1e-6, gate=gate).double())
        for m, gated in ((1, False), (4, True), (200, False)):
            case("fused", f"rmsnorm_linear {name} M={m} gated={gated}", 1e-2,
                 lambda name=name, m=m, gated=gated: run_norm(name, m, gated))

        def run_batched(name=name):
            x = torch.randn(3, 1024, generator=gen).bfloat16()
            ws = [ms.quantize(torch.randn(n, 1024, generator=gen), name) for n in (512, 128, 128)]
            got = ms.linear_batched(x.to(DEV), [w.to(DEV) for w in ws])
            return max(rel(g, x.double() @ w.dequantize(torch.float64).T) for g, w in zip(got, ws))
        case("fused", f"linear_batched {name} q/k/v", 1e-2, run_batched)

        def run_embedding(name=name):
            q = ms.quantize(torch.randn(1000, 512, generator=gen), name, pad=True)
            ids = torch.randint(0, 1000, (37,), generator=gen)
            got = ms.embedding(ids.to(DEV), q.to(DEV), dtype=torch.bfloat16)
            want = embedding_reference(ids, q, torch.bfloat16)
            return float((got.cpu().view(torch.int16) != want.view(torch.int16)).sum())  # bit-exact: 0 mismatches
        case("fused", f"embedding {name} (mismatching elements)", 0, run_embedding)


def hadamard(gen: torch.Generator) -> None:
    from microscale.accuracy import block_hadamard
    from microscale.accuracy.hadamard import block_hadamard_reference

    for block in (16, 32, 64, 128, 256):
        for dtype in (torch.float32, torch.bfloat16):
            def run(block=block, dtype=dtype):
                x = torch.randn(333, 4096, generator=gen).to(dtype)
                got = block_hadamard(x.to(DEV), block)
                return rel(got, block_hadamard_reference(x.double(), block))
            case("hadamard", f"block_hadamard block={block} {dtype}", 1e-6 if dtype == torch.float32 else 1e-2, run)


def conv(gen: torch.Generator) -> None:
    from microscale.conv import conv2d_reference, quantize_conv_weight

    # (N, C_in, H, W, C_out, k, stride, padding, dilation, groups): implicit GEMM, strided, dilated,
    # grouped, depthwise, 1x1
    shapes = ((2, 64, 17, 23, 96, 3, 1, 1, 1, 1), (1, 96, 32, 32, 64, 3, 2, 1, 1, 1),
              (1, 64, 20, 20, 64, 3, 1, 2, 2, 1), (2, 64, 15, 15, 128, 3, 1, 1, 1, 4),
              (2, 128, 28, 28, 128, 3, 1, 1, 1, 128), (1, 256, 14, 14, 512, 1, 1, 0, 1, 1))
    for name in formats():
        for n, ci, h, w_, co, k, st, pd, dl, g in shapes:
            def run(name=name, n=n, ci=ci, h=h, w_=w_, co=co, k=k, st=st, pd=pd, dl=dl, g=g):
                x = torch.randn(n, ci, h, w_, generator=gen).bfloat16()
                q = quantize_conv_weight(torch.randn(co, ci // g, k, k, generator=gen), name)
                b = torch.randn(co, generator=gen)
                got = ms.conv2d(x.to(DEV), q.to(DEV), b.to(DEV), st, pd, dl, g)
                return rel(got, conv2d_reference(x.double(), q, b.double(), st, pd, dl, g))
            case("conv", f"conv2d {name} x{n}x{ci}x{h}x{w_} co={co} k={k} s={st} p={pd} d={dl} g={g}", 1e-2, run)


FAMILIES = {"moe": moe, "scaled": scaled, "attention": attention, "fused": fused, "hadamard": hadamard,
            "conv": conv}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(FAMILIES), help="comma-separated families")
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu for a dry run of the script")
    ap.add_argument("--formats", default="*", help="comma-separated glob patterns of registry formats (default: all)")
    a = ap.parse_args()
    global DEV
    PATTERNS[:] = a.formats.split(",")
    DEV = torch.device(a.device)
    if DEV.type == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA GPU (or --device cpu for a dry run)")
        return 2
    print(f"{torch.cuda.get_device_name() if DEV.type == 'cuda' else 'cpu'} torch {torch.__version__}", flush=True)
    for fam in a.only.split(","):
        t0 = time.time()
        FAMILIES[fam](torch.Generator().manual_seed(0))
        print(f"-- {fam}: {time.time() - t0:.0f} s", flush=True)
    bad = [r for r in ROWS if not r[3]]
    print(f"{len(ROWS) - len(bad)}/{len(ROWS)} cases ok")
    for r in bad:
        print("FAIL", *r[:3])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
