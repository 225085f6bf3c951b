"""``linear_batched(x, [w1, w2, ...])``: several quantized weights of the same K (q/k/v, gate/up)
applied to one input in one launch.

The weights are joined along N into one QTensor (made once and kept while the weights are
unchanged), which then takes :func:`microscale.linear.linear`'s route like any weight (its GEMV
backends, call plans and packed layout); the outputs are views of the one result. Weights join
when they share the format, the per-tensor global scale (two-level formats) and, for 2-D block
formats, whole block rows; otherwise each such group is its own launch.
"""
from __future__ import annotations

import weakref

import torch

from ..qtensor import QTensor
from .op import linear

__all__ = ["linear_batched", "join_weights"]

OP = "linear_batched"

_PLANS: dict = {}  # tuple(id(w)) -> (weakrefs, tensor versions, plan): see _plan
_MAX_PLANS = 256


def _versions(ws) -> tuple:
    return tuple((w.data._version, w.scales._version,
                  None if w.global_scale is None else w.global_scale._version,
                  None if w.zero_points is None else w.zero_points._version) for w in ws)


def join_weights(ws: list[QTensor]) -> QTensor:
    """One QTensor ``[sum N_i, K]`` whose rows are the weights' rows in order (bit-identical
    decode). All must share format, K, global scale and device; 2-D block formats need each
    N_i a multiple of the block rows."""
    w0 = ws[0]
    fmt = w0.fmt
    for i, w in enumerate(ws):
        if w.fmt != fmt or w.shape[1] != w0.shape[1] or w.device != w0.device:
            raise ValueError(f"{OP}: weight {i} ({w.fmt.name}, K={w.shape[1]}, {w.device}) cannot join weight 0 "
                             f"({fmt.name}, K={w0.shape[1]}, {w0.device})")
        if fmt.block_rows > 1 and int(w.shape[0]) % fmt.block_rows:
            raise ValueError(f"{OP}: weight {i} has N={w.shape[0]}, not whole {fmt.block_rows}-row blocks")
    g = w0.global_scale
    if g is not None and any(not torch.equal(w.global_scale, g) for w in ws[1:]):
        raise ValueError(f"{OP}: the weights' global scales differ; they cannot share one launch")
    n = sum(int(w.shape[0]) for w in ws)
    return QTensor(torch.cat([w.data for w in ws]), torch.cat([w.scales for w in ws]), fmt,
                   torch.Size((n, int(w0.shape[1]))), w0.dtype, g,
                   None if w0.zero_points is None else torch.cat([w.zero_points for w in ws]), dict(w0.meta))


def _same_global(w: QTensor, p: QTensor) -> bool:
    if w.global_scale is None or p.global_scale is None:
        return w.global_scale is None and p.global_scale is None
    if w.global_scale is p.global_scale:
        return True
    if w.global_scale.is_cuda and torch.cuda.is_current_stream_capturing():
        return False  # (comparing values would sync the host, which a capture refuses: separate launches)
    return bool(torch.equal(w.global_scale, p.global_scale))


def _groups(ws: list[QTensor]) -> list[list[int]]:
    """Runs of consecutive weights that can share a launch (see the module docstring)."""
    groups: list[list[int]] = []
    for i, w in enumerate(ws):
        if groups:
            p = ws[groups[-1][0]]
            rows_ok = w.fmt.block_rows == 1 or (int(w.shape[0]) % w.fmt.block_rows == 0
                                                and int(p.shape[0]) % p.fmt.block_rows == 0)
            if w.fmt == p.fmt and rows_ok and w.shape[1] == p.shape[1] and _same_global(w, p):
                groups[-1].append(i)
                continue
        groups.append([i])
    return groups


def _plan(weights: list[QTensor]) -> tuple:
    """``(groups, one weight per group (joined where several), N of each weight)`` for these weights,
    kept while they live and are unchanged in place (not while a CUDA graph is being captured): a
    repeat call checks identities and versions only."""
    key = tuple(id(w) for w in weights)
    hit = _PLANS.get(key)
    vers = _versions(weights)
    if hit is not None and hit[1] == vers and all(r() is w for r, w in zip(hit[0], weights)):
        return hit[2]
    for i, w in enumerate(weights):
        if not isinstance(w, QTensor) or len(w.shape) != 2:
            raise TypeError(f"{OP}: weights[{i}] must be a 2-D QTensor [N, K], got "
                            f"{type(w).__name__}{'' if not isinstance(w, QTensor) else tuple(w.shape)}")
        if int(w.shape[1]) != int(weights[0].shape[1]):
            raise ValueError(f"{OP}: weights[{i}] has K={w.shape[1]}; weights[0] has K={weights[0].shape[1]}")
    groups = _groups(weights)
    plan = (groups, [weights[g[0]] if len(g) == 1 else join_weights([weights[i] for i in g]) for g in groups],
            [int(w.shape[0]) for w in weights])
    w0 = weights[0]
    if not (w0.data.is_cuda and torch.cuda.is_current_stream_capturing()):
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = (tuple(weakref.ref(w) for w in weights), vers, plan)
    return plan


def linear_batched(x: torch.Tensor, weights: list[QTensor], biases: list[torch.Tensor | None] | None = None, *,
                   concat: bool = False) -> list[torch.Tensor]:
    """``[linear(x, w_i, b_i) for i]`` with the weights joined along N: one launch per run of
    consecutive weights sharing format and global scale (q/k/v quantized together: one launch).

    Args:
        x: bfloat16 / float16 ``[..., K]``.
        weights: QTensors ``[N_i, K]``, the same K (formats may differ).
        biases: None, or one entry per weight (None or ``[N_i]``).
        concat: the outputs are views of one ``[..., sum N_i]`` buffer even when the weights
            form several groups (then each group's result is copied in). With one group they
            always are.

    Returns:
        A list of ``[..., N_i]`` tensors in x's dtype (``out[i]`` equals ``linear(x, w_i, b_i)``
        up to the kernel's own summation order).
    """
    if not isinstance(weights, (list, tuple)) or not weights:
        raise TypeError(f"{OP}: weights must be a non-empty list of QTensors, got {type(weights).__name__}")
    groups, joined, ns = _plan(list(weights))
    if biases is not None:
        if len(biases) != len(weights):
            raise ValueError(f"{OP}: {len(biases)} biases for {len(weights)} weights")
        for i, b in enumerate(biases):
            if b is not None and tuple(b.shape) != (ns[i],):
                raise ValueError(f"{OP}: biases[{i}] has shape {tuple(b.shape)}; expected ({ns[i]},)")
    if len(groups) == 1 and biases is None:  # (the q/k/v case: one launch, the outputs views of its result)
        return list(linear(x, joined[0]).split_with_sizes(ns, dim=-1))  # (Tensor.split's Python wrapper: ~2 µs)
    outs: list[torch.Tensor | None] = [None] * len(weights)
    for g, w in zip(groups, joined):
        bias = None
        if biases is not None and any(biases[i] is not None for i in g):
            bias = torch.cat([biases[i].to(torch.float32) if biases[i] is not None
                              else torch.zeros(ns[i], dtype=torch.float32, device=x.device) for i in g])
            if len(g) == 1:
                bias = biases[g[0]]
        y = linear(x, w, bias)
        if len(g) == 1:
            outs[g[0]] = y
        else:
            for i, part in zip(g, y.split_with_sizes([ns[i] for i in g], dim=-1)):
                outs[i] = part
    if concat and len(groups) > 1:
        buf = torch.cat(outs, dim=-1)
        return list(buf.split(ns, dim=-1))
    return outs
