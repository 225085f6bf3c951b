"""Repeat calls on a prepared weight: per call key, the route's launches recorded once and replayed.

A call's route and launch arguments are pure functions of the weight's version (its state), x's
shape, dtype, device, strides and 16-byte alignment, bias's likewise, the tuning record, the target
facts and the stream (whose scratch buffers and workspaces the launches take). The first steady
call with a key (one that made no new weight fact) records its launches as the cached launcher
resolves them (:func:`microscale.runtime.launch.record`: compiled kernel, grid, argument values);
a later call with the same key checks those cheap facts, looks the key up in the weight's state
and launches the same compiled kernels with the same values, x, bias and a fresh output put in
(docs/decisions/linear-host-time.md). Nothing is cached or replayed while a CUDA graph is captured,
under launch hooks, while tracing, with ``tuning.route_cache`` off, or for launches that took
Triton's own path.
"""
from __future__ import annotations

import torch

from ..runtime import launch as _kl
from ..runtime import target
from . import tuning
from .plans import tensor_slots

__all__ = ["call_key", "Replay", "ROUTES_PER_WEIGHT"]

#: cached routes per weight version (the oldest go all at once past this)
ROUTES_PER_WEIGHT = 64


def call_key(x, bias) -> tuple | None:
    """What a cached route of ``linear(x, q, bias)`` depends on besides the weight's version (the
    cache lives in its state), or None when no cached route may serve the call."""
    if not isinstance(x, torch.Tensor) or not x.is_cuda or not tuning.get().route_cache:
        return None
    if (torch.cuda.is_current_stream_capturing() or torch.compiler.is_compiling() or _kl.hooked()
            or not _kl._FAST):  # (_FAST off: every launch takes Triton's own path, for A/B runs)
        return None
    if bias is None:
        bk = None
    elif isinstance(bias, torch.Tensor):
        bk = (bias.shape, bias.dtype, bias.device, bias.stride(), bias.data_ptr() % 16)
    else:
        return None
    dev = x.device
    return (x.shape, x.dtype, dev, x.stride(), x.data_ptr() % 16, bk, tuning.serial(), target.interpreting(),
            target.capability(dev), target.num_sms(dev), target.pdl_capable(dev),
            _kl.current_stream() if dev.type == "cuda" else 0)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()


class Replay:
    """The launches of one route's call, replayed with the call's x (as ``[M, K]``), bias and a new
    output of ``shape``; ``plannable``: the route's flag (:class:`microscale.linear.routing.Backend`)."""

    __slots__ = ("launches", "shape", "dtype", "device", "n")

    def __init__(self, launches: tuple, shape: torch.Size, dtype: torch.dtype, device: torch.device):
        self.launches, self.shape, self.dtype, self.device = launches, shape, dtype, device
        self.n = shape[-1]

    @staticmethod
    def build(rec: list, x2: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor) -> "Replay | None":
        """The replay of a recorded call, or None: every launch took the cached launcher's path; the
        output ``y`` is written by a launch as it is returned; a tensor argument at x's, bias's or the
        output's address is that tensor itself (same dtype, shape and strides), and x and bias are
        read as given; no TMA descriptor covers them. Every other argument is the weight's (its
        views, tables, descriptors) or the stream's (scratch, workspaces), kept as recorded."""
        if not rec or any(r is None for r in rec):
            return None
        per = tensor_slots(rec, [x2, y] + ([bias] if bias is not None else []), _same)
        if per is None:
            return None
        launches = []
        for (compiled, grid, vals), found in zip(rec, per):
            kept = list(vals)
            for i, _, _ in found:
                kept[i] = None  # (the recorded call's x, bias and output are not kept alive)
            launches.append((compiled, tuple(grid), kept, tuple((i, j) for i, j, _ in found)))
        return Replay(tuple(launches), y.shape, y.dtype, y.device)

    def __call__(self, x: torch.Tensor, q, bias: torch.Tensor | None) -> torch.Tensor:
        """The recorded launches on ``x`` (``[..., K]``, of the key's shape) and ``bias`` (``q``: the
        weight whose state holds this replay): the output."""
        lead = x.dim() != 2
        x2 = x.reshape(self.shape[0], -1) if lead else x
        out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        subs = (x2, out, bias)
        for compiled, grid, vals, slots in self.launches:
            vals = vals.copy()
            for i, j in slots:
                vals[i] = subs[j]
            _kl.run_recorded(compiled, grid, vals)
        return out.reshape(*x.shape[:-1], self.n) if lead else out
