"""``rmsnorm_linear(x, norm_weight, w, bias, *, eps, gate=None)``: ``linear(rmsnorm(x) * norm_weight
[* silu(gate)], w)`` with the normalization as a prologue of the split-K kernel, so the normalized
activations never go to memory (each program recomputes its tokens' sums of squares from x).

``w`` may be a list of weights of the same K (q/k/v): they are joined as in
:func:`microscale.linear.batched.linear_batched` and the norm and all projections run in one
launch (one per group of weights that cannot join). CPU tensors run the float64 composition.
"""
from __future__ import annotations

import torch

from ..qtensor import QTensor
from ..runtime import target
from .batched import _groups, _joined
from .eligibility import check
from .packed import cached_prepare

__all__ = ["rmsnorm_linear", "rmsnorm_linear_reference"]

OP = "rmsnorm_linear"


def rmsnorm_linear_reference(x: torch.Tensor, norm_weight: torch.Tensor, w: QTensor, bias: torch.Tensor | None = None,
                             *, eps: float, gate: torch.Tensor | None = None) -> torch.Tensor:
    """The float64 composition: ``(x * rsqrt(mean(x^2) + eps) * norm_weight [* silu(gate)]) @ dequant(w)^T
    + bias``, returned in x's dtype."""
    xd = x.to(torch.float64)
    h = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.to(torch.float64)
    if gate is not None:
        h = h * torch.nn.functional.silu(gate.to(torch.float64))
    y = h @ w.dequantize(torch.float64).to(x.device).T
    if bias is not None:
        y = y + bias.to(torch.float64)
    return y.to(x.dtype)


def _check_norm(x: torch.Tensor, norm_weight: torch.Tensor, gate: torch.Tensor | None, eps: float) -> None:
    k = x.shape[-1]
    if not isinstance(norm_weight, torch.Tensor) or tuple(norm_weight.shape) != (k,):
        got = tuple(norm_weight.shape) if isinstance(norm_weight, torch.Tensor) else type(norm_weight).__name__
        raise ValueError(f"{OP}: norm_weight has shape {got}; expected ({k},)")
    if norm_weight.device != x.device:
        raise ValueError(f"{OP}: norm_weight is on {norm_weight.device} but x is on {x.device}")
    if gate is not None:
        if not isinstance(gate, torch.Tensor) or gate.shape != x.shape or gate.dtype != x.dtype \
                or gate.device != x.device:
            got = (tuple(gate.shape), gate.dtype, str(gate.device)) if isinstance(gate, torch.Tensor) \
                else type(gate).__name__
            raise ValueError(f"{OP}: gate is {got}; expected x's shape, dtype and device "
                             f"{(tuple(x.shape), x.dtype, str(x.device))}")
    if not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"{OP}: eps={eps!r} must be a float >= 0")


def rmsnorm_linear(x: torch.Tensor, norm_weight: torch.Tensor, w: QTensor | list[QTensor],
                   bias: torch.Tensor | None | list[torch.Tensor | None] = None, *, eps: float,
                   gate: torch.Tensor | None = None, kernel: bool | None = None) -> torch.Tensor | list[torch.Tensor]:
    """``linear(rmsnorm(x) * norm_weight [* silu(gate)], w, bias)``, the norm fused into the GEMM.

    Args:
        x: bfloat16 / float16 ``[..., K]``.
        norm_weight: ``[K]`` (any float dtype).
        w: a QTensor ``[N, K]`` in any registry format, or a list of them (then ``bias`` is a list
            too, or None) for the norm followed by several projections in one launch.
        bias: optional ``[N]`` (or a list, see ``w``).
        eps: the RMSNorm epsilon (``x * rsqrt(mean(x^2) + eps)``, float32 on the GPU).
        gate: optional ``[..., K]`` like x: the normalized activations are multiplied by
            ``silu(gate)`` (gated RMSNorm).
        kernel: run the Triton kernel (default: on CUDA tensors; True on CPU tensors needs
            ``TRITON_INTERPRET=1``).

    Returns:
        ``[..., N]`` in x's dtype (a list for a list ``w``, in its order).
    """
    many = isinstance(w, (list, tuple))
    ws = list(w) if many else [w]
    bs = (list(bias) if bias is not None else [None] * len(ws)) if many else [bias]
    if len(bs) != len(ws):
        raise ValueError(f"{OP}: {len(bs)} biases for {len(ws)} weights")
    for i, q in enumerate(ws):
        if not isinstance(q, QTensor) or len(q.shape) != 2:
            raise TypeError(f"{OP}: weight {i} must be a 2-D QTensor [N, K], got {type(q).__name__}")
        check(x, int(q.shape[0]), int(q.shape[1]), q.device, bs[i])
    _check_norm(x, norm_weight, gate, eps)
    use_kernel = x.device.type == "cuda" if kernel is None else kernel
    if use_kernel and x.device.type != "cuda" and not target.interpreting():
        raise ValueError(f"{OP}: kernel=True on {x.device} tensors needs TRITON_INTERPRET=1")
    if not use_kernel:
        outs = [rmsnorm_linear_reference(x, norm_weight, q, b, eps=eps, gate=gate) for q, b in zip(ws, bs)]
        return outs if many else outs[0]
    return _fused_run(x, norm_weight, ws, bs, eps, gate, many)


def _fused_run(x, norm_weight, ws, bs, eps, gate, many):
    """The kernel route of :func:`rmsnorm_linear` (arguments checked)."""
    from .backends.splitk import splitk_run

    k = x.shape[-1]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k).contiguous()
    g2 = None if gate is None else gate.reshape(-1, k).contiguous()
    nw = norm_weight.contiguous()
    ns = [int(q.shape[0]) for q in ws]
    outs: list = [None] * len(ws)
    for grp in _groups(ws):
        q = ws[grp[0]] if len(grp) == 1 else _joined([ws[i] for i in grp])
        b = None
        if any(bs[i] is not None for i in grp):
            b = torch.cat([bs[i].to(torch.float32) if bs[i] is not None
                           else torch.zeros(ns[i], dtype=torch.float32, device=x.device) for i in grp])
        y = splitk_run(x2, cached_prepare(q), b, norm=(nw, g2, eps))
        for i, part in zip(grp, y.split([ns[i] for i in grp], dim=-1)):
            outs[i] = part.reshape(*lead, ns[i])
    return outs if many else outs[0]
