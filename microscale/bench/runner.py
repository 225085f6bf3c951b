"""The runner: checks each op's output against the reference before timing it, times it
with :mod:`microscale.bench._timing`, then times its peers the same way; measures the
ceilings in the same run; :func:`run_benchmark` is the whole run as a JSON-able document.
"""
from __future__ import annotations

import gc
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Optional, Sequence, TextIO

import torch

from . import _clocks, _peers, _timing, models
from ._peers import Skip
from .cases import BUILDERS, PEERS, Case, Context, Peer, random_input
from .checks import Check, check_bits, check_matmul
from .report import bf16_mbps, collect_env, fmt_time
from .suites import DTYPES, CaseSpec, _as_list, select_cases, suite_graph

__all__ = ["PeerResult", "CaseResult", "RunOptions", "run_case", "run_cases", "measure_ceilings", "run_benchmark",
           "methodology"]

# ---- results --------------------------------------------------------------------------

@dataclass
class PeerResult:
    """A peer's outcome: status 'ok' | 'skipped' | 'failed' | 'error'; ``ratio`` is
    peer time / op time (above 1: microscale is faster)."""

    name: str
    status: str
    reason: str = ""
    timing: Optional[dict] = None
    nbytes: Optional[int] = None
    gbps: Optional[float] = None
    tflops: Optional[float] = None
    ratio: Optional[float] = None
    check: Optional[dict] = None
    #: wall seconds of the peer's phases: ``build``, ``inputs``, ``check`` (first call and check), ``time``
    phases: Optional[dict] = None


@dataclass
class CaseResult:
    """A case's outcome: status 'ok' | 'skipped' | 'failed' (check) | 'error' (raised)."""

    op: str
    format: str
    shape: list[int]
    status: str
    reason: str = ""
    nbytes: Optional[int] = None
    flops: Optional[int] = None
    compute_kind: Optional[str] = None
    timing: Optional[dict] = None
    throughput: Optional[dict] = None
    check: Optional[dict] = None
    peers: list[PeerResult] = field(default_factory=list)
    #: wall seconds of the case's phases (``build``, ``inputs``, ``check``, ``time``, ``peers``): where a slow
    #: suite spends its time
    phases: Optional[dict] = None

    @property
    def id(self) -> str:
        """``op/format/shape`` as in :attr:`CaseSpec.id`."""
        return CaseSpec(self.op, self.format, tuple(self.shape)).id

    def to_dict(self) -> dict:
        """JSON-able form."""
        return asdict(self)


@dataclass
class RunOptions:
    """Knobs of :func:`run_cases` (defaults are the methodology's)."""

    warmup_ms: float = 25.0
    target_ms: float = 300.0
    graph: str = "auto"
    rotate_factor: float = 3.0
    max_rotation_bytes: int = 8 << 30
    cpu_target_s: float = 1.0
    time_budget_s: Optional[float] = None


def _log(stream: Optional[TextIO], msg: str) -> None:
    if stream is not None:
        print(msg, file=stream, flush=True)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _n_sets(set_bytes: int, ctx: Context, opts: RunOptions) -> int:
    if ctx.cpu:
        return 1
    return _timing.rotation_count(max(1, set_bytes), _timing.l2_cache_bytes(ctx.device),
                                  factor=opts.rotate_factor, max_total_bytes=opts.max_rotation_bytes)


def _time(fn: Callable[..., Any], sets: list[tuple], ctx: Context, opts: RunOptions,
          monitor: Optional[_clocks.Monitor] = None) -> _timing.Timing:
    if ctx.cpu:
        return _timing.time_cpu(fn, sets, target_s=opts.cpu_target_s)
    if monitor is not None:
        monitor.settle()  # not under a power cap that the previous timing brought on
    t0 = time.time()
    t = _timing.time_cuda(fn, sets, warmup_ms=opts.warmup_ms, target_ms=opts.target_ms, graph=opts.graph)
    state = monitor.window(t0, time.time()) if monitor is not None else None
    return replace(t, clocks=state.to_dict()) if state is not None else t


#: a case whose phases take longer than this many seconds logs them (results.json keeps them for every case)
_SLOW_CASE_S = 10.0


