"""microscale: block-scaled low-precision formats (NVFP4, MXFP4/6/8, MXINT8, fp8 and
intN group formats), exact to the specs and fast on Hopper.

Quick use::

    import microscale as ms
    q = ms.quantize(x, "nvfp4")          # QTensor
    y = q.dequantize(torch.bfloat16)
    out = ms.linear(x, q)                # x @ dequant(q)^T, fused kernels on CUDA
    print(ms.formats.registry.keys())

Triton is needed only by the GPU paths, which load it on first use.
"""
from . import attention  # the KV-cache attention family; no Triton at import
from . import formats
from .embedding import embedding
from .conv import conv2d  # the conv family; its package is microscale.conv
from .formats import Format, get_format, registry
from .linear import linear  # the op; its package is microscale.linear (import it by name)
from .linear.batched import linear_batched
from .linear.norm_linear import rmsnorm_linear
from .linear.scaled import scaled_mm  # both operands quantized
from .moe import grouped_linear, moe_experts  # the MoE ops; their package is microscale.moe
from .ops import decode, dequantize, encode, quantize
from .options import QuantizeOptions
from .qtensor import QTensor
from .quant.fold import fold_fp8  # MXFP4 / MXFP6 weights as fp8 codes for fast_accum

__version__ = "0.1.0"

__all__ = ["formats", "Format", "get_format", "registry", "QTensor", "QuantizeOptions", "quantize", "dequantize", "encode", "decode",
           "linear", "scaled_mm", "linear_batched", "rmsnorm_linear", "grouped_linear", "moe_experts",
           "embedding", "attention", "__version__"]
__all__ += ["conv2d", "fold_fp8"]
