"""``qlinear.decode_tma`` at 16 tokens on 28672x8192 NVFP4 (H200): ``time`` prints CUDA-graph
timings of ring variants (``_DT_STAGES`` x ``_DT_CHUNK``) next to cuBLAS bf16 and ``gemv_mma``;
without an argument it launches the default 4 times (an ncu target:
``ncu --kernel-name regex:_decode_tma --launch-skip 2 --launch-count 1 ...``)."""
import sys

import torch
import torch.nn.functional as F
import triton

import microscale as ms
from microscale import qlinear as L

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(3)
w = torch.randn(28672, 8192, device=dev, generator=g)
q = ms.quantize(w, "nvfp4")
x = torch.randn(16, 8192, device=dev, generator=g).to(torch.bfloat16)
if sys.argv[1:] == ["time"]:
    def tg(fn) -> float:
        fn()
        return triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3
    wb = w.to(torch.bfloat16)
    cub = tg(lambda: F.linear(x, wb))
    mma = tg(lambda: L.gemv_mma(x, q))
    print(f"cuBLAS {cub:.1f} us, gemv_mma {mma:.1f} us ({cub / mma:.2f}x)")
    for stages, chunk in ((3, 4), (4, 4), (2, 8), (6, 2), (3, 2)):
        L._DT_STAGES, L._DT_CHUNK = stages, chunk
        t = tg(lambda: L.decode_tma(x, q))
        print(f"decode_tma stages {stages} chunk {chunk}: {t:.1f} us ({cub / t:.2f}x)")
else:
    for _ in range(4):
        L.decode_tma(x, q)
    torch.cuda.synchronize()
