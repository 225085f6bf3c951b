"""Fused quantizers for a transformer block (Triton; CUDA tensors, or any tensor under
``TRITON_INTERPRET=1``): one pass reads the activations and writes codes and scales.

* :func:`rmsnorm_quantize` — ``rmsnorm(x) * weight`` -> quantize (the attention / MLP input).
* :func:`silu_mul_quantize` — ``silu(gate) * up`` -> quantize (the MLP down-projection input).

The prologue runs in float32 and is quantized without rounding to bf16 first.
References: :mod:`microscale.reference_fused` (equal up to float32 rounding of the
prologue, see there). Two-level formats (NVFP4) need a static ``global_scale`` (the
per-tensor scale is folded into the block scales as in :func:`microscale.quantize`);
a dynamic one would need a second pass over the prologue's output.
"""
from __future__ import annotations

import torch

from ..formats import Format, NonFinite, Overflow, Rounding, ScaleRule, get_scale_layout
from ..qtensor import QTensor
from .quantize import _launch, _prepare, _raise_flags
from .tuning import QuantizeConfig

__all__ = ["rmsnorm_quantize", "silu_mul_quantize"]


def _run(op, x, y, w, eps, prologue, fmt, scale_rule, block_size, rounding, overflow, nonfinite, global_scale,
         convention, config) -> QTensor:
    fmt, rounding, overflow, nonfinite, xp, gscale = _prepare(
        x, fmt, scale_rule, block_size, rounding, overflow, nonfinite, global_scale, convention, False, op)
    if fmt.global_scale and gscale is None:
        raise ValueError(f"{op}: two-level format {fmt.name!r} needs a static global_scale here")
    if fmt.block_rows != 1:
        raise ValueError(f"{op}: 2-D block formats ({fmt.name!r}) are not supported")
    k = xp.shape[-1]
    x2 = xp.reshape(-1, k)
    y2 = None if y is None else y.reshape(-1, k)
    data, scales, zps, g, flags, _ = _launch(x2, fmt, rounding, overflow, nonfinite, gscale,
                                             get_scale_layout("row_major"), config, prologue, y2, w, eps)
    _raise_flags(flags, fmt, op)
    lead = tuple(xp.shape[:-1])
    sshape = (*lead, k // fmt.block_size)
    meta = {"two_level": fmt.two_level.value} if fmt.global_scale else {}
    return QTensor(data.reshape(*lead, -1), scales.reshape(sshape), fmt, x.shape, x.dtype,
                   None if g is None else g.reshape(()), None if zps is None else zps.reshape(sshape), meta)


def rmsnorm_quantize(x: torch.Tensor, weight: torch.Tensor, fmt: str | Format, *, eps: float = 1e-6,
                     scale_rule: str | ScaleRule | None = None, block_size: int | None = None,
                     rounding: str | Rounding = Rounding.NEAREST_EVEN, overflow: str | Overflow = Overflow.SATURATE,
                     nonfinite: str | NonFinite = NonFinite.PROPAGATE, global_scale=None, convention=None,
                     config: QuantizeConfig | None = None) -> QTensor:
    """Quantize ``rmsnorm(x) * weight`` (over the last dim, float32) to ``fmt`` in one pass.

    ``weight`` has ``x.shape[-1]`` elements; other arguments as :func:`microscale.quantize`.
    """
    op = "rmsnorm_quantize"
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"{op}: weight has shape {tuple(weight.shape)}; expected ({x.shape[-1]},)")
    return _run(op, x, None, weight.contiguous(), eps, 1, fmt, scale_rule, block_size, rounding, overflow,
                nonfinite, global_scale, convention, config)


def silu_mul_quantize(gate: torch.Tensor, up: torch.Tensor, fmt: str | Format, *,
                      scale_rule: str | ScaleRule | None = None, block_size: int | None = None,
                      rounding: str | Rounding = Rounding.NEAREST_EVEN,
                      overflow: str | Overflow = Overflow.SATURATE,
                      nonfinite: str | NonFinite = NonFinite.PROPAGATE, global_scale=None, convention=None,
                      config: QuantizeConfig | None = None) -> QTensor:
    """Quantize ``silu(gate) * up`` (float32) to ``fmt`` in one pass."""
    op = "silu_mul_quantize"
    if gate.shape != up.shape:
        raise ValueError(f"{op}: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ in shape")
    return _run(op, gate, up.contiguous(), None, 0.0, 2, fmt, scale_rule, block_size, rounding, overflow,
                nonfinite, global_scale, convention, config)
