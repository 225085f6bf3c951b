"""The quant op family: quantize, dequantize and the fused quantizing prologues on the GPU
(Triton), for every :class:`~microscale.formats.Format`, bit-identical to
:mod:`microscale.reference`.

* :func:`quantize` / :func:`dequantize` — the kernels behind :func:`microscale.quantize` /
  :func:`microscale.dequantize` on CUDA tensors (:func:`unsupported_reason` says when the
  caller must use the reference instead).
* :func:`quantize_for_gemm` — scales written directly in a GEMM layout.
* :func:`rmsnorm_quantize` / :func:`silu_mul_quantize` — one pass from a transformer
  block's activations to codes and scales.
* :func:`fold_fp8` — a block-scaled weight refolded, losslessly where it can be, into fp8 E4M3 codes
  with float32 scales per 128 elements, for the fp8 tensor-core path of ``scaled_mm(..., fast_accum=True)``.
* :mod:`.tuning` — the kernels' switches (:func:`~.tuning.override`) and tiling heuristics.

Importing this package does not import Triton: the device code (:mod:`._kernels`) loads on
first GPU use.
"""
from . import tuning
from .dequantize import dequantize
from .fold import fold_fp8
from .fused import rmsnorm_quantize, silu_mul_quantize
from .gemm_layout import GemmQuantized, quantize_for_gemm
from .params import unsupported_reason
from .quantize import quantize
from .tuning import QuantizeConfig, QuantTuning, choose_config, choose_dequantize_config

__all__ = ["quantize", "dequantize", "quantize_for_gemm", "GemmQuantized", "rmsnorm_quantize", "silu_mul_quantize",
           "fold_fp8", "unsupported_reason", "QuantizeConfig", "QuantTuning", "choose_config", "choose_dequantize_config",
           "tuning"]
