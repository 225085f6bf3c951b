"""The both-quantized matmul: ``scaled_mm(a, b)`` = ``a @ b^T`` for QTensors ``a`` ``[M, K]`` and
``b`` ``[N, K]`` (both block-scaled along K), and its ``torch.library`` registration.

Numerics are the oracle's (:mod:`microscale.reference_scaled`; docs/scaled-mm.md): every product
exact, float32 sums per chunk of the smaller block size, chunk sums scaled by the product of the two
block scales and accumulated in float32 in K order, global scales after the last chunk. On CUDA the
exact bf16 tensor-core kernel (:mod:`.backends.scaled_exact`) runs it; elsewhere the oracle does.
"""
from __future__ import annotations

import json

import torch

from ..formats import Format
from ..qtensor import QTensor
from ..reference_scaled import check_operands, scaled_mm_reference

__all__ = ["scaled_mm"]

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _meta(q: QTensor) -> str:
    return json.dumps({"fmt": q.fmt.to_dict(), "shape": list(q.shape), "dtype": str(q.dtype).removeprefix("torch."),
                       "meta": q.meta})


def _rebuild(data, scales, gs, zp, meta: str) -> QTensor:
    d = json.loads(meta)
    return QTensor(data, scales, Format.from_dict(d["fmt"]), torch.Size(d["shape"]), getattr(torch, d["dtype"]),
                   gs, zp, d["meta"])


@torch.library.custom_op("microscale::scaled_mm", mutates_args=())
def _scaled_mm_op(a_data: torch.Tensor, a_scales: torch.Tensor, a_gs: torch.Tensor | None,
                  a_zp: torch.Tensor | None, a_meta: str, b_data: torch.Tensor, b_scales: torch.Tensor,
                  b_gs: torch.Tensor | None, b_zp: torch.Tensor | None, b_meta: str,
                  bias: torch.Tensor | None, out_dtype: str) -> torch.Tensor:
    a = _rebuild(a_data, a_scales, a_gs, a_zp, a_meta)
    b = _rebuild(b_data, b_scales, b_gs, b_zp, b_meta)
    dt = getattr(torch, out_dtype)
    if a_data.device.type == "cuda":
        from .backends.scaled_exact import scaled_exact_run

        return scaled_exact_run(a, b, bias, dt)
    return scaled_mm_reference(a, b, bias, dt)


@_scaled_mm_op.register_fake
def _(a_data, a_scales, a_gs, a_zp, a_meta, b_data, b_scales, b_gs, b_zp, b_meta, bias, out_dtype):
    m = json.loads(a_meta)["shape"][0]
    n = json.loads(b_meta)["shape"][0]
    return a_data.new_empty((m, n), dtype=getattr(torch, out_dtype))


def scaled_mm(a: QTensor, b: QTensor, *, bias: torch.Tensor | None = None,
              out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``a @ b^T (+ bias)`` with both operands quantized.

    Each operand's block and global scales are applied as :mod:`microscale.reference_scaled`
    states (the result equals that oracle up to float32 summation order). Any registered formats
    whose block sizes nest (one divides the other) combine: fp8 block-128 activations with
    128x128-block weights, MXFP8 x MXFP8, MXFP4 weights x MXFP8 activations, NVFP4 x NVFP4, ...

    Args:
        a: QTensor ``[M, K]`` (activations, e.g. from :func:`microscale.quantize`).
        b: QTensor ``[N, K]`` (the weight).
        bias: optional float ``[N]``, added in float32 after the scales.
        out_dtype: bfloat16 (default), float16 or float32.

    Returns:
        ``[M, N]`` in ``out_dtype``. CUDA operands run the bf16 tensor-core kernel; CPU operands
        the oracle.
    """
    check_operands(a, b, bias, out_dtype)
    return torch.ops.microscale.scaled_mm(a.data, a.scales, a.global_scale, a.zero_points, _meta(a),
                                          b.data, b.scales, b.global_scale, b.zero_points, _meta(b),
                                          bias, _DTYPE_NAMES[out_dtype])
