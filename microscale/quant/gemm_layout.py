"""Quantize straight into a block-scaled GEMM's operand layout.

:func:`quantize_for_gemm` quantizes as :func:`~.quantize.quantize` does, with the scales
written by the kernel directly in a GEMM layout (``swizzled_128x4`` for cuBLAS/CUTLASS
block-scaled GEMMs and tcgen05, ``swizzled_8x4``, or ``row_major``) and returns a
:class:`GemmQuantized` (packed codes, flat scales, global scale). Its scales equal
``get_scale_layout(layout).swizzle(reference scales)``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..formats import Format, NonFinite, Overflow, Rounding, ScaleLayout, ScaleRule, TwoLevel, get_scale_layout
from ..options import QuantizeOptions
from .quantize import _launch, _prepare, _raise_flags
from .tuning import QuantizeConfig

__all__ = ["GemmQuantized", "quantize_for_gemm"]


class GemmQuantized(NamedTuple):
    """Kernel-level quantize output for block-scaled GEMMs."""

    data: torch.Tensor  #: packed codes ``[..., K*bits/8]`` (uint8, canonical packing)
    scales: torch.Tensor  #: flat scales in ``layout`` (storage dtype of the scale codec)
    global_scale: torch.Tensor | None  #: float32 0-d decode multiplier (two-level formats)
    layout: str  #: the scale layout's name
    rows: int  #: rows of the (row-major) scale matrix
    cols: int  #: columns of the (row-major) scale matrix


def quantize_for_gemm(
    x: torch.Tensor,
    fmt: str | Format | QuantizeOptions,
    *,
    scale_layout: str | ScaleLayout = "swizzled_128x4",
    scale_rule: str | ScaleRule | None = None,
    block_size: int | None = None,
    rounding: str | Rounding = Rounding.NEAREST_EVEN,
    overflow: str | Overflow = Overflow.SATURATE,
    nonfinite: str | NonFinite = NonFinite.PROPAGATE,
    global_scale: float | torch.Tensor | None = None,
    convention: str | TwoLevel | None = None,
    pad: bool = False,
    config: QuantizeConfig | None = None,
) -> GemmQuantized:
    """Quantize ``x`` (rows = all leading dims) with the scales written directly in
    ``scale_layout``. Affine formats are not GEMM operands here (zero points)."""
    op = "quantize_for_gemm"
    layout = get_scale_layout(scale_layout)
    fmt, rounding, overflow, nonfinite, xp, gscale = _prepare(
        x, fmt, scale_rule, block_size, rounding, overflow, nonfinite, global_scale, convention, pad, op)
    if fmt.zero_point:
        raise ValueError(f"{op}: affine format {fmt.name!r} has zero points; use quantize()")
    k = xp.shape[-1]
    x2 = xp.reshape(-1, k)
    data, scales, _, g, flags, _ = _launch(x2, fmt, rounding, overflow, nonfinite, gscale, layout, config)
    _raise_flags(flags, fmt, op)
    if not layout.tile_rows:
        scales = scales.reshape(-1)
    return GemmQuantized(data.reshape(*xp.shape[:-1], -1), scales, None if g is None else g.reshape(()),
                         layout.name, x2.shape[0] // fmt.block_rows, k // fmt.block_size)
