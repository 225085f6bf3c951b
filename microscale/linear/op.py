"""The public op: ``linear(x, qweight, bias)`` and its ``torch.library`` registration.

A QTensor weight on CUDA takes the first backend of :mod:`.routing`'s table that serves the call
(eager calls of the decode routes replay a call plan, :mod:`.plans`); a
:class:`~microscale.linear.PackedLinearWeight` (the ``torch.compile`` route) and whatever no
backend serves run the custom op ``torch.ops.microscale.linear``: the split-K kernel on CUDA, the
float64 reference elsewhere.
"""
from __future__ import annotations

import json

import torch

from ..formats import Format
from ..qtensor import QTensor
from ..runtime import launch as _kl
from . import tuning
from .backends.reference import reference_run
from .backends.splitk import splitk_run
from .eligibility import check
from .packed import PackedLinearWeight, cached_prepare, fmt_json
from .plans import REFUSED, SEEN, Plan, plan_key
from .routing import cached, route
from .scaled import linear_act
from .weight_state import state


def _unpack_args(codes, scales, zero_points, global_scale, fmt_json, n, k, specials) -> PackedLinearWeight:
    fmt = Format.from_dict(json.loads(fmt_json))
    cb = 4 if fmt.element.bits <= 4 else 8
    return PackedLinearWeight(fmt, n, k, cb, codes, scales, zero_points, global_scale, specials)


@torch.library.custom_op("microscale::linear", mutates_args=())
def _linear_op(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
               global_scale: torch.Tensor | None, bias: torch.Tensor | None, fmt_json: str, n: int, k: int,
               specials: bool) -> torch.Tensor:
    pw = _unpack_args(codes, scales, zero_points, global_scale, fmt_json, n, k, specials)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x.device.type == "cuda":
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        y = splitk_run(x2, pw, bias)
    else:
        y = reference_run(x2, pw, bias)
    return y.reshape(*lead, n)


@_linear_op.register_fake
def _(x, codes, scales, zero_points, global_scale, bias, fmt_json, n, k, specials):
    return x.new_empty((*x.shape[:-1], n))


def linear(x: torch.Tensor, qweight: QTensor | PackedLinearWeight, bias: torch.Tensor | None = None, *,
           act_format: str | Format | None = None, fast_accum: bool = False) -> torch.Tensor:
    """``x @ dequant(qweight)^T + bias`` (with ``act_format``: ``quantize(x)`` in place of ``x``).

    On CUDA a QTensor weight takes the first backend of :data:`microscale.linear.routing.TABLE` that
    serves the call (by token count, format, activation dtype and device; the thresholds are fields
    of :mod:`microscale.linear.tuning`; :func:`microscale.linear.routing.explain` says why each backend
    refused a call). Whatever no backend serves, and a :class:`PackedLinearWeight`, runs the split-K
    tensor-core kernel; CPU tensors run the float64 reference.

    Per-weight facts (views, scans, tables, packed weight, call plans) are computed once and kept in
    the weight's state (:mod:`microscale.linear.weight_state`), which follows in-place changes through
    torch's version counters. Eager calls on the decode routes replay a call plan from the third call
    with the same shapes, dtypes, alignment and stream (:mod:`microscale.linear.plans`); other repeat
    calls launch the route recorded for their key (:mod:`microscale.linear.route_cache`).

    On Hopper the f16x2 GEMV runs as a programmatic dependent launch chain: once a weight has been
    used and its tensors are unchanged, the GEMV may start reading it while earlier kernels that let
    their dependents launch early are still running (microscale's GEMV and dequantize do). A weight
    rewritten by other means than torch (a custom kernel writing its memory) must not be rewritten
    by such kernels right before the call; or set ``tuning.gemv_pdl_chain`` off.

    While a CUDA graph is being captured, per-weight tables not yet kept are made for the call and
    not kept (the graph rebuilds them at every replay; an eager call first avoids that), and scans
    no eager call made take their conservative answer (a scan is a host sync, which a capture
    refuses). A graph replays what it captured of a weight: after changing a weight in place,
    capture again.

    Args:
        x: bfloat16 or float16 ``[..., K]``.
        qweight: a QTensor ``[N, K]`` (prepared once, kept in its state) or the result of
            :func:`prepare` (pass the latter inside ``torch.compile(fullgraph=True)``).
        bias: optional ``[N]`` (any float dtype; added in fp32).
        act_format: quantize x on the fly to this format (a preset name or Format) and run both
            quantized through :func:`microscale.scaled_mm` (:func:`.scaled.linear_act`): block scales
            from x (dynamic); for a two-level format (NVFP4) the per-tensor scale is the static
            activation scale the weight carries (ModelOpt ``input_scale``, compressed-tensors
            ``input_global_scale``), else x's amax. x may then also be float32; qweight must be a
            QTensor. None (default): weight-only, x stays in its dtype.
        fast_accum: with ``act_format``, :func:`microscale.scaled_mm`'s ``fast_accum`` (fp8 tensor
            cores with Hopper's in-instruction sums for fp8-code pairs such as fp8 block-128 W8A8;
            about 1e-4 relative from the exact result). Refused without ``act_format``.

    Returns:
        ``[..., N]`` in x's dtype.
    """
    if act_format is not None:
        return linear_act(x, qweight, bias, act_format, fast_accum)
    if fast_accum:
        raise ValueError("linear: fast_accum=True needs act_format (it is scaled_mm's allowance; the weight-only "
                         "kernels are exact)")
    checked = False
    if isinstance(qweight, QTensor):
        plans = key = plan = None
        key = plan_key(x, qweight, bias)
        if key is not None:
            plans = state(qweight).plans
            plan = plans.get(key)
            if type(plan) is Plan:
                return plan(x, bias)
        y = None
        if plan is not SEEN:  # a repeat call: the route's launches as cached (x and bias as in its key)
            y = cached(x, qweight, bias)
        if y is None:
            if len(qweight.shape) == 2:  # (prepare() below explains other shapes)
                check(x, qweight.shape[0], qweight.shape[1], qweight.device, bias)
                checked = True
            if plan is not SEEN:  # no plans, refused, or a key's first call (a weight's first use is
                y, _ = route(x, qweight, bias)  # not its steady state: its views are made then)
        if plan is not SEEN:
            if plans is not None and plan is None:
                if len(plans) >= tuning.get().plans_per_weight:
                    plans.clear()
                plans[key] = SEEN
        else:  # the second call: recorded (its route as the table gives it, not a cached one)
            rec: list = []
            _kl.record(rec)
            try:
                y, plannable = route(x, qweight, bias, cache=False)
            finally:
                _kl.record(None)
            plans[key] = (Plan.build(rec, (x, bias), y) if plannable else None) or REFUSED
        if y is not None:
            return y
    pw = qweight if isinstance(qweight, PackedLinearWeight) else cached_prepare(qweight)
    if not checked:
        check(x, pw.n, pw.k, pw.device, bias)
    return torch.ops.microscale.linear(x, pw.codes, pw.scales, pw.zero_points, pw.global_scale, bias,
                                       fmt_json(pw.fmt), pw.n, pw.k, pw.specials)
