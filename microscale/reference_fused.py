"""Plain-torch references of the fused quantizers in :mod:`microscale.quant.fused`.

Each computes the prologue in float32 and quantizes the float32 result with
:func:`microscale.reference.quantize` (no rounding to bf16 in between, as the fused
kernels do). The fused kernels reduce in another order and use the GPU's ``sigmoid``,
so they match these to within rounding of the float32 prologue, not bit for bit.
"""
from __future__ import annotations

import torch

from . import reference
from .qtensor import QTensor

__all__ = ["rmsnorm", "silu_mul", "rmsnorm_quantize", "silu_mul_quantize"]


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` in float32 over the last dim."""
    xf = x.to(torch.float32)
    rstd = 1.0 / torch.sqrt((xf * xf).mean(-1, keepdim=True) + eps)
    return (xf * rstd) * weight.to(torch.float32)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` in float32."""
    g = gate.to(torch.float32)
    return (g * torch.sigmoid(g)) * up.to(torch.float32)


def rmsnorm_quantize(x: torch.Tensor, weight: torch.Tensor, fmt, *, eps: float = 1e-6, **kw) -> QTensor:
    """Reference of :func:`microscale.quant.rmsnorm_quantize`."""
    return reference.quantize(rmsnorm(x, weight, eps), fmt, **kw)


def silu_mul_quantize(gate: torch.Tensor, up: torch.Tensor, fmt, **kw) -> QTensor:
    """Reference of :func:`microscale.quant.silu_mul_quantize`."""
    return reference.quantize(silu_mul(gate, up), fmt, **kw)
