"""Torch references of the MoE ops (float64-capable): the oracle the kernels are tested against.

Weights are dense ``[E, N, K]`` tensors (``out x in`` per expert, as ``nn.Linear`` stores them);
the math runs in the dtype of ``x`` as given (pass float64 for the oracle).
"""
from __future__ import annotations

import torch

__all__ = ["grouped_linear_reference", "moe_experts_reference", "swiglu", "ACTIVATIONS", "LAYOUTS"]

ACTIVATIONS = ("swiglu", "swiglu_clamped")
LAYOUTS = ("concat", "interleaved")


def grouped_linear_reference(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor,
                             bias: torch.Tensor | None = None) -> torch.Tensor:
    """``out[r] = x[r] @ w[e]^T + bias[e]`` for rows ``offsets[e] <= r < offsets[e+1]``.

    Args:
        x: ``[T, K]``; w: dense ``[E, N, K]``; offsets: ``[E+1]`` ints, nondecreasing from 0 to T;
        bias: optional ``[E, N]``. Returns ``[T, N]`` in ``x``'s dtype.
    """
    e_count, n, _ = w.shape
    out = x.new_zeros((x.shape[0], n))
    off = [int(v) for v in offsets.tolist()]
    for e in range(e_count):
        a, b = off[e], off[e + 1]
        if b > a:
            y = x[a:b] @ w[e].to(x.dtype).T
            if bias is not None:
                y = y + bias[e].to(x.dtype)
            out[a:b] = y
    return out


def swiglu(h: torch.Tensor, activation: str = "swiglu", alpha: float | None = None, limit: float | None = None,
           layout: str = "concat") -> torch.Tensor:
    """Gated activation of the gate/up projection ``h`` ``[S, 2I]`` -> ``[S, I]``.

    ``layout="concat"``: gate = ``h[:, :I]``, up = ``h[:, I:]``; ``"interleaved"``: gate =
    ``h[:, 0::2]``, up = ``h[:, 1::2]`` (gpt-oss). ``activation="swiglu"``: ``silu(gate) * up``.
    ``"swiglu_clamped"`` (gpt-oss, transformers' ``GptOssExperts``): gate clamped above at
    ``limit``, up to ``[-limit, limit]``, ``(up + 1) * gate * sigmoid(alpha * gate)``; ``alpha``
    and ``limit`` default to gpt-oss's 1.702 and 7.0, as in :func:`microscale.moe_experts`.
    """
    if layout == "interleaved":
        gate, up = h[..., 0::2], h[..., 1::2]
    else:
        gate, up = h.chunk(2, dim=-1)
    if activation == "swiglu_clamped":
        alpha = 1.702 if alpha is None else alpha
        limit = 7.0 if limit is None else limit
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))
    return torch.nn.functional.silu(gate) * up


def moe_experts_reference(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, top_k_index: torch.Tensor,
                          top_k_weights: torch.Tensor, *, activation: str = "swiglu",
                          gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None,
                          alpha: float | None = None, limit: float | None = None,
                          layout: str = "concat") -> torch.Tensor:
    """``out[t] = sum_j top_k_weights[t, j] * down_e(act(gate_up_e(x[t])))`` with ``e = top_k_index[t, j]``.

    Args:
        x: ``[T, H]``; w_gate_up: dense ``[E, 2I, H]``; w_down: dense ``[E, H, I]``;
        top_k_index / top_k_weights: ``[T, top_k]``; biases ``[E, 2I]`` / ``[E, H]``.
        The rest as in :func:`swiglu`. Returns ``[T, H]`` in ``x``'s dtype.
    """
    t, k = top_k_index.shape
    out = x.new_zeros((t, w_down.shape[1]))
    idx = top_k_index.reshape(-1)
    for e in torch.unique(idx).tolist():
        pos = (idx == e).nonzero().flatten()
        tok = pos // k
        h = x[tok] @ w_gate_up[e].to(x.dtype).T
        if gate_up_bias is not None:
            h = h + gate_up_bias[e].to(x.dtype)
        h = swiglu(h, activation, alpha, limit, layout)
        y = h @ w_down[e].to(x.dtype).T
        if down_bias is not None:
            y = y + down_bias[e].to(x.dtype)
        out.index_add_(0, tok, y * top_k_weights.reshape(-1)[pos, None].to(x.dtype))
    return out
