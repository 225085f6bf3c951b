"""ncu target: ``qlinear.decode_tma`` on 28672x8192 NVFP4 with 8 and then 16 token columns
(8 and 16 tokens), each launched twice to warm up and then once inside
``cudaProfilerStart/Stop`` (run ncu with ``--profile-from-start off``). Twenty-fourth session:
why do 16 token columns cost ~10% more than 8 when the decode is shared?"""
import torch

import microscale as ms
from microscale import qlinear as L

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(3)
q = ms.quantize(torch.randn(28672, 8192, device=dev, generator=g), "nvfp4")
for tok in (8, 16):
    x = torch.randn(tok, 8192, device=dev, generator=g).to(torch.bfloat16)
    for _ in range(2):
        L.decode_tma(x, q)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    L.decode_tma(x, q)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
