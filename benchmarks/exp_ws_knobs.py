"""``prefill_ws`` knobs at many tokens against cuBLAS (bf16, or fp16), timed like the matrix suite (H200).

Per shape and format: every variant (``group_t`` token tiles sweeping the row tiles together,
``stages`` activation ring slots, ``block_t``) checked against float64 once, then ROUNDS
alternated rounds in which cuBLAS and each variant are timed as CUDA-graph replays over
~300 ms windows (``microscale.bench._timing.time_cuda``, graph='always'), each after the
board has left any power cap (``Monitor.settle``), as the suite does. Prints each variant's
time and its ratio to the same round's cuBLAS time, and a median-ratio table last.

    [M=4096] [FMTS=nvfp4,mxfp4] [ROUNDS=2] [VARIANTS="linear;g4 s4;g2 s4;g8 s4"] [DTYPE=fp16] \\
        python benchmarks/exp_ws_knobs.py 8192x8192 8192x28672

``DTYPE=fp16``: float16 activations, against cuBLAS fp16. ``DATA=suite``: weights and activations as the
benchmark suite makes them (normal values times a random power of two per row, 2^-4..2^4) instead of plain
normal values. ``WARM=S``: S seconds of back-to-back cuBLAS calls on the first shape before the first
timing (the suites reach their 16-token rows after minutes of load).

A variant is ``linear`` (``ms.linear`` as routed; the timings replay CUDA graphs, so the routes
taken while capturing), ``prefill`` (the Triton prefill kernel), ``ws`` (``prefill_ws`` as it
chooses), ``dtma`` (``decode_tma``; words ``t16``: 16 token columns, ``p132``: 132 programs, ``r256``: 256-row tiles; ``dtma post`` / ``dtma nopost``: int4 with
the MMA results scaled / each weight pair scaled), ``gemv_mma``, ``gemv``, ``xperm`` (``prefill_ws``'s K-permutation kernel
alone, not checked) or ``g<group_t> s<stages> [t<block_t>] [nosplit]``
(``prefill_ws`` with those arguments), each optionally followed by ``+NAME`` / ``-NAME`` words (a ``qlinear``
switch set to True / False for the variant) or ``NAME=INT`` words (set to that integer); the default set sweeps group_t 1-16 at the routed
stages. ``M`` may list several token counts (``M=64,128``).
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import microscale as ms
from microscale import qlinear as L
from microscale.bench import _clocks, _timing

dev = torch.device("cuda")
MS = [int(m) for m in os.environ.get("M", "4096").split(",")]
FMTS = os.environ.get("FMTS", "nvfp4,mxfp4").split(",")
ROUNDS = int(os.environ.get("ROUNDS", "2"))
VARIANTS = os.environ.get("VARIANTS", "linear;g4 s4;g1 s4;g2 s4;g8 s4;g16 s4;g4 s3").split(";")
SHAPES = [tuple(map(int, a.split("x"))) for a in sys.argv[1:]] or [(8192, 8192), (8192, 28672)]
DT = torch.float16 if os.environ.get("DTYPE", "bf16") == "fp16" else torch.bfloat16
DATA = os.environ.get("DATA", "normal")
WARM = float(os.environ.get("WARM", "0"))


def rand(shape: tuple, g: torch.Generator) -> torch.Tensor:
    """float32 random data: normal, or (``DATA=suite``) times 2^e per row, e uniform in -4..4."""
    x = torch.randn(shape, device=dev, generator=g)
    if DATA == "suite":
        x = x * torch.exp2(torch.randint(-4, 5, (shape[0], 1), device=dev, generator=g).float())
    return x


def op(v: str, x: torch.Tensor, q) -> torch.Tensor:
    """Variant ``v`` on ``x`` and ``q``: ``linear``, ``dtma``, or ``prefill_ws`` with ``"g4 s3 t256"``'s arguments;
    words ``+NAME`` / ``-NAME`` set the ``qlinear`` switch ``NAME`` to True / False for the call
    (``"dtma -_DT_WARP_ARRIVE"``)."""
    flags = {t[1:]: t[0] == "+" for t in v.split() if t[0] in "+-"}
    flags.update((t.split("=")[0], int(t.split("=")[1])) for t in v.split() if "=" in t)
    if flags:
        saved = {a: getattr(L, a) for a in flags}
        for a, val in flags.items():
            setattr(L, a, val)
        try:
            return op(" ".join(t for t in v.split() if t[0] not in "+-" and "=" not in t), x, q)
        finally:
            for a, val in saved.items():
                setattr(L, a, val)
    if v == "linear":
        return ms.linear(x, q)
    if v == "dtma":
        return L.decode_tma(x, q)
    if v in ("dtma post", "dtma nopost"):  # 4-bit integers: MMA results scaled, or each weight pair
        saved, L._DT_POST_SCALE = L._DT_POST_SCALE, v == "dtma post"
        try:
            return L.decode_tma(x, q)
        finally:
            L._DT_POST_SCALE = saved
    words = v.split()
    if words[0] == "dtma":  # "dtma t16 p132 r256": token columns, programs (equal stream-K shares), tile rows
        names = {"t": "tokens", "p": "programs", "r": "rows"}
        return L.decode_tma(x, q, **{names[w[0]]: int(w[1:]) for w in words[1:]})
    if v == "gemv_mma":
        return L.gemv_mma(x, q)
    if v == "gemv":
        return L.gemv(x, q)
    if v == "ws":  # prefill_ws with its default tile and ring choice
        return L.prefill_ws(x, q)
    if v == "prefill":  # the Triton tensor-core prefill kernel (the route of formats prefill_ws does not take)
        return L.prefill(x, q)
    if v == "xperm":  # prefill_ws's K-permutation kernel alone
        from microscale.kernels import _prefill_gluon as pg
        xp = torch.empty_like(x)
        L.launch(pg._xperm_kernel, (L.cdiv(x.shape[0], 32), x.shape[1] // 64), x, xp, x.shape[0], x.stride(0),
                 K=x.shape[1], BLOCK_R=32, num_warps=4)
        return xp
    names = {"g": "group_t", "s": "stages", "t": "block_t"}
    kw = {names[t[0]]: int(t[1:]) for t in v.split() if t != "nosplit"}
    return L.prefill_ws(x, q, split_tail=False if "nosplit" in v.split() else None, **kw)


def timed(fn, sets: list, mon: _clocks.Monitor) -> float:
    """Median µs per call of ``fn(*s)`` rotating over ``sets``, a graph of back-to-back calls
    over ~300 ms, started uncapped; the clocks during the timing printed (power cap share, SM clock)."""
    mon.settle()
    t0 = time.time()
    us = _timing.time_cuda(fn, sets, graph="always").median_ms * 1e3
    st = mon.window(t0, time.time())
    print(f"    clocks: {st.summary() if st is not None else 'not sampled'}", flush=True)
    return us


def copies(t, nbytes: int, clone) -> list:
    """``[(t,), (clone(t),), ...]``: enough copies for 200 MB (weights rotate past the L2, as in the suite)."""
    return [(t,)] + [(clone(t),) for _ in range(-(-200_000_000 // nbytes) - 1)]


def main() -> None:
    rows = []  # (shape, fmt, variant, round, us, ratio)
    g = torch.Generator(device=dev).manual_seed(0)
    with _clocks.Monitor(dev) as mon:
        if WARM > 0:  # a sustained load first, as the suites have before their 16-token rows
            n, k = SHAPES[0]
            wb, xb = torch.randn(n, k, device=dev, dtype=DT), torch.randn(16, k, device=dev, dtype=DT)
            end = time.time() + WARM
            while time.time() < end:
                for _ in range(200):
                    F.linear(xb, wb)
                torch.cuda.synchronize()
        for M, (n, k) in [(m, s) for m in MS for s in SHAPES]:
            w = rand((n, k), g)
            x = rand((M, k), g).to(DT)
            wbs = copies(w.to(DT), 2 * n * k, torch.clone)
            for fmt in FMTS:
                q = ms.quantize(w, fmt)
                qs = copies(q, q.nbytes, lambda q: dataclasses.replace(q, data=q.data.clone(),
                                                                       scales=q.scales.clone()))
                ref = x[:64].double() @ q.dequantize().double().T
                ok = []
                for v in VARIANTS:
                    if v == "xperm":  # no output to check
                        ok.append(v)
                        continue
                    try:
                        out = op(v, x, q)
                        err = ((out[:64].double() - ref).norm() / ref.norm()).item()
                    except Exception as e:  # noqa: BLE001 - an experiment: report and go on
                        print(f"{n}x{k} {fmt} {v}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                        continue
                    print(f"{n}x{k} {fmt} {v}: rel err {err:.2e}", flush=True)
                    if err < 1e-2:
                        ok.append(v)
                for r in range(ROUNDS):
                    base = timed(lambda wb: F.linear(x, wb), wbs, mon)
                    rows.append((f"{M}x{n}x{k}", str(DT)[6:], "cuBLAS", r, base, 1.0))
                    print(*rows[-1], flush=True)
                    for v in ok:
                        us = timed(lambda q, v=v: op(v, x, q), qs, mon)
                        rows.append((f"{M}x{n}x{k}", fmt, v, r, us, base / us))
                        print(*rows[-1], flush=True)
    print(f"\nMedian over {ROUNDS} round(s) of each variant's ratio to its round's cuBLAS")
    print(f"{'shape':17s} {'fmt':6s} {'variant':24s} {'us':>9s} {'vs cuBLAS':>9s}")
    keys = list(dict.fromkeys((s, f, v) for s, f, v, *_ in rows))
    for s, f, v in keys:
        sel = [(us, ra) for s2, f2, v2, _, us, ra in rows if (s2, f2, v2) == (s, f, v)]
        print(f"{s:17s} {f:6s} {v:24s} {statistics.median(u for u, _ in sel):9.1f} "
              f"{statistics.median(r for _, r in sel):9.3f}")


if __name__ == "__main__":
    main()
