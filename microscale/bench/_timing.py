"""Timing methodology, in one place.

CUDA (:func:`time_cuda`):

1. one call per input set runs first and is synchronized (JIT compilation, autotuning,
   handle creation and per-input caches such as a weight repack stay out of the numbers);
2. warm-up in batches that double until ``warmup_ms`` of device time has passed; the
   last batch gives an estimate of the time per call, measured with CUDA events;
3. calls rotate over several input sets whose bytes together exceed ``3 x L2``
   (:func:`rotation_count`), so memory-bound ops read from HBM, not from L2;
4. calls estimated under ``graph_threshold_us`` (default 10 us), or bound by the host
   (Python launch overhead longer than the device time), are captured in a CUDA graph
   (all input sets, unrolled so that one replay holds at least ``min_graph_calls``
   calls) and the graph replays are timed; a capture that fails falls back to events;
5. otherwise each call is bracketed by its own pair of CUDA events; if those samples
   scatter (20-80th percentile range above ``EVENTS_SPREAD_MAX`` of the median: the
   launch path shows through), the call is re-timed as a graph replay;
6. the statistic is the median over many repetitions (enough to fill ``target_ms``),
   with the 20th and 80th percentiles as the spread.

CPU (:func:`time_cpu`): ``time.perf_counter`` around each call, median.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

import torch

__all__ = [
    "Timing",
    "quantiles",
    "rotation_count",
    "l2_cache_bytes",
    "time_cuda",
    "time_cpu",
]

InputSet = tuple
Fn = Callable[..., Any]


@dataclass(frozen=True)
class Timing:
    """One op's timing.

    Attributes:
        median_ms: median time per call, milliseconds.
        p20_ms: 20th percentile per call (spread, low side).
        p80_ms: 80th percentile per call (spread, high side).
        reps: number of timed samples.
        method: 'events' (a CUDA event pair per call), 'graph' (CUDA graph replays,
            divided by the calls per replay) or 'perf_counter' (CPU wall clock).
        n_sets: number of rotated input sets.
        calls_per_sample: calls that one sample covers (graph: sets x unroll).
        note: why the method was chosen or changed (e.g. a failed graph capture).
        host_us: host time to launch one call (CUDA only): Python and launch overhead,
            which a graph hides and an eager caller pays when it exceeds the device time.
        clocks: the GPU's SM clock and power state while timed, where sampled
            (:class:`microscale.bench._clocks.ClockState` as a dict; the suite fills it).
    """

    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int
    method: str
    n_sets: int
    calls_per_sample: int = 1
    note: str = ""
    host_us: Optional[float] = None
    clocks: Optional[dict] = None

    def to_dict(self) -> dict:
        """JSON-able form."""
        return asdict(self)


def quantiles(samples: Sequence[float]) -> tuple[float, float, float]:
    """(median, 20th percentile, 80th percentile) of ``samples``, by linear interpolation."""
    if not samples:
        raise ValueError("samples is empty; nothing was timed")
    s = sorted(float(v) for v in samples)

    def q(p: float) -> float:
        pos = p * (len(s) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    return q(0.5), q(0.2), q(0.8)


def rotation_count(set_bytes: int, l2_bytes: int, *, factor: float = 3.0, max_sets: int = 256,
                   max_total_bytes: Optional[int] = None) -> int:
    """How many input sets of ``set_bytes`` each to rotate through so that together they
    exceed ``factor x l2_bytes`` (at least 1, at most ``max_sets``, and within
    ``max_total_bytes`` when given)."""
    if set_bytes <= 0:
        raise ValueError(f"set_bytes={set_bytes!r} must be positive")
    if l2_bytes < 0:
        raise ValueError(f"l2_bytes={l2_bytes!r} must be non-negative")
    n = max(1, math.ceil(factor * l2_bytes / set_bytes)) if l2_bytes else 1
    if set_bytes * n <= factor * l2_bytes:  # strictly exceed
        n += 1
    n = min(n, max_sets)
    if max_total_bytes is not None:
        n = min(n, max(1, max_total_bytes // set_bytes))
    return n


def l2_cache_bytes(device: torch.device | str | int | None = None) -> int:
    """The L2 cache size of a CUDA device in bytes (0 where unknown)."""
    props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0) or 0)


def _clamp(v: float, lo: int, hi: int) -> int:
    return int(max(lo, min(hi, v)))


def _event_pair() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _timed_batch(fn: Fn, sets: Sequence[InputSet], start_index: int, k: int) -> tuple[float, float]:
    """Run ``k`` calls rotating over ``sets``; returns (device ms, host launch ms) per call."""
    start, end = _event_pair()
    t0 = time.perf_counter()
    start.record()
    for i in range(k):
        fn(*sets[(start_index + i) % len(sets)])
    end.record()
    host_ms = (time.perf_counter() - t0) * 1e3
    end.synchronize()
    return start.elapsed_time(end) / k, host_ms / k


def _time_events(fn: Fn, sets: Sequence[InputSet], reps: int) -> list[float]:
    pairs = [_event_pair() for _ in range(reps)]
    for i, (start, end) in enumerate(pairs):
        start.record()
        fn(*sets[i % len(sets)])
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in pairs]


def _capture(fn: Fn, sets: Sequence[InputSet], unroll: int) -> torch.cuda.CUDAGraph:
    """Capture ``unroll`` passes over ``sets`` into a CUDA graph, on a side stream after a
    warm-up there (as the CUDA-graph docs ask). Unlike ``torch.cuda.graph``, a call that
    fails during capture always ends the capture and restores the stream, and its own
    error (not the 'capture invalidated' that follows) is the one raised."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for s in sets:
            fn(*s)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        graph.capture_begin()
        try:
            for _ in range(unroll):
                for s in sets:
                    fn(*s)
        except BaseException:
            try:
                graph.capture_end()
            except Exception:
                pass
            raise
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    return graph


