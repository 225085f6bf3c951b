"""Eager call plans: the launches of one ``linear`` call recorded on the second call with the
same key and replayed from the third with a new x, bias and output (host time per call is then
a fraction of the wrappers'; docs/decisions/linear-call-plans.md)."""
from __future__ import annotations

import torch

from ..qtensor import QTensor
from ..runtime import launch as _kl
from . import tuning


SEEN, REFUSED = object(), object()  # a key's first call (recorded on its second); no plan


def plannable(x: torch.Tensor) -> bool:
    """Whether a call on ``x`` may replay a plan: plans on, a contiguous CUDA x, no graph capture, no launch
    hooks, no tracing."""
    return (tuning.get().plans and x.is_cuda and x.is_contiguous() and not torch.cuda.is_current_stream_capturing()
            and not _kl.hooked() and not torch.compiler.is_compiling())


def plan_key(x: torch.Tensor, q: QTensor, bias: torch.Tensor | None) -> tuple | None:
    """What a plan of ``linear(x, q, bias)`` depends on besides the weight's version (plans live in
    its state), or None when no plan may serve it (CPU, non-contiguous x or bias, graph capture,
    launch hooks, tracing, plans off): x's and bias's shape, dtype, device and 16-byte alignment,
    the current stream and the tuning record in force."""
    if not plannable(x):
        return None
    if bias is None:
        bk = None
    elif bias.is_contiguous():
        bk = (bias.shape, bias.dtype, bias.device, bias.data_ptr() % 16)
    else:
        return None
    return (x.shape, x.dtype, x.device, x.data_ptr() % 16, bk, _kl.current_stream(), tuning.serial())


def tensor_slots(rec: list, subs: list, match) -> list | None:
    """Where a recorded call (``rec``: ``(compiled, grid, values)`` per launch) passed the call's own
    tensors ``subs`` (x, the output, bias): per launch ``[(position, index in subs, value)]``, or
    None when a tensor at one of their addresses fails ``match(value, tensor)``, a TMA descriptor
    covers one of them, or x, the output or bias is never passed (shared by plans and the route cache)."""
    addrs = [t.data_ptr() for t in subs]
    seen = set()
    out = []
    for _, _, vals in rec:
        found = []
        for i, v in enumerate(vals):
            if isinstance(v, torch.Tensor):
                p = v.data_ptr()
                for j, ptr in enumerate(addrs):
                    if p == ptr:
                        if not match(v, subs[j]):
                            return None
                        found.append((i, j, v))
                        seen.add(j)
                        break
            elif hasattr(v, "block_shape") and hasattr(v, "base"):  # a TMA descriptor: kept as recorded
                if v.base.data_ptr() in addrs:
                    return None
        out.append(found)
    return out if seen == set(range(len(subs))) else None


class Plan:
    """The launches of one call, replayed with new input tensors and a new output; bound once
    (:func:`microscale.runtime.launch.bind`: TMA descriptors encoded, tensors as addresses). The inputs
    are :func:`linear`'s x and bias, or another op's own (its key fixes which of them are None)."""

    __slots__ = ("launches", "shape", "dtype", "device")

    def __init__(self, launches: list, shape: torch.Size, dtype: torch.dtype, device: torch.device):
        self.launches, self.shape, self.dtype, self.device = launches, shape, dtype, device

    @staticmethod
    def build(rec: list, ins: tuple, y: torch.Tensor) -> "Plan | None":
        """The plan of a recorded call on inputs ``ins`` (tensors or None) with output ``y``, or None:
        every launch took the cached path; a tensor argument at an input's or the output's address is
        that tensor (or a same-sized view of it), every other one is the call's own (the weight's views,
        workspaces, scratch: kept alive, and reused by every replay); each input is read and the output
        written by some launch (not a converted copy, as the split-K GEMV's fp32 sums); no TMA descriptor
        covers an input or the output."""
        if not rec or any(r is None for r in rec) or not y.is_contiguous():
            return None
        subs = [y] + [t for t in ins if t is not None]
        per = tensor_slots(rec, subs, lambda v, t: v.dtype.itemsize * v.numel() == t.dtype.itemsize * t.numel())
        if per is None:
            return None
        launches = []
        for (compiled, grid, vals), found in zip(rec, per):
            slots = [(i, j, None if v.dtype == subs[j].dtype else v.dtype) for i, j, v in found]
            # the recorded call's inputs and output are not kept alive by the plan
            kept = [None if any(i == sl[0] for sl in slots) else v for i, v in enumerate(vals)]
            fn, args, pos, ptrs = _kl.bind(compiled, tuple(grid), kept)  # (descriptors encoded once)
            slots = tuple((pos[i], j, None if ptrs else dt) for i, j, dt in slots)  # (an address needs no view)
            launches.append((fn, args, slots, ptrs, kept))  # (kept: what args address stays alive)
        return Plan(launches, y.shape, y.dtype, y.device)

    def __call__(self, *ins: torch.Tensor | None) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        subs = (out,) + tuple(t for t in ins if t is not None)
        addrs = None
        stream = _kl.current_stream()  # (part of the plan's key)
        for fn, args, slots, ptrs, _ in self.launches:
            args = args.copy()
            if ptrs:  # a bound launch takes addresses (inputs: CUDA tensors of the key's device)
                if addrs is None:
                    addrs = tuple(t.data_ptr() for t in subs)
                for i, j, _ in slots:
                    args[i] = addrs[j]
            else:
                for i, j, dt in slots:
                    args[i] = subs[j] if dt is None else subs[j].view(dt)
            fn(stream, args)
        return out


def through_plan(plans: dict, key, ins: tuple, run, cap: int, replay_only: bool = False):
    """One eager call through the plan lifecycle of ``plans[key]``: a kept :class:`Plan` replays on ``ins``;
    a key's first call marks it SEEN; its second runs ``run()`` (returning ``(output, plannable)``) while
    recording and keeps the plan it builds (or REFUSED). Returns the output, or None where the caller runs
    the call itself (a first call, a refused key, or ``replay_only`` without a plan). ``cap``: keys kept
    before the dict is cleared."""
    plan = plans.get(key)
    if type(plan) is Plan:
        return plan(*ins)
    if replay_only:
        return None
    if plan is SEEN:
        rec: list = []
        _kl.record(rec)
        try:
            out, ok = run()
        finally:
            _kl.record(None)
        plans[key] = (Plan.build(rec, ins, out) if ok else None) or REFUSED
        return out
    if plan is None:
        if len(plans) >= cap:
            plans.clear()
        plans[key] = SEEN
    return None
