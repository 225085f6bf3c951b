"""What ``decode_tma``'s separate K-permutation launch (``_xperm_kernel``) costs a call (H200, timing only).

Per shape and token count: ``decode_tma`` as it runs (the permutation kernel, then the decode kernel) against the
same call with the permutation launch skipped (the decode kernel reads the scratch the first call permuted: the
output stays correct for fixed activations), CUDA-graph replays over weight copies past L2, alternated rounds.

    [M=16] [ROUNDS=2] python benchmarks/exp_xperm_cost.py 28672x8192 8192x8192
"""
from __future__ import annotations

import dataclasses
import os
import sys

import torch

import microscale as ms
from microscale import qlinear as L
from microscale.bench import _timing
from microscale.kernels import _prefill_gluon as pg

dev = torch.device("cuda")
MS = [int(m) for m in os.environ.get("M", "16").split(",")]
ROUNDS = int(os.environ.get("ROUNDS", "2"))
SHAPES = [tuple(map(int, a.split("x"))) for a in sys.argv[1:]] or [(28672, 8192)]
real_launch = L.launch


def skipping(fn, grid, *args, **kw):
    """``launch`` without the permutation kernel."""
    if fn is not pg._xperm_kernel:
        real_launch(fn, grid, *args, **kw)


def main() -> None:
    g = torch.Generator(device=dev).manual_seed(0)
    for m in MS:
        for n, k in SHAPES:
            q = ms.quantize(torch.randn(n, k, device=dev, generator=g), "nvfp4")
            qs = [(q,)] + [(dataclasses.replace(q, data=q.data.clone(), scales=q.scales.clone()),)
                           for _ in range(-(-200_000_000 // q.nbytes) - 1)]
            x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            want = L.decode_tma(x, q)
            L.launch = skipping
            try:
                same = torch.equal(L.decode_tma(x, q), want)
            finally:
                L.launch = real_launch
            print(f"{m}x{n}x{k}: without the permutation launch, same output: {same}", flush=True)
            for r in range(ROUNDS):
                for name, fn in (("as run", real_launch), ("no xperm", skipping)):
                    L.launch = fn
                    try:
                        us = _timing.time_cuda(lambda q: L.decode_tma(x, q), qs, graph="always").median_ms * 1e3
                    finally:
                        L.launch = real_launch
                    print(f"{m}x{n}x{k} round {r} {name:9s} {us:7.2f} us", flush=True)


if __name__ == "__main__":
    main()
