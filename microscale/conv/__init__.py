"""The conv2d family: ``conv2d(x, w, ...)`` on a block-scaled weight (:mod:`.op`), the weight in
the canonical conv layout of :mod:`.layout` (``quantize_conv_weight``)."""
from .layout import ORDERS, ConvLayout, as_conv_weight, conv_layout, dequantize_conv_weight, quantize_conv_weight
from .op import conv2d, conv2d_reference, conv2d_triton

__all__ = ["conv2d", "conv2d_reference", "conv2d_triton", "quantize_conv_weight", "dequantize_conv_weight",
           "as_conv_weight", "conv_layout", "ConvLayout", "ORDERS"]
