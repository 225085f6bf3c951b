"""One launch each of the prefill paths for ncu, after a warm-up outside the profiled range
(``ncu --profile-from-start off ... python benchmarks/profile_prefill.py``): ``qlinear.prefill_ws``,
the Triton prefill (``qlinear.prefill``) and cuBLAS bf16, on a ``PROFILE_N`` x 8192 NVFP4 weight
(default 28672) and ``PROFILE_M`` tokens (default 4096); ``PROFILE_RUNS``: a subset, e.g. ``ws,cublas``."""
import os

import torch
import torch.nn.functional as F

import microscale as ms
from microscale import qlinear as L

m = int(os.environ.get("PROFILE_M", "4096"))
n = int(os.environ.get("PROFILE_N", "28672"))
w = torch.randn(n, 8192, device="cuda")
q = ms.quantize(w, "nvfp4")
wb = w.to(torch.bfloat16)
x = torch.randn(m, 8192, device="cuda").to(torch.bfloat16)
every = {"ws": lambda: L.prefill_ws(x, q), "prefill": lambda: L.prefill(x, q), "cublas": lambda: F.linear(x, wb)}
runs = [every[r] for r in os.environ.get("PROFILE_RUNS", "ws,prefill,cublas").split(",")]
for fn in runs:
    fn()
torch.cuda.synchronize()
torch.cuda.profiler.start()
for fn in runs:
    fn()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
