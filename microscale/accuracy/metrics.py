"""Error metrics of a quantized tensor (or layer, or model) against its source.

All sums run in float64. For a source ``x`` and its reconstruction ``y``:

* relative Frobenius error ``||x - y||_F / ||x||_F``;
* SQNR ``10 log10(sum x^2 / sum (x - y)^2)`` dB (``inf`` when exact);
* max abs error ``max |x - y|``;
* cosine ``<x, y> / (||x|| ||y||)`` (1 for two all-zero tensors, 0 when one is zero).

:class:`ErrorStats` keeps the sums, so stats of many tensors add up to the stats of their
concatenation (``sum(stats, ErrorStats())``): the model total weights every element alike.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..qtensor import QTensor

__all__ = ["ErrorStats", "tensor_error", "error_stats", "relative_error", "sqnr_db", "max_abs_error", "cosine"]


@dataclass(frozen=True)
class ErrorStats:
    """Sufficient sums for the four metrics; ``a + b`` is the stats of both tensors together."""

    signal: float = 0.0  # sum x^2
    noise: float = 0.0  # sum (x - y)^2
    recon: float = 0.0  # sum y^2
    dot: float = 0.0  # sum x*y
    max_abs: float = 0.0  # max |x - y|
    count: int = 0

    def __add__(self, other: "ErrorStats") -> "ErrorStats":
        if not isinstance(other, ErrorStats):
            return NotImplemented
        return ErrorStats(self.signal + other.signal, self.noise + other.noise, self.recon + other.recon,
                          self.dot + other.dot, max(self.max_abs, other.max_abs), self.count + other.count)

    def __radd__(self, other):  # sum() starts from int 0
        return self if other == 0 else self.__add__(other)

    @property
    def rel_fro(self) -> float:
        """``||x - y||_F / ||x||_F`` (``inf`` if x is zero and y is not, 0 if both are)."""
        if self.signal == 0:
            return 0.0 if self.noise == 0 else math.inf
        return math.sqrt(self.noise / self.signal)

    @property
    def sqnr_db(self) -> float:
        """``10 log10(sum x^2 / sum (x - y)^2)`` in dB; ``inf`` for an exact reconstruction."""
        if self.noise == 0:
            return math.inf
        if self.signal == 0:
            return -math.inf
        return 10.0 * math.log10(self.signal / self.noise)

    @property
    def cosine(self) -> float:
        """``<x, y> / (||x|| ||y||)``; 1 when both are zero, 0 when exactly one is."""
        if self.signal == 0 and self.recon == 0:
            return 1.0
        if self.signal == 0 or self.recon == 0:
            return 0.0
        return self.dot / math.sqrt(self.signal * self.recon)

    def as_dict(self) -> dict:
        """The four metrics and the element count."""
        return {"rel_fro": self.rel_fro, "sqnr_db": self.sqnr_db, "max_abs": self.max_abs,
                "cosine": self.cosine, "count": self.count}


def _pair(x: torch.Tensor, y: torch.Tensor | QTensor, op: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(y, QTensor):
        y = y.dequantize(torch.float32)
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"{op}: y must be a torch.Tensor or a QTensor, got {type(y).__name__}")
    if tuple(x.shape) != tuple(y.shape):
        raise ValueError(f"{op}: x has shape {tuple(x.shape)} but y has {tuple(y.shape)}; expected equal shapes")
    if not (x.dtype.is_floating_point and y.dtype.is_floating_point):
        raise TypeError(f"{op}: x ({x.dtype}) and y ({y.dtype}) must be floating tensors")
    return x.detach().to(torch.float64), y.detach().to(device=x.device, dtype=torch.float64)


def error_stats(x: torch.Tensor, y: torch.Tensor | QTensor) -> ErrorStats:
    """The sums of :class:`ErrorStats` for source ``x`` and reconstruction ``y`` (a tensor
    of the same shape, or a QTensor, which is dequantized)."""
    x, y = _pair(x, y, "error_stats")
    if x.numel() == 0:
        return ErrorStats()
    d = x - y
    return ErrorStats(float((x * x).sum()), float((d * d).sum()), float((y * y).sum()), float((x * y).sum()),
                      float(d.abs().max()), x.numel())


def tensor_error(x: torch.Tensor, y: torch.Tensor | QTensor) -> dict:
    """``{"rel_fro", "sqnr_db", "max_abs", "cosine", "count"}`` of ``y`` against ``x``."""
    return error_stats(x, y).as_dict()


def relative_error(x: torch.Tensor, y: torch.Tensor | QTensor) -> float:
    """Relative Frobenius error ``||x - y||_F / ||x||_F``."""
    return error_stats(x, y).rel_fro


def sqnr_db(x: torch.Tensor, y: torch.Tensor | QTensor) -> float:
    """Signal-to-quantization-noise ratio in dB."""
    return error_stats(x, y).sqnr_db


def max_abs_error(x: torch.Tensor, y: torch.Tensor | QTensor) -> float:
    """``max |x - y|``."""
    return error_stats(x, y).max_abs


def cosine(x: torch.Tensor, y: torch.Tensor | QTensor) -> float:
    """Cosine similarity of the flattened tensors."""
    return error_stats(x, y).cosine
