"""``rmsnorm_linear(x, norm_weight, w, bias, *, eps, gate=None)``: ``linear(rmsnorm(x) * norm_weight
[* silu(gate)], w)`` as two launches on CUDA: the norm (one kernel, float32 math, the normalized rows
in x's dtype) and the projections through :func:`microscale.linear.batched.linear_batched` (weights
of the same K joined, e.g. q/k/v: one launch of the linear op's own route).

Why not the norm as a GEMM prologue: that ran on the split-K kernel, and on an H100 at one token
(Llama-3-8B q/k/v, NVFP4, CUDA graphs) it took 35.5 µs where RMSNorm + three ``ms.linear`` calls
took 22 µs; the decode GEMVs that reach ~95% of copy bandwidth have no prologue, and the normalized
row is a few KiB. CPU tensors run the float64 composition.
"""
from __future__ import annotations

import torch

from ..formats import Format, get_format
from ..qtensor import QTensor
from ..runtime import launch as _kl
from ..runtime import target
from ..runtime.launch import cdiv, launch, next_pow2
from . import tuning
from .batched import _plan as batched_plan
from .batched import linear_batched
from .eligibility import check
from .plans import plan_key, plannable, through_plan
from .routing import route
from .weight_state import state

__all__ = ["rmsnorm_linear", "rmsnorm_linear_reference"]

OP = "rmsnorm_linear"


def rmsnorm_linear_reference(x: torch.Tensor, norm_weight: torch.Tensor, w: QTensor, bias: torch.Tensor | None = None,
                             *, eps: float, gate: torch.Tensor | None = None) -> torch.Tensor:
    """The float64 composition: ``(x * rsqrt(mean(x^2) + eps) * norm_weight [* silu(gate)]) @ dequant(w)^T
    + bias``, returned in x's dtype."""
    y = _normalized(x, norm_weight, eps, gate, torch.float64) @ w.dequantize(torch.float64).to(x.device).T
    if bias is not None:
        y = y + bias.to(torch.float64)
    return y.to(x.dtype)


