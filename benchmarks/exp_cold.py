"""``decode_tma`` at 16 tokens with weights read from HBM (the suite's method: calls rotate over
weight copies exceeding 3 x L2, CUDA graphs): code boxes of one ring chunk (``_DT_WIDE`` 4, the
default) against one K step (1), and the program count, on 8192x8192 and 28672x8192.
    python benchmarks/exp_cold.py"""
import torch
import torch.nn.functional as F

import microscale as ms
from microscale import qlinear as L
from microscale.bench._timing import l2_cache_bytes, rotation_count, time_cuda

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(11)
l2 = l2_cache_bytes(dev)
print(f"{'shape':12s} {'fmt':6s} {'variant':18s} {'us':>7s} {'x cuBLAS':>8s}")
for n, k in ((8192, 8192), (28672, 8192)):
    x = torch.randn(16, k, device=dev, generator=g).to(torch.bfloat16)
    wsets = [(x, torch.randn(n, k, device=dev, generator=g).to(torch.bfloat16))
             for _ in range(rotation_count(n * k * 2, l2))]
    cub = time_cuda(lambda a, w: F.linear(a, w), wsets, graph="always").median_ms * 1e3
    w0 = wsets[0][1].float()
    wsets = None
    for fmt in ("nvfp4", "mxfp4"):
        qs = [ms.quantize(w0 if i == 0 else torch.randn(n, k, device=dev, generator=g), fmt)
              for i in range(rotation_count(n * k * 9 // 16, l2))]
        sets = [(x, q) for q in qs]
        variants = (("box 4 (default)", 4, None), ("box 1", 1, None), ("box 4, 264 progs", 4, 264),
                    ("box 1, 264 progs", 1, 264))
        if not hasattr(L, "_DT_WIDE"):  # an older checkout (PYTHONPATH): its default only
            variants = (("older checkout", None, None),)
        for name, wide, prog in variants:
            if wide is not None:
                L._DT_WIDE = wide
            t = time_cuda(lambda a, q: L.decode_tma(a, q, programs=prog), sets, graph="always").median_ms * 1e3
            print(f"{n}x{k:<6d} {fmt:6s} {name:18s} {t:7.1f} {cub / t:8.2f}", flush=True)
        if hasattr(L, "_DT_WIDE"):
            L._DT_WIDE = 4
        qs = sets = None
