"""H200 check of the model layer on CUDA: ``quantize_model`` + ``QuantLinear.forward``
(the fused linear kernels), state_dict round trip and checkpoint load onto the GPU.

A small MLP (hidden 1024, bf16) per format: the quantized model's output against float64
math with the same dequantized weights (rel. Frobenius error < 1e-2), for 1, 3, 64 and 300
tokens (GEMV, split-K and prefill paths). Prints one line per check and a summary last.

    PYTHONPATH=. python benchmarks/run_gpu_models.py
"""
from __future__ import annotations

import copy
import os
import tempfile

import torch
from torch import nn

from microscale import io as msio
from microscale.nn import QuantLinear, load_quantized_state, quantize_model, quantized_state

FORMATS = ["nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "int4_affine_g128", "int8_fp16"]


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(1024, 2048), nn.GELU(), nn.Linear(2048, 1024))


def ref_forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """float64 forward with each QuantLinear's dequantized weight."""
    h = x.double()
    for mod in model:
        if isinstance(mod, QuantLinear):
            h = h @ mod.qweight.dequantize(torch.float64).T + mod.bias.double()
        else:
            h = mod(h)
    return h


def main() -> None:
    torch.manual_seed(0)
    dev = os.environ.get("DEV", "cuda")
    fails = 0
    for name in FORMATS:
        base = mlp().to(dev)
        qm = quantize_model(copy.deepcopy(base), name).to(torch.bfloat16)
        for m in (1, 3, 64, 300):
            x = torch.randn(m, 1024, device=dev).to(torch.bfloat16)
            out = qm(x)
            ref = ref_forward(qm, x)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            ok = bool(torch.isfinite(out).all()) and err < 1e-2 and out.dtype == torch.bfloat16
            fails += not ok
            print(f"forward {name:18s} M={m:3d} rel_err={err:.2e} {'ok' if ok else 'FAIL'}", flush=True)
        # state_dict round trip on the GPU, and a checkpoint written then loaded onto CUDA
        sd = qm.state_dict()
        qm2 = quantize_model(mlp().to(dev), name).to(torch.bfloat16)
        qm2.load_state_dict(sd)
        x = torch.randn(2, 1024, device=dev).to(torch.bfloat16)
        same = torch.equal(qm(x), qm2(x))
        with tempfile.TemporaryDirectory() as d:
            msio.save(quantized_state(qm), os.path.join(d, "ckpt"), convention="native")
            loaded = msio.load(os.path.join(d, "ckpt"))
            qm3 = load_quantized_state(mlp().to(dev).to(torch.bfloat16), {k: v.to(dev) for k, v in loaded.items()})
            same3 = torch.equal(qm(x), qm3(x))
        fails += not (same and same3)
        print(f"state   {name:18s} load_state_dict {'ok' if same else 'FAIL'}, checkpoint {'ok' if same3 else 'FAIL'}",
              flush=True)
    where = torch.cuda.get_device_name() if dev == "cuda" else dev
    print(f"\nmodel-layer checks on {where}: {'all ok' if not fails else f'{fails} FAILED'}")


if __name__ == "__main__":
    main()
