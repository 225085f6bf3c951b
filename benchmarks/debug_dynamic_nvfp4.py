"""H200 check: the dynamic NVFP4 global scale (GPU amax by atomic max) against three
independent amax computations, on many bench-like inputs (``microscale.bench.suites.
random_input``), for up to ``SECONDS`` (default 40). Prints every disagreement.

    PYTHONPATH=. python benchmarks/debug_dynamic_nvfp4.py
"""
import os
import time

import torch

from microscale import reference
from microscale.bench.suites import random_input
from microscale.kernels import quantize as kq


class Ctx:
    def __init__(self, seed: int):
        self.device = torch.device("cuda")
        self.generator = torch.Generator(device="cuda").manual_seed(seed)


t0, n, bad = time.time(), 0, 0
limit = float(os.environ.get("SECONDS", "40"))
seed = 3319346932
while time.time() - t0 < limit:
    for shape in ((28672, 8192), (8192, 8192)):
        x = random_input(shape, Ctx(seed))
        q = kq.quantize(x, "nvfp4")
        gs = q.global_scale.float().item()
        a_ref = reference._finite_amax(x).item()          # torch.aminmax on the GPU
        a_abs = x.float().abs().amax().item()              # another GPU reduction
        want = reference.nvfp4_global_scale(x).item()
        n += 1
        if gs != want or a_ref != a_abs:
            bad += 1
            a_cpu = reference._finite_amax(x.cpu()).item()
            print(f"seed={seed} shape={shape}: kernel gs={gs!r} ref gs={want!r}; amax aminmax={a_ref!r} "
                  f"abs().amax()={a_abs!r} cpu={a_cpu!r} kernel amax~{gs * 2688.0!r}", flush=True)
    seed += 1
print(f"dynamic nvfp4 global scale: {n - bad}/{n} agree ({time.time() - t0:.0f} s)")