def _normalized(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, gate: torch.Tensor | None,
                dtype: torch.dtype) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * norm_weight [* silu(gate)]`` computed in ``dtype``."""
    xd = x.to(dtype)
    h = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.to(dtype)
    return h if gate is None else h * torch.nn.functional.silu(gate.reshape(h.shape).to(dtype))


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
                   gate: torch.Tensor | None = None, kernel: bool | None = None, act_format: str | Format | None = None,
                   fast_accum: bool = False) -> torch.Tensor | list[torch.Tensor]:
    """``linear(rmsnorm(x) * norm_weight [* silu(gate)], w, bias)``, the norm fused into the GEMM.

    With ``act_format``: the normalized activations quantized to that format (block scales from the data; a
    two-level format's per-tensor scale is the weight's static activation scale, else their amax) and
    multiplied by :func:`microscale.scaled_mm`, as ``ms.linear(..., act_format=...)`` does. On CUDA (or under
    the interpreter with ``kernel=True``) one pass normalizes and quantizes
    (:func:`microscale.quant.fused.rmsnorm_quantize`; no gate, 1-D blocks, K whole blocks, and for a two-level
    format a static activation scale), so the normalized rows never go to memory; otherwise the float32
    normalized rows are quantized by :func:`microscale.quantize`. Each distinct activation quantization is
    made once for all of ``w``.

    Args:
        x: bfloat16 / float16 ``[..., K]`` (also float32 with ``act_format``).
        norm_weight: ``[K]`` (any float dtype).
        w: a QTensor ``[N, K]`` in any registry format, or a list of them (then ``bias`` is a list
            too, or None) for the norm followed by several projections in one launch.
        bias: optional ``[N]`` (or a list, see ``w``).
        eps: the RMSNorm epsilon (``x * rsqrt(mean(x^2) + eps)``, float32 on the GPU).
        gate: optional ``[..., K]`` like x: the normalized activations are multiplied by
            ``silu(gate)`` (gated RMSNorm).
        kernel: run the Triton kernel (default: on CUDA tensors; True on CPU tensors needs
            ``TRITON_INTERPRET=1``).
        act_format: quantize the normalized activations to this format and run both quantized (see above);
            None (default): weight-only.
        fast_accum: with ``act_format``, :func:`microscale.scaled_mm`'s ``fast_accum``.

    Returns:
        ``[..., N]`` in x's dtype (a list for a list ``w``, in its order).
    """
    many = isinstance(w, (list, tuple))
    ws = list(w) if many else [w]
    if fast_accum and act_format is None:
        raise ValueError(f"{OP}: fast_accum=True needs act_format (it is scaled_mm's allowance)")
    if (act_format is None and bias is None and kernel is not False and x.is_cuda and isinstance(eps, float)
            and x.dim() == 2
            and isinstance(norm_weight, torch.Tensor)
            and all(isinstance(q, QTensor) and len(q.shape) == 2 for q in ws)):
        ys = _call_planned(x, norm_weight, gate, eps, ws, hit_only=True)  # (None unless a plan replays)
        if ys is not None:
            return ys if many else ys[0]
    bs = (list(bias) if bias is not None else [None] * len(ws)) if many else [bias]
    if len(bs) != len(ws):
        raise ValueError(f"{OP}: {len(bs)} biases for {len(ws)} weights")
    for i, q in enumerate(ws):
        if not isinstance(q, QTensor) or len(q.shape) != 2:
            raise TypeError(f"{OP}: weight {i} must be a 2-D QTensor [N, K], got {type(q).__name__}")
        dts = (torch.bfloat16, torch.float16) + (() if act_format is None else (torch.float32,))
        check(x, int(q.shape[0]), int(q.shape[1]), q.device, bs[i], dts)
    _check_norm(x, norm_weight, gate, eps)
    use_kernel = x.device.type == "cuda" if kernel is None else kernel
    if use_kernel and x.device.type != "cuda" and not target.interpreting():
        raise ValueError(f"{OP}: kernel=True on {x.device} tensors needs TRITON_INTERPRET=1")
    if act_format is not None:
        outs = _act_quantized(x, norm_weight, ws, bs, eps, gate, get_format(act_format), fast_accum, use_kernel)
        return outs if many else outs[0]
    if not use_kernel:
        outs = [rmsnorm_linear_reference(x, norm_weight, q, b, eps=eps, gate=gate) for q, b in zip(ws, bs)]
        return outs if many else outs[0]
    return _fused_run(x, norm_weight, ws, bs, eps, gate, many)


def _norm_quantized(x2: torch.Tensor, norm_weight: torch.Tensor, gate: torch.Tensor | None, eps: float, fmt: Format,
                    gs: torch.Tensor | None, use_kernel: bool) -> QTensor:
    """``rmsnorm(x2) * norm_weight [* silu(gate)]`` quantized to ``fmt`` with per-tensor scale ``gs`` (None: the
    amax's), K zero-padded to whole blocks: one fused pass where it serves, else float32 rows then quantize."""
    from ..ops import quantize
    from ..quant.fused import rmsnorm_quantize

    if (use_kernel and gate is None and fmt.block_rows == 1 and x2.shape[-1] % fmt.block_size == 0
            and (gs is not None or not fmt.global_scale)):
        return rmsnorm_quantize(x2, norm_weight, fmt, eps=eps, global_scale=gs)
    return quantize(_normalized(x2, norm_weight, eps, gate, torch.float32), fmt, global_scale=gs, pad=True)


def _act_quantized(x: torch.Tensor, norm_weight: torch.Tensor, ws: list, bs: list, eps: float,
                   gate: torch.Tensor | None, fmt: Format, fast_accum: bool, use_kernel: bool) -> list[torch.Tensor]:
    """The ``act_format`` path: the normalized activations quantized once per distinct per-tensor scale,
    then :func:`microscale.scaled_mm` with each weight."""
    from .scaled import activation_scale, activation_scale_source, scaled_mm

    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    made: dict = {}
    outs = []
    for q, b in zip(ws, bs):
        gs = activation_scale(q) if fmt.global_scale else None
        key = None if gs is None else activation_scale_source(q)  # (equal sources: one quantization)
        a = made.get(key)
        if a is None:
            a = made[key] = _norm_quantized(x2, norm_weight, gate, eps, fmt, gs, use_kernel)
        outs.append(scaled_mm(a, q, bias=b, out_dtype=x.dtype, fast_accum=fast_accum).reshape(*lead, q.shape[0]))
    return outs


#: The norm kernel keeps rows of up to this many elements in registers (one read of x); one row a program
#: (on an H100 at one token of 4096, 4 rows a program in 256-element steps took 9.3 µs, F.rms_norm 4.3).
NORM_BLOCK_K = 8192


def _norm_rows(x2: torch.Tensor, nw: torch.Tensor, gate: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The normalized rows of 2-D x (one launch; checked arguments)."""
    from ._kernels import _norm_kernels as kern

    m, k = x2.shape
    out = torch.empty_like(x2)
    if m == 0:
        return out
    bk = min(next_pow2(max(k, 1)), NORM_BLOCK_K)
    launch(kern._rmsnorm_kernel, (m,), x2, nw, gate if gate is not None else x2, out, m, k,
           x2.stride(0), gate.stride(0) if gate is not None else 0, out.stride(0), EPS=float(eps),
           GATED=gate is not None, BLOCK_M=1, BLOCK_K=bk, ITERS=cdiv(k, bk), num_warps=max(1, min(16, bk // 512)))
    return out


_NORM_PLANS: dict = {}  # key -> SEEN | REFUSED | Plan of the norm launch (see _norm_planned)
_MAX_NORM_PLANS = 256


def _norm_planned(x2: torch.Tensor, nw: torch.Tensor, gate: torch.Tensor | None, eps: float) -> torch.Tensor:
    """:func:`_norm_rows` through a call plan in eager mode, as :func:`linear` does (recorded on a key's second
    call, replayed from its third: the launch's arguments bound once; the key: the shapes, dtypes, devices and
    16-byte alignment of x, gate and the norm weight, eps, the stream and the tuning record in force)."""
    if not (plannable(x2) and nw.is_contiguous()
            and (gate is None or (gate.is_contiguous() and gate.data_ptr() != x2.data_ptr()))):  # (x as its gate:
        return _norm_rows(x2, nw, gate, eps)  # one address, which a replay could not tell apart)
    key = (x2.shape, x2.dtype, x2.device, x2.data_ptr() % 16, nw.shape, nw.dtype, nw.device, nw.data_ptr() % 16,
           None if gate is None else (gate.shape, gate.dtype, gate.data_ptr() % 16), eps, _kl.current_stream(),
           tuning.serial())
    h = through_plan(_NORM_PLANS, key, (x2, nw, gate), lambda: (_norm_rows(x2, nw, gate, eps), True),
                     _MAX_NORM_PLANS)
    return _norm_rows(x2, nw, gate, eps) if h is None else h


def _call_planned(x2: torch.Tensor, nw: torch.Tensor, gate: torch.Tensor | None, eps: float,
                  ws: list[QTensor], hit_only: bool = False) -> list[torch.Tensor] | None:
    """The whole eager call (norm, then the joined projection) through one call plan kept with the
    joined weight, as :func:`microscale.linear.linear` keeps its own: recorded on a key's second call,
    replayed from its third (x, the norm weight, gate and the output new each call; the normalized rows
    a buffer of the plan, rewritten by each replay on the key's stream before its GEMM reads them).
    None where no plan serves (weights in several groups or with biases, plans off, first calls): the
    caller takes the separate steps. The key: x's, gate's and the norm weight's shapes, dtypes, devices
    and 16-byte alignment, eps, the stream and the tuning record (:func:`plan_key`), on the joined
    weight's state (so the weights' identity and versions, through ``linear_batched``'s join).
    ``hit_only``: a replay or None, nothing recorded (before the arguments are checked: a key that
    has a plan was checked when it was recorded)."""
    groups, joined, ns = batched_plan(ws)
    if len(groups) != 1:
        return None
    q = joined[0]
    key0 = plan_key(x2, q, None)
    if key0 is None or not nw.is_contiguous() or (gate is not None and (not gate.is_contiguous()
                                                                          or gate.data_ptr() == x2.data_ptr())):
        return None
    key = (OP, key0, nw.shape, nw.dtype, nw.device, nw.data_ptr() % 16,
           None if gate is None else (gate.shape, gate.dtype, gate.device, gate.data_ptr() % 16), eps)

    def run():
        h = _norm_rows(x2, nw, gate, eps)
        return route(h, q, None, cache=False)
    y = through_plan(state(q).plans, key, (x2, nw, gate), run, tuning.get().plans_per_weight, hit_only)
    if y is None:
        return None
    return list(y.split_with_sizes(ns, dim=-1))


def _fused_run(x, norm_weight, ws, bs, eps, gate, many):
    """The kernel route of :func:`rmsnorm_linear` (arguments checked)."""
    k = x.shape[-1]
    lead = x.shape[:-1]
    g2 = None if gate is None else gate.reshape(-1, k).contiguous()
    x2, nw = x.reshape(-1, k).contiguous(), norm_weight.contiguous()
    ys = _call_planned(x2, nw, g2, float(eps), ws) if all(b is None for b in bs) else None
    if ys is None:
        h = _norm_planned(x2, nw, g2, float(eps))
        ys = linear_batched(h, ws, bs if any(b is not None for b in bs) else None)
    outs = ys if len(lead) == 1 else [y.reshape(*lead, y.shape[-1]) for y in ys]
    return outs if many else outs[0]
