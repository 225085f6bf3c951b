"""Accuracy toolkit: error metrics of quantized tensors and models, and quantizers that
lower the error while producing ordinary QTensors (MSE scale search, 4-over-6 block
scales, block Hadamard rotation, GPTQ); :func:`error_report` ranks formats by error against
bits (``microscale error``). See docs/accuracy.md."""
from .gptq import gptq_quantize, hessian
from .hadamard import HadamardLinear, block_hadamard, hadamard_matrix
from .methods import METHODS, quantize_with
from .model import quantize_model, run_calibration
from .metrics import ErrorStats, cosine, error_stats, max_abs_error, relative_error, sqnr_db, tensor_error
from .report import error_report, format_report

__all__ = ["ErrorStats", "tensor_error", "error_stats", "relative_error", "sqnr_db", "max_abs_error", "cosine",
           "METHODS", "quantize_with", "gptq_quantize", "hessian", "HadamardLinear", "block_hadamard",
           "hadamard_matrix", "quantize_model", "run_calibration", "error_report", "format_report"]
