"""One launch of each decode path for ncu (``ncu --set full python benchmarks/profile_mma.py``):
the tensor-core path (gemv_mma) and the f16x2 GEMV on 28672x8192 NVFP4, one token."""
import torch

import microscale as ms
from microscale import qlinear as L

w = torch.randn(28672, 8192, device="cuda")
q = ms.quantize(w, "nvfp4")
x = torch.randn(1, 8192, device="cuda").to(torch.bfloat16)
for _ in range(3):
    L.gemv_mma(x, q)
    L.gemv(x, q)
torch.cuda.synchronize()