class _Phases:
    """Wall seconds between marks, added up per phase name (the device synchronized at each mark, so a phase
    holds its own GPU work); ``done`` is the dict the result keeps."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.done: dict = {}
        self.t = time.perf_counter()

    def mark(self, name: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.done[name] = round(self.done.get(name, 0.0) + now - self.t, 3)
        self.t = now


def _run_peer(name: str, build: Callable[[], Peer], case: Case, sets: list[tuple], op_ms: float,
              ctx: Context, opts: RunOptions, monitor: Optional[_clocks.Monitor] = None) -> PeerResult:
    ph = _Phases(ctx.device)
    try:
        peer = build()
    except Skip as s:
        return PeerResult(name, "skipped", str(s))
    except Exception as exc:
        return PeerResult(name, "skipped", f"could not build: {_short(exc)}")
    try:
        ph.mark("build")
        pbytes = peer.nbytes if peer.nbytes is not None else case.nbytes
        if peer.make_inputs is None:
            psets = sets
        else:
            first = peer.make_inputs()
            n = _n_sets(peer.set_bytes or case.set_bytes, ctx, opts)
            psets = [first] + [peer.make_inputs() for _ in range(n - 1)]
        ph.mark("inputs")
        out = peer.fn(*psets[0])
        chk = peer.check(psets[0], out)
        del out
        ph.mark("check")
        if not chk.ok:
            return PeerResult(name, "failed", f"check failed: {chk.detail}", check=asdict(chk), phases=ph.done)
        t = _time(peer.fn, psets, ctx, opts, monitor)
        ph.mark("time")
        gb = models.gbps(pbytes, t.median_ms)
        tf = models.tflops(case.flops, t.median_ms) if case.flops else None
        return PeerResult(name, "ok", t.note, timing=t.to_dict(), nbytes=pbytes, gbps=gb, tflops=tf,
                          ratio=t.median_ms / op_ms, check=asdict(chk), phases=ph.done)
    except Skip as s:
        return PeerResult(name, "skipped", str(s))
    except NotImplementedError as exc:
        return PeerResult(name, "skipped", f"not implemented: {_short(exc)}")
    except Exception as exc:
        return PeerResult(name, "error", _short(exc))
    finally:
        _free(ctx.device)


def run_case(spec: CaseSpec, ctx: Context, ceilings: models.Ceilings, opts: RunOptions,
             builders: Optional[dict[str, Callable[[CaseSpec, Context], Case]]] = None,
             monitor: Optional[_clocks.Monitor] = None) -> CaseResult:
    """Build, check, time and compare one case. Never raises for the op's own failures:
    they come back as status 'skipped', 'failed' or 'error' with a reason. ``monitor``:
    where given and sampling, each timing records the GPU's clocks (``timing['clocks']``)."""
    builders = BUILDERS if builders is None else builders
    base = dict(op=spec.op, format=spec.format, shape=list(spec.shape))
    ph = _Phases(ctx.device)
    if spec.op not in builders:
        return CaseResult(**base, status="skipped", reason=f"no builder for op {spec.op!r}")
    try:
        case = builders[spec.op](spec, ctx)
    except Skip as s:
        return CaseResult(**base, status="skipped", reason=str(s))
    except NotImplementedError as exc:
        _free(ctx.device)
        return CaseResult(**base, status="skipped", reason=f"not implemented: {_short(exc)}")
    except Exception as exc:
        _free(ctx.device)
        return CaseResult(**base, status="error", reason=f"build: {_short(exc)}")
    res = CaseResult(**base, status="error", nbytes=case.nbytes, flops=case.flops, compute_kind=case.compute_kind,
                     phases=ph.done)
    try:
        ph.mark("build")  # (inside: it synchronizes, so an asynchronous error of the build surfaces here)
        sets = [case.make_inputs()]
        ph.mark("inputs")
        out = case.fn(*sets[0])
        chk = case.check(sets[0], out)
        del out
        ph.mark("check")
        res.check = asdict(chk)
        if not chk.ok:
            res.status, res.reason = "failed", f"check failed: {chk.detail}"
            return res
        n = _n_sets(case.set_bytes, ctx, opts)
        sets += [case.make_inputs() for _ in range(n - 1)]
        ph.mark("inputs")
        t = _time(case.fn, sets, ctx, opts, monitor)
        ph.mark("time")
        res.timing = t.to_dict()
        res.throughput = asdict(models.throughput(case.nbytes, case.flops, t.median_ms, ceilings,
                                                  case.compute_kind))
        res.status, res.reason = "ok", t.note
        for name, build in case.peers:
            pr = _run_peer(name, build, case, sets, t.median_ms, ctx, opts, monitor)
            res.peers.append(pr)
        ph.mark("peers")
    except Skip as s:
        res.status, res.reason = "skipped", str(s)
    except NotImplementedError as exc:
        res.status, res.reason = "skipped", f"not implemented: {_short(exc)}"
    except Exception as exc:
        res.status, res.reason = "error", _short(exc)
    finally:
        sets = None
        _free(ctx.device)
    return res


