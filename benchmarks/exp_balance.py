"""``decode_tma`` at 16 tokens: is it bound per SM by an uneven share of row tiles? Times the
routed kernel (CUDA graphs) on NVFP4 weights of 132, 176, 224 (the issue's 28672 rows) and
264 128-row tiles, K = 8192, and on the issue's 8192-row shapes: with the default equal
stream-K shares of the K chunks (two programs per SM), and with one program per tile (or per
quarter tile on 8192 rows), the split of the twelfth session. (128-row tiles throughout: ``rows=128``.)
    python benchmarks/exp_balance.py"""
import torch
import triton

import microscale as ms
from microscale import qlinear as L

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(5)
print(f"{'N x K':>12} {'tiles':>5} {'old us':>7} {'stream-K us':>11} {'GB/s':>6}")
for n, k in ((16896, 8192), (22528, 8192), (28672, 8192), (33792, 8192), (8192, 8192), (8192, 28672)):
    x = torch.randn(16, k, device=dev, generator=g).to(torch.bfloat16)
    q = ms.quantize(torch.randn(n, k, device=dev, generator=g), "nvfp4")
    tiles = n // 128
    old = tiles if tiles >= 132 else tiles * 4
    a, b = L.decode_tma(x, q, programs=old, rows=128), L.decode_tma(x, q, rows=128)
    assert (a.float() - b.float()).abs().max() <= 1e-2 * a.float().abs().max(), (n, k)
    t_old = triton.testing.do_bench_cudagraph(lambda: L.decode_tma(x, q, programs=old, rows=128), rep=40,
                                              return_mode="median") * 1e3
    t_sk = triton.testing.do_bench_cudagraph(lambda: L.decode_tma(x, q, rows=128), rep=40, return_mode="median") * 1e3
    nbytes = n * k // 2 + n * k // 16
    print(f"{n:6d}x{k:<5d} {tiles:5d} {t_old:7.1f} {t_sk:11.1f} {nbytes / t_sk / 1e3:6.0f}", flush=True)
