"""Is ``decode_tma`` at 16 tokens bound per SM by its uneven tile count? Times the routed
kernel (CUDA graphs) on K=8192 NVFP4 weights whose 128-row tile counts are 132, 176, 224
(the issue's 28672 rows: 92 SMs run two programs, 40 run one) and 264 (two per SM): if the
224- and 264-tile shapes take about the same time, the 28672-row shape pays ~15% for the
imbalance that a balanced (stream-K) split would remove.   python benchmarks/exp_balance.py"""
import torch
import triton

import microscale as ms
from microscale import qlinear as L

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(5)
x = torch.randn(16, 8192, device=dev, generator=g).to(torch.bfloat16)
print(f"{'rows':>6} {'tiles':>5} {'us':>7} {'us/tile-per-SM':>15} {'GB/s':>7}")
for n in (16896, 22528, 28672, 33792):
    q = ms.quantize(torch.randn(n, 8192, device=dev, generator=g), "nvfp4")
    L.decode_tma(x, q)
    t = triton.testing.do_bench_cudagraph(lambda: L.decode_tma(x, q), rep=40, return_mode="median") * 1e3
    tiles = n // 128
    nbytes = n * 8192 // 2 + n * 8192 // 16
    print(f"{n:6d} {tiles:5d} {t:7.1f} {t / (tiles / 132):15.1f} {nbytes / t / 1e3:7.0f}")
    del q