def _describe(r: CaseResult) -> str:
    if r.status != "ok":
        return f"{r.status}: {r.reason}"
    t, th = r.timing or {}, r.throughput or {}
    parts = [f"{fmt_time(t['median_ms'])} [{t['method']}]", f"{th['gbps']:.4g} GB/s"]
    mbps = bf16_mbps(r.to_dict())
    if t.get("method") == "perf_counter" and mbps is not None:
        parts.append(f"{mbps:.0f} MB/s of bf16")
    if r.flops:
        parts.append(f"{th['tflops']:.4g} TFLOP/s")
    if th.get("pct_roofline") is not None:
        parts.append(f"{th['pct_roofline']:.0f}% of roofline")
    if t.get("clocks"):
        parts.append(_clocks.ClockState.from_dict(t["clocks"]).summary())
    for p in r.peers:
        parts.append(f"{p.name} {p.ratio:.2f}x" if p.status == "ok" else f"{p.name} {p.status}")
    return ", ".join(parts)


def run_cases(specs: Sequence[CaseSpec], ctx: Context, ceilings: models.Ceilings,
              opts: Optional[RunOptions] = None,
              builders: Optional[dict[str, Callable[[CaseSpec, Context], Case]]] = None,
              log: Optional[TextIO] = sys.stderr,
              on_result: Optional[Callable[[CaseResult], None]] = None) -> list[CaseResult]:
    """Run ``specs`` in order, printing progress to ``log`` and passing each result to
    ``on_result`` as it comes (so a killed run leaves its partial results); cases that
    would start after ``opts.time_budget_s`` seconds are reported as skipped (the first
    always runs). On a CUDA device with ``nvidia-smi``, the GPU's clocks are sampled
    throughout and each timing records them (:mod:`microscale.bench._clocks`)."""
    opts = opts or RunOptions()
    t0 = time.monotonic()
    out: list[CaseResult] = []
    with _clocks.Monitor(ctx.device) as monitor:  # inert on CPU or without nvidia-smi
        for i, spec in enumerate(specs, 1):
            if i > 1 and opts.time_budget_s is not None and time.monotonic() - t0 > opts.time_budget_s:
                r = CaseResult(spec.op, spec.format, list(spec.shape), "skipped",
                               f"time budget of {opts.time_budget_s:g} s spent")
            else:
                _log(log, f"[{i:>3}/{len(specs)}] {spec.id} ...")
                r = run_case(spec, ctx, ceilings, opts, builders, monitor)
                _log(log, f"          {_describe(r)}")
                if r.phases and sum(r.phases.values()) > _SLOW_CASE_S:
                    _log(log, "          wall: " + ", ".join(f"{k} {v:.1f} s" for k, v in r.phases.items()))
            out.append(r)
            if on_result is not None:
                on_result(r)
    return out


# ---- ceilings -------------------------------------------------------------------------

def _ceiling(fn: Callable[..., Any], sets: list[tuple], check: Callable[[Any], Check],
             ctx: Context, opts: RunOptions) -> tuple[Optional[float], dict]:
    """Check, then time, one ceiling; returns (median ms or None, detail). Never under
    ``graph='always'``: a captured copy becomes a memcpy node that the copy engines may serve,
    well below the SMs' copy bandwidth."""
    out = fn(*sets[0])
    chk = check(out)
    del out
    if not chk.ok:
        return None, {"status": "failed", "reason": f"check failed: {chk.detail}", "check": asdict(chk)}
    t = _time(fn, sets, ctx, replace(opts, graph="auto") if opts.graph == "always" else opts)
    return t.median_ms, {"status": "ok", "timing": t.to_dict(), "check": asdict(chk)}


_MM_SIZE = 8192  # square matmul of the compute ceilings
_MM_CHECK_ROWS = 64  # rows checked in float64: the full product costs more than it tells


