"""H200 check: dynamic NVFP4 quantize (GPU global amax) against the reference, on bench-like
inputs (``microscale.bench.suites.random_input``), first call of the process included.

    PYTHONPATH=. python benchmarks/debug_dynamic_nvfp4.py
"""
import torch

from microscale import reference
from microscale.bench.suites import random_input
from microscale.kernels import quantize as kq


class Ctx:
    def __init__(self, seed: int):
        self.device = torch.device("cuda")
        self.generator = torch.Generator(device="cuda").manual_seed(seed)


for seed in (204546635, 1, 2):
    for shape in ((8192, 8192), (28672, 8192), (4096, 4096)):
        x = random_input(shape, Ctx(seed))
        for rep in range(2):
            q = kq.quantize(x, "nvfp4")
            torch.cuda.synchronize()
            ref = reference.quantize(x.cpu(), "nvfp4")
            amax = x.float().abs().amax().item()
            gs, rs = q.global_scale.float().item(), ref.global_scale.float().item()
            nd = int((q.data.cpu() != ref.data).sum())
            ns = int((q.scales.cpu().view(torch.uint8) != ref.scales.view(torch.uint8)).sum())
            print(f"seed={seed} shape={shape} rep={rep}: amax={amax!r} gs got={gs!r} want={rs!r} "
                  f"data mism={nd} scale mism={ns} {'OK' if nd == ns == 0 and gs == rs else 'FAIL'}", flush=True)
