"""Mixture-of-experts ops on block-scaled expert weights (3-D QTensors ``[E, N, K]``).

* :func:`grouped_linear` — rows grouped by expert times each expert's weight.
* :func:`moe_experts` — the fused experts forward (routing gather, gate/up GEMM, SwiGLU or
  gpt-oss's clamped SwiGLU, down GEMM, weighted sum).
* :func:`prepare_experts` — the per-weight repack (load time; cached with the weight).
* :mod:`microscale.moe.reference` — the float64-capable torch references.
"""
from .op import grouped_linear, moe_experts, route_tokens
from .packed import PackedExperts, cached_prepare_experts, prepare_experts
from .reference import grouped_linear_reference, moe_experts_reference

__all__ = ["grouped_linear", "moe_experts", "route_tokens", "PackedExperts", "prepare_experts",
           "cached_prepare_experts", "grouped_linear_reference", "moe_experts_reference"]
