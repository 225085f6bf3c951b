"""Which backend serves a ``linear`` call on a QTensor weight: one ordered table, the first
backend whose ``supports`` returns None takes the call; ``supports`` returns why not otherwise.
The thresholds are fields of :mod:`.tuning` (their evidence: docs/decisions/linear-*.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..qtensor import QTensor
from ..runtime import launch as _kl
from . import tuning
from .backends.decode_tma import decode_tma_reason, decode_tma_run, dt_big, dt_large, dt_min_m, dt_tile, \
    dt_weight_descs
from .backends.gemv import choose_gemv_config, gemv, gemv_supported
from .backends.gemv_mma import gemv_mma_default_config, gemv_mma_reason, gemv_mma_run
from .backends.prefill import prefill, prefill_supported
from .backends.prefill_ws import prefill_ws_reason, prefill_ws_run
from .eligibility import fp4_codes
from .route_cache import ROUTES_PER_WEIGHT, Replay, call_key
from .weight_state import kept, state, views

__all__ = ["Call", "Backend", "TABLE", "route", "cached", "explain"]


class Call:
    """One call's facts as the backends ask for them: ``x`` ``[..., K]``, its 2-D view ``x2``, the
    token count ``m``, the weight ``q``, ``bias``, the tuning record ``t``, and what a backend's
    ``supports`` left for its ``run`` (``config``)."""

    __slots__ = ("x", "x2", "m", "q", "bias", "t", "config")

    def __init__(self, x: torch.Tensor, q: QTensor, bias: torch.Tensor | None):
        self.x, self.q, self.bias = x, q, bias
        k = x.shape[-1]
        self.x2 = x.reshape(-1, k)
        self.m = x.numel() // k if k else 0
        self.t = tuning.get()
        self.config = None


@dataclass(frozen=True)
class Backend:
    """A row of the table: ``supports(call)`` says why it cannot serve the call (None: it can);
    ``run(call)`` launches it on ``call.x2``; ``plannable``: its output is made by ``torch.empty``
    and filled by its launches alone, x and bias taken as given (what a call plan and a cached route
    replay), for the calls where ``pure(call)`` holds (None: all); ``cached``: repeat calls replay it
    (:func:`cached`; None: where plannable; the prefill kernel is cached, not planned)."""

    name: str
    supports: Callable[[Call], "str | None"]
    run: Callable[[Call], torch.Tensor]
    plannable: bool
    pure: "Callable[[Call], bool] | None" = None
    cached: "bool | None" = None


def ws_min_m(q: QTensor) -> int:
    """The fewest tokens sent to ``prefill_ws`` outside the small-weight rule: ``prefill_ws_min_m_8bit``
    for 8-bit codes but integers with fp16 scales in blocks of 32 (the Triton prefill kernel keeps
    those up to 64 tokens; docs/decisions/linear-prefill-ws.md)."""
    f = q.fmt
    t = tuning.get()
    if f.element.bits == 8 and not (f.scale.name == "fp16" and f.block_size == 32):
        return t.prefill_ws_min_m_8bit
    return t.prefill_ws_min_m


def decode_tma_wanted(x: torch.Tensor, q: QTensor) -> bool:
    """Whether ``x``'s token count goes to ``decode_tma`` by ``tuning.decode_tma`` (its own limits
    aside): always while a CUDA graph is captured (``auto``, ``graph``); eagerly (``auto``, with call
    plans) above 16 tokens, from ``decode_tma_eager_min_m`` on large weights, and above ``gemv_max_m``
    where no ``gemv_mma`` serves (other formats, fp16 activations)."""
    t = tuning.get()
    if t.decode_tma == "always":
        return True
    if t.decode_tma == "never" or not x.is_cuda:
        return False
    if torch.cuda.is_current_stream_capturing():
        return True
    m = x.numel() // x.shape[-1]
    mma_kernel = fp4_codes(q) and x.dtype == torch.bfloat16  # (gemv_mma keeps small E2M1 weights to 16 tokens)
    return t.decode_tma == "auto" and t.plans and (
        m > 16 or (m >= t.decode_tma_eager_min_m and dt_large(q)) or (m > t.gemv_max_m and not mma_kernel))


def prefill_ws_small_wanted(x: torch.Tensor, q: QTensor) -> bool:
    """Whether ``x`` goes to ``prefill_ws`` below ``prefill_ws_min_m`` tokens (its own limits aside):
    ``prefill_ws_small_min_m..decode_tma_max_m`` tokens on E2M1 weights of at most
    ``prefill_ws_small_max_nk`` elements (``prefill_ws_small_max_nk_bf16`` where ``decode_tma`` would
    take its 256-row tile) while a CUDA graph is captured (eager calls: a planned ``decode_tma``
    call costs the host less), unless ``decode_tma`` is forced."""
    t = tuning.get()
    k = x.shape[-1]
    if not (t.prefill_ws and t.decode_tma != "always" and x.is_cuda and fp4_codes(q)
            and t.prefill_ws_small_min_m * k <= x.numel() <= t.decode_tma_max_m * k
            and torch.cuda.is_current_stream_capturing()):
        return False
    big = dt_big(q, x.numel() // k, x.dtype, x.device)  # decode_tma's 256-row tile: ahead on smaller weights
    return q.shape[0] * q.shape[-1] <= (t.prefill_ws_small_max_nk_bf16 if big else t.prefill_ws_small_max_nk)


def _ws_small(c: Call) -> str | None:
    if not prefill_ws_small_wanted(c.x, c.q):
        return "takes small E2M1 weights at prefill_ws_small_min_m..decode_tma_max_m tokens in graph captures"
    return prefill_ws_reason(c.q, c.x2)


def _decode_tma(c: Call) -> str | None:
    q = c.q
    if not dt_min_m(q) <= c.m <= c.t.decode_tma_max_m:
        return f"takes {dt_min_m(q)}..{c.t.decode_tma_max_m} tokens of this weight"
    if decode_tma_wanted(c.x, q):
        return decode_tma_reason(q, c.x2)
    if c.t.decode_tma != "never" and decode_tma_reason(q, c.x2) is None:
        # an eager call that a CUDA graph captured later would send here: the weight's tables now, not
        # inside the graph (where they would be rebuilt at every replay)
        dt_weight_descs(q, views(q), dt_tile(q, c.x2)[0])
    return "not wanted for this call (tuning.decode_tma and the eager thresholds)"


def _gemv_short_steps(c: Call) -> bool:
    """Whether the f16x2 GEMV would walk ``c``'s K in steps of fewer than ``gemv_mma_short_k_words`` words
    (K with few powers of two: gpt-oss's 2880 takes 8-word steps, 30-45 µs where gemv_mma took 14-23 µs at
    one token on an H100)."""
    if len(c.q.shape) != 2:
        return False
    k = c.q.shape[-1]
    bits = c.q.fmt.element.bits
    return (k * bits) % 32 == 0 and choose_gemv_config(c.q.shape[0], k, c.x.device, c.m, bits).block_kw \
        < c.t.gemv_mma_short_k_words


def _gemv_mma(c: Call) -> str | None:
    if c.m < c.t.gemv_mma_min_m and not _gemv_short_steps(c):
        return f"takes at least gemv_mma_min_m={c.t.gemv_mma_min_m} tokens (fewer where the GEMV's K steps are short)"
    cfg = gemv_mma_default_config(c.q, c.x)
    if cfg is None:
        return "has no config for this shape"
    c.config = cfg
    return gemv_mma_reason(c.q, c.x, cfg)


def _gemv(c: Call) -> str | None:
    return None if gemv_supported(c.q, c.x) else "takes 4/8-bit codes in whole words, at most gemv_max_m tokens"


def _prefill_ws(c: Call) -> str | None:
    if not c.t.prefill_ws:
        return "off (tuning.prefill_ws)"
    if c.m < ws_min_m(c.q):
        return f"takes at least {ws_min_m(c.q)} tokens of this weight"
    return prefill_ws_reason(c.q, c.x2)


def _prefill(c: Call) -> str | None:
    return None if prefill_supported(c.q, c.x) else "takes 4/8-bit codes in 1-D blocks, K a multiple of 64"


def _gemv_fallback(c: Call) -> str | None:
    if gemv_supported(c.q, c.x, c.t.gemv_fallback_m):
        return None
    return "takes 4/8-bit codes in whole words, at most gemv_fallback_m tokens"


def _gemv_pure(c: Call) -> bool:
    return c.m <= 4 or c.m % 4 == 0  # (else the GEMV zeroes its padded activation rows per call)


#: the backends in the order they are asked; a call no row serves runs the split-K kernel
TABLE: tuple[Backend, ...] = (
    Backend("prefill_ws_small", _ws_small, lambda c: prefill_ws_run(c.x2, c.q, c.bias), False),
    Backend("decode_tma", _decode_tma, lambda c: decode_tma_run(c.x2, c.q, c.bias), True),
    Backend("gemv_mma", _gemv_mma, lambda c: gemv_mma_run(c.x2, c.q, c.bias, c.config), True),
    Backend("gemv", _gemv, lambda c: gemv(c.x2, c.q, c.bias), True, _gemv_pure),
    Backend("prefill_ws", _prefill_ws, lambda c: prefill_ws_run(c.x2, c.q, c.bias), False),
    Backend("prefill", _prefill, lambda c: prefill(c.x2, c.q, c.bias), False, cached=True),
    Backend("gemv_fallback", _gemv_fallback, lambda c: gemv(c.x2, c.q, c.bias), True, _gemv_pure),
)


class Chosen:
    """A cached route that is not replayed (its launches take tensors made per call, or Triton's own
    path): the backend the table chose for the key and what its ``supports`` left for its ``run``."""

    __slots__ = ("backend", "config")

    def __init__(self, backend: Backend, config):
        self.backend, self.config = backend, config

    def __call__(self, x: torch.Tensor, q: QTensor, bias: torch.Tensor | None) -> torch.Tensor:
        c = Call(x, q, bias)
        c.config = self.config
        return self.backend.run(c).reshape(*x.shape[:-1], q.shape[0])


def _keep(st, ck: tuple, r) -> None:
    if len(st.routes) >= ROUTES_PER_WEIGHT:
        st.routes.clear()
    st.routes[ck] = r


def route(x: torch.Tensor, q: QTensor, bias: torch.Tensor | None, cache: bool = True) -> \
        tuple[torch.Tensor | None, bool]:
    """Run the first backend that serves ``x @ dequant(q)^T (+ bias)`` (x and bias already checked):
    ``(out, plannable)``, or ``(None, False)`` when none does (the split-K kernel / the reference).
    With ``cache``, the call's route is kept in the weight's state for its key (:mod:`.route_cache`),
    which :func:`cached` serves: a steady call (one that made no new weight fact) of a route whose
    launches replay is recorded (:class:`~microscale.linear.route_cache.Replay`); other routes keep
    the backend chosen (:class:`Chosen`)."""
    if not x.is_cuda:
        return None, False
    ck = call_key(x, bias) if cache else None
    st = state(q) if ck is not None else None
    facts = len(st.facts) if st is not None else -1
    c = Call(x, q, bias)
    for b in TABLE:
        if b.supports(c) is None:
            pure = b.pure is None or b.pure(c)
            plannable = b.plannable and pure
            if st is None:
                return b.run(c).reshape(*x.shape[:-1], q.shape[0]), plannable
            if not (pure and (b.plannable if b.cached is None else b.cached)):
                if st is kept(q):
                    _keep(st, ck, Chosen(b, c.config))
                return b.run(c).reshape(*x.shape[:-1], q.shape[0]), plannable
            rec: list = []
            _kl.record(rec)
            try:
                y = b.run(c)
            finally:
                _kl.record(None)
            if len(st.facts) == facts and st is kept(q):  # a steady call, its state kept
                r = Replay.build(rec, c.x2, bias, y)
                _keep(st, ck, r if r is not None else Chosen(b, c.config))
            return y.reshape(*x.shape[:-1], q.shape[0]), plannable
    return None, False


def cached(x: torch.Tensor, q: QTensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``linear(x, q, bias)`` by the weight's cached route for the call's key (see :func:`route`),
    or None when none is kept: the route's launches with x, bias and a new output put in, or the
    backend chosen for the key run without asking the table."""
    ck = call_key(x, bias)
    if ck is None:
        return None
    r = state(q).routes.get(ck)
    return r(x, q, bias) if r is not None else None


def explain(x: torch.Tensor, q: QTensor) -> list[tuple[str, str | None]]:
    """``(backend, why not)`` for each row of the table up to the one that would take the call (its
    reason None): what :func:`microscale.linear.linear` would do with ``x`` and ``q``."""
    if not x.is_cuda:
        return [("reference", None)]
    c = Call(x, q, None)
    out = []
    for b in TABLE:
        why = b.supports(c)
        out.append((b.name, why))
        if why is None:
            return out
    return out + [("splitk", None)]
