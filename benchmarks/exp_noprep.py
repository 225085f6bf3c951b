"""What the activation prep costs the one-token GEMV (H200): the call as routed, the GEMV
kernel alone (the prep's launch skipped after a first call filled its scratch; with its
programmatic launch, so it waits for the previous GEMV instead of the prep, and without),
and the prep alone. Graphs of 20 calls over weight copies past L2, burst and steady µs per
call as in ``exp_power.py``. First (``HANDOFF=0``: not) the latency of one link of a launch chain
of empty kernels.

    [HANDOFF=1] [PARTS=0: the call and the prep only] [READS=0: no read ceilings]
    [FMTS=mxfp8_e4m3,nvfp4] [IDLE=0.8] [SECONDS_WINDOW=0.6] python benchmarks/exp_noprep.py [NxK ...]"""
import dataclasses
import os
import statistics
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

import microscale as ms
from microscale import qlinear as L
from microscale.kernels import _gemv_kernels as kern
from exp_clocks import graph_of, replay_series  # a sibling script: benchmarks/ is on sys.path when run

dev = torch.device("cuda")
SECONDS = float(os.environ.get("SECONDS_WINDOW", "0.6"))
IDLE = float(os.environ.get("IDLE", "0.8"))
FMTS = os.environ.get("FMTS", "mxfp8_e4m3,int8_fp16,nvfp4,mxfp4").split(",")
_launch = L.launch
SKIP = [None]


def launch(fn, grid, *a, **kw):
    if fn is not SKIP[0]:
        _launch(fn, grid, *a, **kw)


L.launch = launch


def timed(fns: list, skip) -> tuple[float, float]:
    SKIP[0] = None
    fns[0]()  # fills the scratch the skipped kernel would write
    SKIP[0] = skip
    try:
        _, us = replay_series(*graph_of(fns), SECONDS, IDLE)
    finally:
        SKIP[0] = None
    return statistics.median(us[:max(1, len(us) // 20)]), statistics.median(us[len(us) // 2:])


@triton.jit
def _read_kernel(w_ptr, out_ptr, stride_w, KW: tl.constexpr, R: tl.constexpr, BKW: tl.constexpr):
    """A read-only stream of the weight's code words (the GEMV's row tiles and steps), XOR-folded."""
    rows = tl.program_id(0) * R + tl.arange(0, R)
    acc = tl.zeros([R, BKW], dtype=tl.int32)
    for k in range(0, KW, BKW):
        acc ^= tl.load(w_ptr + rows[:, None] * stride_w + k + tl.arange(0, BKW)[None, :])
    tl.store(out_ptr + rows, tl.xor_sum(acc, 1))


def read_ceiling(q, r: int, warps: int, stages: int) -> tuple[float, float]:
    """Burst / steady µs per read of ``q``'s codes (and copies) by ``_read_kernel``."""
    ws = [c.data.view(torch.int32).reshape(c.shape[0], -1) for c in q]
    out = torch.empty(ws[0].shape[0], dtype=torch.int32, device=dev)
    fns = [lambda w=w: _read_kernel[(w.shape[0] // r,)](w, out, w.stride(0), KW=w.shape[1], R=r, BKW=256,
                                                        num_warps=warps, num_stages=stages) for w in ws]
    return timed(fns, None)


@triton.jit
def _hop_kernel(out_ptr, PDL: tl.constexpr):
    """An empty link of a launch chain: (programmatic launch: trigger the next, wait for the
    previous) then one store."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    tl.store(out_ptr + tl.program_id(0), 1)


def handoffs() -> list:
    """µs per link of chains of empty kernels (8 programs of 4 warps, like the prep; 4096 of
    2 warps, like the GEMV), with and without programmatic launches: the launch-chain latency
    that the prep adds to each call, without its loads and stores."""
    out = torch.zeros(4096, dtype=torch.int32, device=dev)
    res = []
    for progs, warps in ((8, 4), (4096, 2)):
        for pdl in (True, False):
            fn = [lambda p=pdl, g=progs, w=warps: _hop_kernel[(g,)](out, PDL=p, num_warps=w,
                                                                     **({"launch_pdl": True} if p else {}))]
            b, s = timed(fn, None)
            res.append(("-", "-", f"empty x{progs}, {'pdl' if pdl else 'no pdl'}", 0.0, b, s))
            print(*res[-1], flush=True)
    return res


rows = handoffs() if os.environ.get("HANDOFF", "1") == "1" else []
for shape in sys.argv[1:] or ["8192x8192"]:
    n, k = map(int, shape.split("x"))
    w = torch.randn(n, k, device=dev)
    x = torch.randn(1, k, device=dev).to(torch.bfloat16)
    for fmt in FMTS:
        q0 = ms.quantize(w, fmt)
        extra = max(1, -(-200_000_000 // q0.nbytes) - 1)
        qs = [q0] + [dataclasses.replace(q0, data=q0.data.clone(), scales=q0.scales.clone()) for _ in range(extra)]
        base = L.choose_gemv_config(n, k, dev, 1, q0.fmt.element.bits)
        ref = x.double() @ q0.dequantize().double().T
        err = ((L.gemv(x, q0, None, base).double() - ref).norm() / ref.norm()).item()
        variants = [("call", base, None), ("gemv only", base, kern._prep_x_kernel),
                    ("gemv only, no pdl", dataclasses.replace(base, pdl=False), kern._prep_x_kernel),
                    ("call, no pdl", dataclasses.replace(base, pdl=False), None),
                    ("prep only", base, kern._gemv_kernel)]
        if os.environ.get("PARTS", "1") == "0":  # the call and the prep alone
            variants = [variants[0], variants[-1]]
        for name, cfg, skip in variants:
            b, s = timed([lambda q=q, c=cfg: L.gemv(x, q, None, c) for q in qs], skip)
            rows.append((shape, fmt, name, err, b, s))
            print(*rows[-1], flush=True)
        if fmt in ("mxfp8_e4m3", "nvfp4") and os.environ.get("READS", "1") == "1":
            for r, wp, st in [(2, 2, 4), (4, 2, 4), (8, 4, 4), (2, 2, 8)]:
                b, s = read_ceiling(qs, r, wp, st)
                rows.append((shape, fmt, f"read codes r{r} w{wp} s{st}", 0.0, b, s))
                print(*rows[-1], flush=True)
        qs = q0 = None
print(f"\n{'shape':11s} {'fmt':11s} {'variant':20s} {'rel err':>9s} {'burst us':>8s} {'steady us':>9s}")
for sh, f, v, e, b, s in rows:
    print(f"{sh:11s} {f:11s} {v:20s} {e:9.2e} {b:8.1f} {s:9.1f}")
