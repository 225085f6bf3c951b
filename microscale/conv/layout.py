"""The canonical layout of a quantized conv2d weight.

A conv weight ``[C_out, C_in/groups, kh, kw]`` is stored as an ordinary 2-D QTensor
``[C_out, K]``, ``K = (C_in/groups) * kh * kw``, its blocks running along the flattened K axis
(zero-padded to a whole block when K is not a multiple of it, as ``quantize(..., pad=True)`` does).
The order in which K flattens ``(c_in, kh, kw)`` is recorded in the QTensor's ``meta`` with the
4-D shape, so :func:`dequantize_conv_weight` returns the exact 4-D weight:

* ``"hwc"`` (the default): ``k = (r * kw + s) * (C_in/groups) + c`` -- channels innermost, so a
  block runs along input channels of one kernel tap: what an implicit GEMM over NHWC activations
  reads contiguously, and the order in which a block's values share a physical meaning (the same
  tap over neighbouring channels) when C_in/groups is a multiple of the block.
* ``"chw"``: ``k = (c * kh + r) * kw + s`` -- PyTorch's ``w.reshape(C_out, -1)``, for weights
  quantized (or checkpoints written) that way; :func:`as_conv_weight` tags such a 2-D QTensor.

``meta["conv2d"] = {"shape": [C_out, C_in/groups, kh, kw], "order": "hwc" | "chw"}``; it travels
with the QTensor through ``state_dict`` / safetensors files.
"""
from __future__ import annotations

import dataclasses

import torch

from ..formats import Format
from ..qtensor import QTensor

__all__ = ["ORDERS", "ConvLayout", "conv_layout", "quantize_conv_weight", "as_conv_weight", "dequantize_conv_weight"]

#: the flattening orders of ``(c_in, kh, kw)`` a conv QTensor may record
ORDERS = ("hwc", "chw")
_KEY = "conv2d"


@dataclasses.dataclass(frozen=True)
class ConvLayout:
    """The 4-D shape ``(C_out, C_in/groups, kh, kw)`` and K order of a conv QTensor."""

    c_out: int
    c_per_group: int
    kh: int
    kw: int
    order: str

    @property
    def k(self) -> int:
        """The flattened reduction length ``(C_in/groups) * kh * kw``."""
        return self.c_per_group * self.kh * self.kw

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.c_out, self.c_per_group, self.kh, self.kw)

    def flatten(self, w4d: torch.Tensor) -> torch.Tensor:
        """``[C_out, C_in/groups, kh, kw]`` -> ``[C_out, K]`` in this order."""
        if self.order == "hwc":
            w4d = w4d.permute(0, 2, 3, 1)
        return w4d.reshape(self.c_out, self.k)

    def unflatten(self, w2d: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`flatten` (a contiguous 4-D tensor)."""
        if self.order == "hwc":
            return w2d.reshape(self.c_out, self.kh, self.kw, self.c_per_group).permute(0, 3, 1, 2).contiguous()
        return w2d.reshape(self.shape).contiguous()

    def to_meta(self) -> dict:
        return {"shape": list(self.shape), "order": self.order}


def _check_order(order: str, op: str) -> None:
    if order not in ORDERS:
        raise ValueError(f"{op}: order={order!r} must be one of {', '.join(map(repr, ORDERS))}")


def conv_layout(w: QTensor, op: str = "conv2d", arg: str = "w") -> ConvLayout:
    """The conv layout recorded in ``w.meta`` (checked against ``w``'s 2-D shape).

    Raises:
        TypeError: ``w`` is not a QTensor.
        ValueError: no or inconsistent ``meta["conv2d"]``.
    """
    if not isinstance(w, QTensor):
        raise TypeError(f"{op}: {arg} must be a QTensor made by quantize_conv_weight, got {type(w).__name__}")
    m = w.meta.get(_KEY)
    if m is None:
        raise ValueError(f"{op}: {arg} (shape {tuple(w.shape)}) has no conv2d layout in its meta; quantize the 4-D "
                         "weight with microscale.conv.quantize_conv_weight, or tag a 2-D QTensor with as_conv_weight")
    shape, order = (m.get("shape"), m.get("order")) if isinstance(m, dict) else (None, None)
    if (not isinstance(shape, list) or len(shape) != 4
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape)):
        raise ValueError(f"{op}: {arg}.meta['conv2d']['shape']={shape!r} must be 4 positive ints "
                         "[C_out, C_in/groups, kh, kw]")
    _check_order(order, op)
    lay = ConvLayout(*shape, order)
    if len(w.shape) != 2 or (int(w.shape[0]), int(w.shape[1])) != (lay.c_out, lay.k):
        raise ValueError(f"{op}: {arg} has shape {tuple(w.shape)} but its conv2d layout {shape} needs "
                         f"[{lay.c_out}, {lay.k}] (C_out, C_in/groups*kh*kw)")
    return lay


def quantize_conv_weight(w: torch.Tensor, fmt: str | Format, *, order: str = "hwc", **quantize_kwargs) -> QTensor:
    """Quantize a conv weight ``[C_out, C_in/groups, kh, kw]`` into the canonical layout.

    Args:
        w: the 4-D float weight (as ``nn.Conv2d.weight``).
        fmt: preset name or Format.
        order: ``"hwc"`` (default; blocks run along input channels of one tap) or ``"chw"``
            (PyTorch's flatten order); see the module docstring.
        **quantize_kwargs: passed to :func:`microscale.quantize` (``scale_rule``, ``method``, ...);
            K is always zero-padded to a whole block.

    Returns:
        A 2-D QTensor ``[C_out, K]`` whose ``meta["conv2d"]`` records the 4-D shape and order.
    """
    from ..ops import quantize

    op = "quantize_conv_weight"
    if not isinstance(w, torch.Tensor) or w.dim() != 4:
        got = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"{op}: w must be a 4-D tensor [C_out, C_in/groups, kh, kw], got {got}")
    if w.numel() == 0:
        raise ValueError(f"{op}: w has an empty dimension (shape {tuple(w.shape)})")
    _check_order(order, op)
    quantize_kwargs.pop("pad", None)
    lay = ConvLayout(*(int(d) for d in w.shape), order)
    q = quantize(lay.flatten(w), fmt, pad=True, **quantize_kwargs)
    q.meta = {**q.meta, _KEY: lay.to_meta()}
    return q


def as_conv_weight(q: QTensor, shape: tuple[int, int, int, int] | torch.Size, order: str = "chw") -> QTensor:
    """A 2-D QTensor ``[C_out, K]`` quantized from a flattened conv weight, tagged with its 4-D
    ``shape`` and flatten ``order`` (default ``"chw"``: ``w.reshape(C_out, -1)``). Returns a new
    QTensor sharing ``q``'s tensors."""
    _check_order(order, "as_conv_weight")
    shape = [int(d) for d in shape]
    out = dataclasses.replace(q, meta={**q.meta, _KEY: {"shape": shape, "order": order}})
    conv_layout(out, "as_conv_weight", "q")
    return out


def dequantize_conv_weight(w: QTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The 4-D weight ``[C_out, C_in/groups, kh, kw]`` of a conv QTensor, in ``dtype``."""
    lay = conv_layout(w, "dequantize_conv_weight")
    return lay.unflatten(w.dequantize(dtype))
