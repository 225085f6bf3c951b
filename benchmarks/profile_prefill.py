"""One launch each of the 4096-token prefill paths for ncu, after a warm-up outside the
profiled range (``ncu --profile-from-start off ... python benchmarks/profile_prefill.py``):
``qlinear.prefill_ws``, the routed Triton prefill (``qlinear.prefill``) and cuBLAS bf16, on
28672x8192 NVFP4 (``PROFILE_M`` tokens, default 4096)."""
import os

import torch
import torch.nn.functional as F

import microscale as ms
from microscale import qlinear as L

m = int(os.environ.get("PROFILE_M", "4096"))
w = torch.randn(28672, 8192, device="cuda")
q = ms.quantize(w, "nvfp4")
wb = w.to(torch.bfloat16)
x = torch.randn(m, 8192, device="cuda").to(torch.bfloat16)
runs = (lambda: L.prefill_ws(x, q), lambda: L.prefill(x, q), lambda: F.linear(x, wb))
for fn in runs:
    fn()
torch.cuda.synchronize()
torch.cuda.profiler.start()
for fn in runs:
    fn()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