def _copy_ceiling(ctx: Context, opts: RunOptions) -> tuple[Optional[float], dict]:
    nbytes = (256 << 20) if ctx.cpu else (1 << 30)
    src = random_input((nbytes // 4,), ctx, torch.float32)
    dst = torch.empty_like(src)
    ms_, d = _ceiling(lambda a, b: b.copy_(a), [(src, dst)], lambda y: check_bits(y, src), ctx, opts)
    d.update(bytes=models.copy_bytes(nbytes), what=f"copy of {nbytes >> 20} MiB, bytes read + written")
    return (models.gbps(models.copy_bytes(nbytes), ms_) if ms_ else None), d


def _bf16_ceiling(ctx: Context, opts: RunOptions) -> tuple[Optional[float], dict]:
    n, rows = _MM_SIZE, _MM_CHECK_ROWS
    a, b = random_input((n, n), ctx), random_input((n, n), ctx)
    ms_, d = _ceiling(torch.mm, [(a, b)], lambda y: check_matmul(a[:rows], b.T, y[:rows]), ctx, opts)
    flops = models.linear_flops(n, n, n)
    d.update(flops=flops, what=f"cuBLAS bf16 torch.mm {n}x{n}x{n}, random data")
    return (models.tflops(flops, ms_) if ms_ else None), d


def _fp8_ceiling(ctx: Context, opts: RunOptions) -> tuple[Optional[float], dict]:
    if not hasattr(torch, "_scaled_mm"):
        raise Skip("torch has no _scaled_mm")
    n, rows = _MM_SIZE, _MM_CHECK_ROWS
    a8 = random_input((n, n), ctx, torch.float32).clamp(-448, 448).to(torch.float8_e4m3fn)
    w8 = random_input((n, n), ctx, torch.float32).clamp(-448, 448).to(torch.float8_e4m3fn)
    one = torch.ones((), dtype=torch.float32, device=ctx.device)

    def fp8_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    ms_, d = _ceiling(fp8_mm, [(a8, w8)], lambda y: check_matmul(a8[:rows].float(), w8.float(), y[:rows]),
                      ctx, opts)
    flops = models.linear_flops(n, n, n)
    d.update(flops=flops, what=f"torch._scaled_mm e4m3 x e4m3 -> bf16, tensor scales, {n}x{n}x{n}, random data")
    return (models.tflops(flops, ms_) if ms_ else None), d


def measure_ceilings(ctx: Context, opts: Optional[RunOptions] = None,
                     log: Optional[TextIO] = sys.stderr) -> tuple[models.Ceilings, dict]:
    """Measure the ceilings in this run: copy bandwidth (bytes read + written) of a
    1 GiB device-to-device copy (256 MiB on the CPU); on CUDA also the cuBLAS bf16 and
    ``torch._scaled_mm`` fp8 rates of an 8192^3 product on random data. Each is checked
    before it is timed. Returns the ceilings and per-ceiling details (sizes, timing,
    or the reason one could not be measured)."""
    opts = opts or RunOptions()
    details: dict[str, dict] = {}
    values: dict[str, Optional[float]] = {}
    plan = [("copy_gbps", "copy", _copy_ceiling), ("bf16_tflops", "bf16_mm", _bf16_ceiling),
            ("fp8_tflops", "fp8_mm", _fp8_ceiling)]
    for key, kind, measure in plan:
        values[key] = None
        if ctx.cpu and kind != "copy":
            details[kind] = {"status": "skipped", "reason": "not measured on the CPU"}
            continue
        try:
            values[key], details[kind] = measure(ctx, opts)
        except Skip as s:
            details[kind] = {"status": "skipped", "reason": str(s)}
        except Exception as exc:
            details[kind] = {"status": "error", "reason": _short(exc)}
        _free(ctx.device)
    _log(log, "ceilings: " + ", ".join(
        f"{key}={values[key]:.1f}" if values[key] is not None else f"{key}=n/a ({details[kind].get('reason', '')})"
        for key, kind, _ in plan))
    return models.Ceilings(**values), details


# ---- the whole run --------------------------------------------------------------------

def run_benchmark(suite: str = "default", *, ops: Optional[Iterable[str] | str] = None,
                  formats: Optional[Iterable[str] | str] = None,
                  shapes: Optional[Iterable[str | Sequence[int]] | str] = None,
                  cpu: bool = False, seed: Optional[int] = None, opts: Optional[RunOptions] = None,
                  log: Optional[TextIO] = sys.stderr,
                  checkpoint: Optional[Callable[[dict], None]] = None, dtype: str = "bf16") -> dict:
    """Select, measure ceilings, run the cases; returns the JSON-able result document
    (``schema``, ``mode``, ``suite``, ``selection``, ``env``, ``seed``, ``wall_s``,
    ``ceilings``, ``ceilings_detail``, ``methodology``, ``results``). ``checkpoint`` is
    called with the document so far after the ceilings and after every case. Without
    ``opts``, the suite's own graph mode (:attr:`Suite.graph`) applies. ``dtype``: the linear
    cases' activations and their cuBLAS peer, ``"bf16"`` or ``"fp16"``."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    specs = select_cases(suite, ops=ops, formats=formats, shapes=shapes, cpu=cpu)
    _peers.quiet_compiler()
    if not cpu and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device is visible; pass --cpu to time the reference path on the CPU")
    device = torch.device("cpu") if cpu else torch.device("cuda", torch.cuda.current_device())
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else int(seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    ctx = Context(device, gen, DTYPES[dtype])
    opts = opts or RunOptions(graph=suite_graph(suite))
    _log(log, f"microscale.bench: suite={suite} mode={'cpu' if cpu else 'cuda'} cases={len(specs)} seed={seed}")
    started = time.time()
    ceilings, cdetail = measure_ceilings(ctx, opts, log)
    doc: dict = {
        "schema": 1,
        "mode": "cpu" if cpu else "cuda",
        "suite": suite,
        "selection": {"ops": _as_list(ops), "formats": _as_list(formats), "dtype": dtype,
                      "shapes": None if shapes is None else [str(s) for s in (
                          [shapes] if isinstance(shapes, str) else shapes)]},
        "env": collect_env(device),
        "seed": seed,
        "wall_s": 0.0,
        "complete": False,
        "ceilings": ceilings.to_dict(),
        "ceilings_detail": cdetail,
        "methodology": _with_dtype(methodology(opts, cpu), dtype),
        "results": [],
    }

    def add(r: CaseResult) -> None:
        doc["results"].append(r.to_dict())
        doc["wall_s"] = round(time.time() - started, 1)
        if checkpoint is not None:
            checkpoint(doc)

    if checkpoint is not None:
        checkpoint(doc)
    run_cases(specs, ctx, ceilings, opts, log=log, on_result=add)
    doc["complete"] = True
    doc["wall_s"] = round(time.time() - started, 1)
    return doc


def _with_dtype(method: dict, dtype: str) -> dict:
    """``method`` with the linear cases' activation dtype, and only the cuBLAS peer of that dtype."""
    peers = {k: v for k, v in method["peers"].items() if not k.startswith("cuBLAS ") or k == f"cuBLAS {dtype}"}
    return {**method, "activations": f"{dtype} (linear: x and its cuBLAS peer; % roofline against the cuBLAS "
            "bf16 ceiling, which Hopper's fp16 tensor cores share)", "peers": peers,
            **({"data": method["data"] + "; fp16 activations (both ops) times 2^-4, so outputs stay finite"}
               if dtype == "fp16" and "data" in method else {})}


#: how each ``RunOptions.graph`` mode times a CUDA call, for the methodology record
_GRAPH_MODES = {
    "auto": "auto (CUDA graph for calls < 10 us, host-bound launches, or per-call event times scattering "
            f"over {_timing.EVENTS_SPREAD_MAX:.0%} of the median)",
    "always": "always (every call, ours and the peers', as CUDA graph replays of back-to-back calls; events "
              "where a capture fails)",
    "never": "never (a CUDA event pair per call)",
}


def methodology(opts: RunOptions, cpu: bool) -> dict:
    """The timing method of a run, as recorded in its JSON and RESULTS.md."""
    if cpu:
        return {"timer": "time.perf_counter median", "target_s_per_case": opts.cpu_target_s,
                "rotation": "none (1 input set)", "check": "output vs microscale.reference before timing",
                "peers": PEERS}
    return {"timer": "CUDA events, median per call", "warmup_ms": opts.warmup_ms,
            "target_ms_per_case": opts.target_ms, "graph": _GRAPH_MODES[opts.graph],
            "rotation": f"input sets > {opts.rotate_factor:g} x L2 "
            f"(at most {opts.max_rotation_bytes >> 30} GiB)", "data": "fresh random normal, per-row 2^k scales",
            "check": "output vs microscale.reference (bit-exact) or float64 (matmul, rel Frobenius < 1e-2) "
            "before timing", "clocks": "SM clock, power and slowdown reasons sampled by nvidia-smi every "
            f"{_clocks.SAMPLE_MS} ms while each timing runs (where nvidia-smi is present); each timing starts "
            f"once a fresh sample shows no slowdown (at most {_clocks.SETTLE_MAX_S:g} s: the power cap "
            "outlasts the load that reached it)",
            "time_budget_s": opts.time_budget_s, "peers": PEERS}
