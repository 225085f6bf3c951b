"""One launch of each decode path for ncu (``ncu --set full python benchmarks/profile_mma.py``):
the tensor-core path (gemv_mma) and the f16x2 GEMV on 28672x8192 NVFP4, ``PROFILE_M``
tokens (default 1; the f16x2 GEMV only up to 4)."""
import os

import torch

import microscale as ms
from microscale import qlinear as L

m = int(os.environ.get("PROFILE_M", "1"))
w = torch.randn(28672, 8192, device="cuda")
q = ms.quantize(w, "nvfp4")
x = torch.randn(m, 8192, device="cuda").to(torch.bfloat16)
for _ in range(3):
    L.gemv_mma(x, q)
    if m <= 4:
        L.gemv(x, q)
torch.cuda.synchronize()
