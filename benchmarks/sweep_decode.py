"""Config sweep of the two bandwidth-bound decode kernels that miss their copy-bandwidth targets: quantized-KV
``decode_attention`` (:class:`microscale.attention.AttentionConfig`) and the MoE decode GEMM
(:class:`microscale.moe.decode.DecodeConfig`), on a Hopper GPU.

    python benchmarks/sweep_decode.py [--json OUT.json] [--only attention|moe] [--quick]
        [--formats mxfp4,nvfp4] [--tokens 1,8] [--experts 32,128]   # (subsets of the MoE sweep)
    TRITON_INTERPRET=1 python benchmarks/sweep_decode.py --smoke   # the script itself on a CPU, tiny shapes
    ncu --clock-control none -k regex:"paged_attn|decode_mma" --section SpeedOfLight --section WarpStateStats \
        python benchmarks/sweep_decode.py --once                  # the chosen configs, each run once, untimed

Each config is first checked on the GPU against the reference (attention: float32 over the dequantized cache,
relative Frobenius error < 1e-2; MoE: float64 grouped product, < 1e-2), then timed as CUDA-graph replays
rotating over enough input sets that the bytes of one rotation exceed three times the L2 cache, so the KV pages
and expert weights come from HBM as they do in a model. The copy bandwidth of the same run is measured first;
each row prints time, GB/s on the bytes model (attention: the KV codes + scales read + q + out; MoE: the
touched experts' codes + scales + x + out) and % of copy, one JSON line per row. The chosen config
(``choose_config`` / ``choose_decode_config``) is the first row of each group. Used to set those choices
(docs/decisions/attention-decode.md, docs/decisions/moe-grouped-kernel.md).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import microscale as ms  # noqa: E402
from microscale import attention as attn  # noqa: E402
from microscale.bench._timing import time_cuda  # noqa: E402
from microscale.bench.report import write_text_atomic  # noqa: E402
from microscale.moe import prepare_experts  # noqa: E402
from microscale.moe.decode import DecodeConfig, choose_decode_config, decode_run  # noqa: E402
from microscale.moe.reference import grouped_linear_reference  # noqa: E402
from microscale.runtime import target  # noqa: E402


#: where and how big: the GPU sweep, or ``--smoke`` (CPU under the interpreter: tiny shapes, one call timed)
DEV, SMOKE, ONCE = "cuda", False, False


def _time(fn, sets: list, target_ms: float) -> float:
    """Median ms of ``fn(*s)`` over CUDA-graph replays rotating over ``sets`` (wall time of one call in smoke)."""
    if ONCE:  # under a profiler: one more call, no timing
        fn(*sets[0])
        return float("nan")
    if SMOKE:
        import time
        t0 = time.perf_counter()
        fn(*sets[0])
        return (time.perf_counter() - t0) * 1e3
    return time_cuda(fn, sets, graph="always", target_ms=target_ms).median_ms


def copy_gbs() -> float:
    """Read + write GB/s of a 1 GiB device copy of float32 (the ceiling the % columns are of, as the bench
    measures it: a uint8 copy ran at 81% of that speed on an H100)."""
    a = torch.empty(2**18 if SMOKE else 2**28, dtype=torch.float32, device=DEV)
    b = torch.empty_like(a)
    ms_ = _time(lambda: b.copy_(a), [()], 300)
    return 2 * a.numel() * a.element_size() / ms_ / 1e6


def _sets(bytes_one: int) -> int:
    """Input sets whose rotation reads at least 3x the L2 cache."""
    if SMOKE:
        return 2
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, min(16, -(-3 * l2 // max(1, bytes_one))))


def _row(rows: list, row: dict) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)


def sweep_attention(rows: list, copy: float, quick: bool) -> int:
    """decode_attention at 32k keys, 64 q / 8 kv heads, head_dim 128, batch 1 and 8."""
    hq, hkv, d, length, page = (8, 1, 128, 64, 16) if SMOKE else (64, 8, 128, 32768, 16)
    fill = min(length, 8192)
    bad = 0
    gen = torch.Generator(device=DEV).manual_seed(0)
    for fmt_name in ("fp8_e4m3_block128", "nvfp4", "mxfp4"):
        fmt = attn.kv_format(fmt_name, d)
        gs = 1.0 if fmt.global_scale else None
        for b in (1, 8):
            probe = attn.PagedKVCache(fmt, num_layers=1, num_kv_heads=hkv, head_dim=d, num_pages=1, page_size=page)
            kv_bytes = b * length * probe.nbytes_per_token + 4 * b * hq * d
            pages = length // page

            def make():
                cache = attn.PagedKVCache(fmt, num_layers=1, num_kv_heads=hkv, head_dim=d, num_pages=b * pages,
                                          page_size=page, max_seqs=b, max_pages_per_seq=pages, device=DEV,
                                          global_scale=gs)
                for s in range(b):
                    for t in range(0, length, fill):
                        kv = torch.randn((2, fill, hkv, d), generator=gen, device=DEV).bfloat16()
                        cache.append(0, kv[0], kv[1], seqs=[s])
                return torch.randn((b, hq, d), generator=gen, device=DEV).bfloat16(), cache

            sets = [make() for _ in range(_sets(kv_bytes))]
            q0, c0 = sets[0]
            ref = attn.attention_reference(q0, c0, 0).float()  # every sequence of the batch
            base = attn.choose_config(b, hkv, hq // hkv, length, 1, q0.device)
            sms = 1 if SMOKE else target.num_sms(q0.device)
            # the chosen count, halved, doubled, quadrupled; the most that one or two resident programs per SM hold;
            # and the earlier rule's (at least 2 programs per SM)
            splits = sorted({base.num_splits, max(1, base.num_splits // 2), 2 * base.num_splits,
                             4 * base.num_splits, max(1, sms // (b * hkv)), max(1, 2 * sms // (b * hkv)),
                             max(1, 3 * sms // (b * hkv)), min(256, -(-2 * sms // (b * hkv)))})
            # stages: 2-4 give the page-table -> codes load chain one buffer (the next step's codes are issued after
            # this step's MMAs and waited for at the top); 5 double-buffers them, a whole step of prefetch
            tiles = list(itertools.product((64, 128), (4, 8), (2, 3, 4, 5, 6))) if not quick else \
                [(128, 4, 3), (128, 8, 3), (128, 4, 5), (64, 4, 5)]
            grid = [(bn, nw, st, sp, None) for (bn, nw, st), sp in itertools.product(tiles, splits)]
            # the register cap that fits three 4-warp programs of 128 keys an SM (182 -> 168 registers, no spill)
            grid += [(128, 4, 3, sp, 168) for sp in splits]
            seen = set()
            # the chosen config with programmatic launches toggled, and as it was before 5 stages and those launches
            ab = [dataclasses.replace(base, pdl=not base.pdl), dataclasses.replace(base, num_stages=3, pdl=False)]
            cands = [base] + ab + [attn.AttentionConfig(block_n=bn, rows=base.rows, num_splits=sp, num_warps=nw,
                                                   num_stages=st, maxnreg=mr) for bn, nw, st, sp, mr in grid]
            for cfg in cands[:1] if ONCE else cands:
                if cfg in seen:
                    continue
                seen.add(cfg)
                row = dict(op="decode_attention", format=fmt_name, batch=b, context=length, config=repr(cfg),
                           chosen=cfg == base)
                try:
                    y = attn.decode_attention(q0, c0, 0, config=cfg)
                    err = float((y.float() - ref).norm() / ref.norm())
                    if not err < 1e-2:
                        raise AssertionError(f"rel error {err:.3g} against the reference")
                    t = _time(lambda q, c, cf=cfg: attn.decode_attention(q, c, 0, config=cf), sets, 100)
                    row.update(rel_err=err, us=t * 1e3, gbs=kv_bytes / t / 1e6, pct_copy=100 * kv_bytes / t / 1e6 / copy)
                except Exception as e:  # noqa: BLE001 - a failing config is a row, not the end of the sweep
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    bad += 1
                _row(rows, row)
            del sets
            # the bf16 peer on the same shape: SDPA over dense K/V
            k = torch.randn((b, hkv, length, d), generator=gen, device=DEV).bfloat16()
            v = torch.randn_like(k)
            q = torch.randn((b, hq, 1, d), generator=gen, device=DEV).bfloat16()
            dense = [(q, k, v)] + [(q, torch.randn_like(k), torch.randn_like(v)) for _ in range(
                _sets(4 * k.numel()) - 1)]
            t = _time(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                      dense, 100)
            _row(rows, dict(op="sdpa_bf16", format="bf16", batch=b, context=length, us=t * 1e3,
                            gbs=4 * k.numel() / t / 1e6, pct_copy=100 * 4 * k.numel() / t / 1e6 / copy))
            del dense, k, v
    return bad


def sweep_moe(rows: list, copy: float, quick: bool, formats: tuple = ("mxfp4", "nvfp4"), token_counts: tuple = (1, 8),
              experts: tuple | None = None) -> int:
    """The decode GEMM alone (gate/up and down projections of gpt-oss-20b / -120b shapes) at 1 and 8 tokens,
    top-4, one routed row per (token, expert) pair, touched experts distinct per input set (``formats``,
    ``token_counts``, ``experts``: subsets)."""
    bad = 0
    gen = torch.Generator(device=DEV).manual_seed(1)
    shapes = ((4, 64, 256),) if SMOKE else ((32, 5760, 2880), (32, 2880, 2880), (128, 5760, 2880))
    shapes = tuple(sh for sh in shapes if experts is None or SMOKE or sh[0] in experts)
    for fmt_name in formats:
        for e, n, k in shapes:
            w = ms.quantize(torch.randn((e, n, k), generator=gen, device=DEV) * 0.05, fmt_name)
            pe = prepare_experts(w)
            per_expert = (w.data.numel() + w.scales.numel() * w.scales.element_size()) // e
            for tokens in token_counts:
                r = 4 * tokens
                sets = []
                for _ in range(16):
                    # r rows over min(r, e) distinct experts, grouped by expert
                    touched = torch.randperm(e, generator=gen, device=DEV)[:min(r, e)]
                    counts = torch.bincount(touched.repeat(-(-r // touched.numel()))[:r], minlength=e)
                    offs = torch.zeros(e + 1, dtype=torch.int32, device=DEV)
                    offs[1:] = torch.cumsum(counts, 0)
                    x = torch.randn((r, k), generator=gen, device=DEV).bfloat16()
                    sets.append((x, offs, int((counts > 0).sum())))
                nbytes = sum(s[2] for s in sets) / len(sets) * per_expert + r * k * 2 + r * n * 2
                n_sets = _sets(int(nbytes))
                sets = sets[:n_sets]
                x0, o0, _ = sets[0]
                ref = grouped_linear_reference(x0.double(), w.dequantize(torch.float64), o0)
                base = choose_decode_config(r, e, n, k, x0.device)
                grid = [base] + [DecodeConfig(rg, wpl, nw, sk) for rg, wpl, nw, sk in itertools.product(
                    (1, 2) if quick else (1, 2, 4), (8,) if quick else (4, 8, 16), (1, 2, 4), (1, 2, 4, 8, 16))]
                # smoke: the decode kernel's inline PTX does not run in the interpreter; the public op's CPU path
                # (the float64 reference) stands in, so that the rest of the script is exercised
                run = (lambda x, o, c: ms.grouped_linear(x, pe, o)) if SMOKE else (
                    lambda x, o, c: decode_run(x, pe, o, config=c))
                for cfg in [base] if ONCE else dict.fromkeys(grid):
                    row = dict(op="moe_decode", format=fmt_name, experts=e, n=n, k=k, tokens=tokens, rows=r,
                               config=repr(cfg), chosen=cfg == base)
                    try:
                        y = run(x0, o0, cfg)
                        err = float((y.double() - ref).norm() / ref.norm())
                        if not err < 1e-2:
                            raise AssertionError(f"rel error {err:.3g} against float64")
                        t = _time(lambda x, o, _n, c=cfg: run(x, o, c), sets, 60)
                        row.update(rel_err=err, us=t * 1e3, gbs=nbytes / t / 1e6, pct_copy=100 * nbytes / t / 1e6 / copy)
                    except ValueError as ex:  # a config that does not split K evenly: not a row
                        if "does not split" in str(ex):
                            continue
                        row["error"] = f"ValueError: {str(ex)[:300]}"
                        bad += 1
                    except Exception as ex:  # noqa: BLE001
                        row["error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
                        bad += 1
                    _row(rows, row)
            del w, pe
    return bad


def moe_breakdown(rows: list, copy: float) -> int:
    """Where the time of ``ms.moe_experts`` at 1 and 8 tokens goes (MXFP4, gpt-oss-20b and -120b shapes, top-4,
    distinct experts per step): the whole forward, and its parts alone with the chosen configs: the routing
    launch, the gate/up decode GEMM (with the gather and SwiGLU epilogue), the down decode GEMM (with the
    weighted scatter) and the sum over the top-k slots. Bytes: the touched experts' gate/up + down weights."""
    from microscale.moe.grouped import route, slot_sum
    from microscale.moe.decode import DECODE_TILE_ROWS
    from microscale.moe.reference import moe_experts_reference

    bad = 0
    gen = torch.Generator(device=DEV).manual_seed(2)
    h, i, top = (64, 64, 4) if SMOKE else (2880, 2880, 4)
    for e in ((8,) if SMOKE else (32, 128)):
        gu_q = ms.quantize(torch.randn((e, 2 * i, h), generator=gen, device=DEV) * 0.05, "mxfp4")
        dn_q = ms.quantize(torch.randn((e, h, i), generator=gen, device=DEV) * 0.05, "mxfp4")
        gu, dn = prepare_experts(gu_q), prepare_experts(dn_q)
        per_expert = sum((q.data.numel() + q.scales.numel() * q.scales.element_size()) // e for q in (gu_q, dn_q))
        for t in (1, 8):
            r = t * top
            nbytes = min(r, e) * per_expert
            sets = []
            for _ in range(_sets(nbytes)):
                idx = torch.stack([torch.randperm(e, generator=gen, device=DEV)[:top] for _ in range(t)]) \
                    if r > e else torch.randperm(e, generator=gen, device=DEV)[:r].reshape(t, top)
                sets.append((torch.randn((t, h), generator=gen, device=DEV).bfloat16(), idx,
                             torch.softmax(torch.randn((t, top), generator=gen, device=DEV), -1).bfloat16()))
            x0, i0, w0 = sets[0]
            row = dict(op="moe_experts", format="mxfp4", experts=e, hidden=h, inter=i, tokens=t, touched_bytes=nbytes)
            try:
                y = ms.moe_experts(x0, gu, dn, i0, w0)
                ref = moe_experts_reference(x0.double(), gu_q.dequantize(torch.float64), dn_q.dequantize(torch.float64),
                                            i0, w0.double())
                err = float((y.double() - ref).norm() / ref.norm())
                if not err < 1e-2:
                    raise AssertionError(f"rel error {err:.3g} against float64")
                row["rel_err"] = err
                t_all = _time(lambda x, ix, w: ms.moe_experts(x, gu, dn, ix, w), sets, 60)
                # the parts, each on the inputs the forward gives it
                parts = []
                for x, ix, w in sets:
                    perm, offs, te, tb = route(ix, e, DECODE_TILE_ROWS)
                    hh = decode_run(x, gu, offs, rows=perm, gather_div=top, tiles=(te, tb),
                                    act=("swiglu", None, None, "concat"))
                    yy = decode_run(hh, dn, offs, rows=perm, tiles=(te, tb), scatter=w.reshape(-1).contiguous())
                    parts.append((x, ix, w, perm, offs, te, tb, hh, yy))
                t_route = _time(lambda x, ix, w, *_: route(ix, e, DECODE_TILE_ROWS), parts, 30)
                t_gu = _time(lambda x, ix, w, perm, offs, te, tb, *_: decode_run(
                    x, gu, offs, rows=perm, gather_div=top, tiles=(te, tb), act=("swiglu", None, None, "concat")),
                    parts, 60)
                t_dn = _time(lambda x, ix, w, perm, offs, te, tb, hh, _y: decode_run(
                    hh, dn, offs, rows=perm, tiles=(te, tb), scatter=w.reshape(-1)), parts, 60)
                t_sum = _time(lambda *a: slot_sum(a[-1], top, torch.bfloat16), parts, 30)
                row.update(us=t_all * 1e3, pct_copy=100 * nbytes / t_all / 1e6 / copy, route_us=t_route * 1e3,
                           gate_up_us=t_gu * 1e3, down_us=t_dn * 1e3, sum_us=t_sum * 1e3,
                           gemms_pct_copy=100 * nbytes / (t_gu + t_dn) / 1e6 / copy)
            except Exception as ex:  # noqa: BLE001
                row["error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
                bad += 1
            _row(rows, row)
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the rows here (atomically)")
    ap.add_argument("--only", choices=("attention", "moe", "moe_forward"), default=None)
    ap.add_argument("--quick", action="store_true", help="a smaller grid")
    ap.add_argument("--smoke", action="store_true", help="run the script on a CPU (TRITON_INTERPRET=1), tiny shapes")
    ap.add_argument("--once", action="store_true", help="each chosen config checked and run once more, untimed "
                    "(to run under a profiler)")
    ap.add_argument("--formats", default="mxfp4,nvfp4", help="the MoE sweep's formats (comma-separated)")
    ap.add_argument("--tokens", default="1,8", help="the MoE sweep's token counts (comma-separated)")
    ap.add_argument("--experts", default=None, help="the MoE sweep's expert counts: 32 and/or 128 (default both)")
    args = ap.parse_args()
    global DEV, SMOKE, ONCE
    ONCE = args.once
    if args.smoke:
        DEV, SMOKE, args.quick = "cpu", True, True
    elif not torch.cuda.is_available() or target.capability(torch.device("cuda")) != (9, 0):
        print("needs a Hopper GPU", file=sys.stderr)
        return 2
    rows: list = []
    copy = copy_gbs()
    _row(rows, dict(op="copy", gbs=copy, device="cpu" if SMOKE else torch.cuda.get_device_name(),
                    torch=torch.__version__))
    bad = 0
    if args.only in (None, "attention"):
        bad += sweep_attention(rows, copy, args.quick)
    if args.only in (None, "moe_forward") and not SMOKE:  # (smoke: the decode kernel's PTX needs a GPU)
        bad += moe_breakdown(rows, copy)
    if args.only in (None, "moe"):
        bad += sweep_moe(rows, copy, args.quick, tuple(args.formats.split(",")),
                         tuple(int(t) for t in args.tokens.split(",")),
                         None if args.experts is None else tuple(int(e) for e in args.experts.split(",")))
    if args.json:
        write_text_atomic(args.json, json.dumps(rows, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
