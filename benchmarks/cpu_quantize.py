"""Throughput of the CPU reference quantizer (MB/s of bf16 input).

    python benchmarks/cpu_quantize.py [--rows 4096] [--cols 4096] [--formats nvfp4 mxfp4 ...]

Median of several runs on fresh random data; a script, not a test (speed is never
asserted in tests). The goal of issue 2 is >= 200 MB/s for nvfp4 and mxfp4 on 2 cores.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

import microscale as ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--formats", nargs="+", default=["nvfp4", "mxfp4", "mxfp8_e4m3", "int4_affine_g128"])
    a = p.parse_args()
    print(f"# CPU reference quantize, {a.rows}x{a.cols} bf16, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    print(f"{'format':20s} {'median ms':>10s} {'MB/s (bf16 in)':>15s} {'dequant MB/s':>13s}")
    for name in a.formats:
        times, dtimes = [], []
        for _ in range(a.repeats):
            x = torch.randn(a.rows, a.cols, dtype=torch.bfloat16)
            t0 = time.perf_counter()
            q = ms.quantize(x, name)
            t1 = time.perf_counter()
            q.dequantize(torch.bfloat16)
            t2 = time.perf_counter()
            times.append(t1 - t0)
            dtimes.append(t2 - t1)
        mb = a.rows * a.cols * 2 / 1e6
        t, dt = statistics.median(times), statistics.median(dtimes)
        print(f"{name:20s} {t * 1e3:10.1f} {mb / t:15.0f} {mb / dt:13.0f}")


if __name__ == "__main__":
    main()