def _time_graph(fn: Fn, sets: Sequence[InputSet], unroll: int, reps: int) -> list[float]:
    graph = _capture(fn, sets, unroll)
    calls = unroll * len(sets)
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    pairs = [_event_pair() for _ in range(reps)]
    for start, end in pairs:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    samples = [start.elapsed_time(end) / calls for start, end in pairs]
    del graph
    return samples


#: 'auto' re-times as a graph when per-call event samples spread more than this (20-80th
#: percentile range over the median)
EVENTS_SPREAD_MAX = 0.2


def time_cuda(fn: Fn, sets: Sequence[InputSet], *, warmup_ms: float = 25.0, target_ms: float = 300.0,
              min_reps: int = 10, max_reps: int = 2000, graph: str = "auto",
              graph_threshold_us: float = 10.0, min_graph_calls: int = 20) -> Timing:
    """Median time per call of ``fn(*s)`` on the current CUDA device, rotating over the
    input sets ``sets`` (see the module docstring for the method).

    Args:
        fn: the op; called as ``fn(*sets[i])``; its result is discarded.
        sets: input sets (tuples), at least one; already on the device.
        warmup_ms: device time spent warming up after the first (compiling) call.
        target_ms: device time the timed repetitions should fill.
        min_reps, max_reps: bounds on the number of samples.
        graph: 'auto' (graph for short or host-bound calls), 'always' or 'never'.
        graph_threshold_us: 'auto' captures a graph for calls shorter than this.
        min_graph_calls: a graph replay holds at least this many calls.
    """
    if not sets:
        raise ValueError("sets is empty; pass at least one input set")
    if graph not in ("auto", "always", "never"):
        raise ValueError(f"graph={graph!r} is not one of 'auto', 'always', 'never'")
    for s in sets:  # first call per set: compilation, autotuning, per-input caches (e.g. repacks)
        fn(*s)
    torch.cuda.synchronize()
    k, spent, idx = 1, 0.0, 0
    est_ms, host_ms = 0.0, 0.0
    while True:
        est_ms, batch_host_ms = _timed_batch(fn, sets, idx, k)
        if k <= 16:  # small batches: the launch queue never fills, so host time is launch time
            host_ms = batch_host_ms
        idx += k
        spent += est_ms * k
        if spent >= warmup_ms or k >= 4096:
            break
        k *= 2
    est_ms = max(est_ms, 1e-6)
    # half: a launch path that costs about what the kernel does times unevenly under events, so such calls get a graph too
    host_bound = host_ms >= 0.5 * est_ms
    use_graph = graph == "always" or (graph == "auto" and (est_ms * 1e3 < graph_threshold_us or host_bound))
    note = ""
    unroll = max(1, math.ceil(min_graph_calls / len(sets)))

    def graph_timing(why: str) -> Timing:
        calls = unroll * len(sets)
        samples = _time_graph(fn, sets, unroll, _clamp(target_ms / (est_ms * calls), min_reps, max_reps))
        med, p20, p80 = quantiles(samples)
        return Timing(med, p20, p80, len(samples), "graph", len(sets), calls, why, host_ms * 1e3)

    if use_graph:
        try:
            return graph_timing("graph='always'" if graph == "always" else "host-bound launches"
                                if host_bound and est_ms * 1e3 >= graph_threshold_us else
                                f"call under {graph_threshold_us:g} us")
        except Exception as exc:  # capture can fail (host syncs, unsupported ops): fall back
            torch.cuda.synchronize()
            note = f"graph capture failed ({type(exc).__name__}: {str(exc).splitlines()[0][:160]}); events used"
            if host_bound:
                note += "; launches are host-bound, so event times include host overhead"
    reps = _clamp(target_ms / est_ms, min_reps, max_reps)
    samples = _time_events(fn, sets, reps)
    med, p20, p80 = quantiles(samples)
    spread = (p80 - p20) / med if med > 0 else 0.0
    if graph == "auto" and not use_graph and spread > EVENTS_SPREAD_MAX:
        # per-call events that scatter this much time the launch path too (a call whose host
        # time nears its device time): a graph replay times the device
        try:
            return graph_timing(f"events spread +-{50 * spread:.0f}%, so a graph")
        except Exception as exc:  # noqa: BLE001 - keep the events result, and say so
            torch.cuda.synchronize()
            note = f"events spread +-{50 * spread:.0f}%; graph capture failed ({type(exc).__name__})"
    return Timing(med, p20, p80, len(samples), "events", len(sets), 1, note, host_ms * 1e3)


def time_cpu(fn: Fn, sets: Sequence[InputSet], *, warmup: int = 1, target_s: float = 2.0,
             min_reps: int = 3, max_reps: int = 200) -> Timing:
    """Median wall-clock time per call of ``fn(*s)`` on the CPU (``time.perf_counter``),
    after ``warmup`` untimed calls, with enough repetitions to fill about ``target_s``."""
    if not sets:
        raise ValueError("sets is empty; pass at least one input set")
    first = None
    for i in range(max(1, warmup)):
        t0 = time.perf_counter()
        fn(*sets[i % len(sets)])
        first = time.perf_counter() - t0
    reps = _clamp(target_s / max(first or 1e-9, 1e-9), min_reps, max_reps)
    samples = []
    for i in range(reps):
        t0 = time.perf_counter()
        fn(*sets[i % len(sets)])
        samples.append((time.perf_counter() - t0) * 1e3)
    med, p20, p80 = quantiles(samples)
    return Timing(med, p20, p80, len(samples), "perf_counter", len(sets), 1, "")
