"""The float64 reference: ``x @ reference.dequantize(W)^T`` (CPU and any device without a kernel)."""
from __future__ import annotations

import torch

from ... import reference
from ..packed import PackedLinearWeight


def reference_run(x: torch.Tensor, pw: PackedLinearWeight, bias: torch.Tensor | None) -> torch.Tensor:
    w = reference.dequantize(pw.to_qtensor(), torch.float64)
    y = x.to(torch.float64) @ w.to(x.device).T
    if bias is not None:
        y = y + bias.to(torch.float64)
    return y.to(x.dtype)
