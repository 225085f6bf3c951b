"""Layer 4: the public operations, dispatched by device.

CPU (and any device without a kernel) runs the reference; CUDA tensors run the
Triton kernels where one exists for the op.
"""
from __future__ import annotations

import torch

from . import reference
from .formats import Format, NonFinite, Overflow, Rounding, ScaleRule, TwoLevel, get_element
from .options import QuantizeOptions
from .qtensor import QTensor

__all__ = ["quantize", "dequantize", "encode", "decode"]


def quantize(
    x: torch.Tensor,
    fmt: str | Format | QuantizeOptions,
    *,
    scale_rule: str | ScaleRule | None = None,
    block_size: int | None = None,
    rounding: str | Rounding = "nearest_even",
    overflow: str | Overflow = "saturate",
    nonfinite: str | NonFinite = "propagate",
    global_scale: float | torch.Tensor | None = None,
    convention: str | TwoLevel | None = None,
    pad: bool = False,
    generator: torch.Generator | None = None,
    method: str = "rtn",
) -> QTensor:
    """Quantize ``x`` (float32/float16/bfloat16/float64, blocks along the last dim) to ``fmt``.

    Args:
        x: input tensor, any leading dims.
        fmt: preset name (``ms.formats.registry``), a :class:`Format`, or every option at once as
            :class:`~microscale.options.QuantizeOptions` (``QuantizeOptions.resolve(fmt, **options)``;
            then no other option is given).
        scale_rule: override the format's scale rule (``floor``/``ceil``/``even``/``rceil``
            for E8M0 scales).
        block_size: override the block size.
        rounding: ``nearest_even`` (default), ``nearest_away`` or ``stochastic``.
        overflow: ``saturate`` (default) or ``native``. A finite float64 value beyond
            float32's range (the quantizers compute in float32) becomes +-float32 max under
            ``saturate`` and raises ``ValueError`` under ``native``.
        nonfinite: NaN/Inf input policy: ``propagate`` (default), ``zero`` or ``error``.
            Under ``propagate`` a NaN or Inf never sets an affine block's range: NaN encodes
            as the zero point (0; unsigned codes have no NaN), +-Inf as the block's largest /
            smallest code.
        global_scale: two-level formats: the per-tensor decode scale; computed from the
            tensor's amax when omitted.
        convention: two-level formats: ``modelopt`` (default), ``torchao`` or
            ``compressed-tensors``.
        pad: zero-pad K (and rows of 2-D blocks) to a whole block instead of raising.
        generator: seeds stochastic rounding.
        method: ``rtn`` (default: each block's scale from its amax by the format's rule),
            ``mse`` (per-block search over nearby scale codes for the least squared error)
            or ``4over6`` (E2M1 formats with non-power-of-two scales: each block's amax
            mapped to 6 or 4, the lower error kept); see :mod:`microscale.accuracy.methods`.
            Every method returns an ordinary QTensor in the canonical layout.

    Returns:
        A :class:`QTensor` in the canonical (checkpoint) layout.

    CUDA tensors run the Triton kernel (bit-identical to the reference; stochastic
    rounding and the few shapes it can't tile fall back to the reference).
    """
    o = QuantizeOptions.resolve(fmt, scale_rule=scale_rule, block_size=block_size, rounding=rounding,
                                overflow=overflow, nonfinite=nonfinite, global_scale=global_scale,
                                convention=convention, pad=pad, generator=generator)
    if method != "rtn":
        from .accuracy import methods  # (a layer above: imported on use only)

        return methods.quantize_with(x, o.fmt, method, rounding=o.rounding, overflow=o.overflow,
                                     nonfinite=o.nonfinite, global_scale=o.global_scale, pad=o.pad,
                                     generator=o.generator)
    if isinstance(x, torch.Tensor) and x.is_cuda:
        from . import quant as kq

        if kq.unsupported_reason(o.fmt, o.rounding) is None:
            # (the kernel reads float64 as float32: saturate or refuse what float32 can't hold first)
            return kq.quantize(reference.fit_float32(x, o.overflow), o)
    return reference.quantize(x, o)


def dequantize(q: QTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode ``q`` to a dense tensor of ``dtype`` in its original shape."""
    if not isinstance(q, QTensor):
        raise TypeError(f"dequantize: expected a QTensor, got {type(q).__name__}")
    if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"dequantize: dtype={dtype} is not a floating dtype")
    if q.data.is_cuda:
        from . import quant as kq

        if kq.unsupported_reason(q.fmt) is None:
            return kq.dequantize(q, dtype)
    return reference.dequantize(q, dtype)


def encode(x: torch.Tensor, element: str, *, rounding: str = "nearest_even", overflow: str = "saturate",
           nonfinite: str = "propagate", generator: torch.Generator | None = None) -> torch.Tensor:
    """Encode each element of ``x`` to ``element`` (e.g. ``"e2m1"``): one uint8 code per element."""
    return get_element(element).encode(x, rounding, overflow, nonfinite, generator)


def decode(codes: torch.Tensor, element: str) -> torch.Tensor:
    """Decode one code per element (uint8) of ``element`` to float32."""
    return get_element(element).decode(codes)
