"""Host time per ``ms.linear`` call on a prepared weight, per route, without a GPU.

The process stands in a Hopper (sm_90, 132 SMs, programmatic launches) for CPU tensors that
report ``is_cuda``; launches go through microscale's cached launcher (its key and cache, as on the
GPU), and what is below it is stood in and logged: Triton's compile-and-launch
(``JITFunction.run``, on a launcher miss and on ``launch_direct``) and the compiled kernel's
launcher (``launch.run_recorded``). What is measured is the op's own Python and torch work per
call up to the compiled kernel's launcher: the route's choice, the weight's facts, the launch
arguments, the launcher's key. Call
plans are off (this measures the path a plan would record). Works on this tree's
``microscale.linear`` and on the former ``microscale.qlinear`` (for before / after numbers).

    PYTHONPATH=. python tools/host_time.py [--calls 2000] [--repeats 7]
    PYTHONPATH=. python tools/host_time.py --moe       # ms.moe_experts at one token, plan replay vs the unplanned forward
    PYTHONPATH=. python tools/host_time.py --record launches.json [--compare other.json]

Prints one line per route: the median over ``repeats`` loops of ``calls`` calls, in µs per call.
``--record`` writes, for the cases above and a wider set (formats, token counts from 1 to 256 in
sequences such as 1, 16, 1, fp16 activations, bias, small weights, each call three times), every
intercepted launch: kernel, grid, each argument's spec (tensors: dtype, shape, strides, 16-byte
alignment and which of the call's tensors it is; descriptors: their tensor, box and layout;
everything else by value); ``--compare`` then says whether another record equals it (what a
change of the host path must keep).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)  # the PTX paths, as on the GPU
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import microscale as ms  # noqa: E402
from microscale.runtime import launch as _launch  # noqa: E402

#: (route, format, weight rows, K, tokens, routing settings)
CASES = [
    ("gemv", "nvfp4", 4096, 4096, 1, {"decode_tma": "never"}),
    ("gemv", "mxfp8_e4m3", 4096, 4096, 1, {"decode_tma": "never"}),
    ("gemv_mma", "nvfp4", 4096, 4096, 8, {"decode_tma": "never"}),
    ("decode_tma", "nvfp4", 4096, 4096, 16, {"decode_tma": "always"}),
    ("decode_tma", "int4_affine_g128", 4096, 4096, 16, {"decode_tma": "always"}),
    ("prefill_ws", "nvfp4", 4096, 4096, 256, {"decode_tma": "never"}),
    ("prefill", "nvfp4", 4096, 4096, 256, {"decode_tma": "never", "prefill_ws": False}),
]


#: the wider set of ``--record``: (format, weight rows, K, token-count sequence, routing settings, x dtype, bias)
RECORD_CASES = [
    (fmt, n, k, seq, settings, dt, bias)
    for fmt, n, k in (("nvfp4", 4096, 4096), ("mxfp4", 1024, 2048), ("nvfp4", 512, 2048), ("mxfp8_e4m3", 1024, 2048),
                      ("int4_affine_g128", 1024, 2048), ("int8_affine_g128", 512, 2048), ("int4_fp16", 512, 1024),
                      ("mxint8", 512, 1024))
    for seq in ((1, 16, 1), (2, 3, 4, 5, 8, 9), (17, 32, 33, 64, 65, 256, 1))
    for settings in ({"decode_tma": "never"}, {"decode_tma": "always"}, {"decode_tma": "auto"},
                     {"decode_tma": "never", "prefill_ws": False})
    for dt, bias in ((torch.bfloat16, False), (torch.float16, True))
]

_LAUNCHED: list = []
_RECORD: list | None = None  # while a list: each launch's spec (--record)
_ROLES: dict = {}  # data_ptr -> name of the call's own tensors (--record)
_WORKSPACES: dict = {}  # data_ptr -> every split-K workspace handed out (kept: no other tensor gets its address)
_HOPPER = None


def _arg_spec(v):
    """What ``--record`` keeps of a launch argument (JSON-able). A split-K workspace (partials,
    counters) by its dtype and alignment: a cached route keeps the one of its recording, big enough
    for its call, where the stream's shared one may since have been replaced by a larger one."""
    if isinstance(v, torch.Tensor) and v.data_ptr() in _WORKSPACES:
        return ["WS", str(v.dtype), v.data_ptr() % 16]
    if isinstance(v, torch.Tensor):
        return ["T", str(v.dtype), list(v.shape), list(v.stride()), v.data_ptr() % 16,
                _ROLES.get(v.data_ptr(), "other")]
    if hasattr(v, "block_shape") and hasattr(v, "base"):
        return ["desc", _arg_spec(v.base), list(v.shape), list(v.strides), list(v.block_shape), repr(v.layout),
                str(getattr(v, "padding", None))]
    if isinstance(v, float):
        return ["f", v.hex()]
    if isinstance(v, (bool, int, str)) or v is None:
        return v
    return repr(v)


def _intercept(fn, grid, *args, **kwargs):
    """A launch that computes what the launcher's cache keys on, and runs nothing (``_setup_old``)."""
    _LAUNCHED.append(fn)
    return (fn, tuple(map(_launch._spec, args)),
            tuple((k, _launch._spec(v) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()))


def _name(fn) -> str:
    return getattr(getattr(fn, "fn", fn), "__name__", "?")


class _Compiled:
    """A compiled kernel's stand-in: what the cached launcher keeps of one (and its options, for ``--record``)."""

    packed_metadata = function = None

    def __init__(self, name: str, options: list):
        self.name, self.options = name, options

    def run(self, *a) -> None:
        """The compiled kernel's own launcher (a call plan's replay): logged, run not."""
        _log(self.name, a[:3], a[9:], self.options)


def _log(name: str, grid, vals, options: list) -> None:
    _LAUNCHED.append(name)
    if _RECORD is not None:
        grid = [int(g) for g in grid]
        _RECORD.append([name, grid + [1] * (3 - len(grid)), [_arg_spec(v) for v in vals], options])


def _jit_run(self, *args, grid, warmup, **kwargs):
    """Triton's ``JITFunction.run`` stood in: a launch the cached launcher has not seen (or Triton's
    own path: ``launch_direct``), logged, compiled and run not."""
    names = {p.name for p in self.params}
    options = sorted([k, _arg_spec(v)] for k, v in kwargs.items() if k not in names)
    c = _Compiled(_name(self), options)
    _log(c.name, grid, _launch._values([(p.name, p.default) for p in self.params], args, kwargs), options)
    return c


def _run_recorded(compiled, grid, vals) -> None:
    """The cached launcher's launch of a compiled kernel stood in: logged, run not."""
    _log(compiled.name, grid, vals, compiled.options)


def _setup_new():
    from triton.runtime.jit import JITFunction

    from microscale.linear import tuning
    from microscale.runtime import target

    # the launches go through microscale's cached launcher as on the GPU (its key, its cache, the
    # recorded values); below it, Triton's compile-and-launch and the compiled kernel's launcher log
    JITFunction.run = _jit_run
    _launch.run_recorded = _run_recorded
    from microscale.linear.backends import decode_tma, gemv_mma, prefill, prefill_ws, splitk
    from microscale.runtime.workspace import workspace

    def kept_workspace(*args):
        ws = workspace(*args)
        _WORKSPACES.update((t.data_ptr(), t) for t in ws)
        return ws
    for md in (decode_tma, gemv_mma, prefill, prefill_ws, splitk):
        md.workspace = kept_workspace
    global _HOPPER
    _HOPPER = target.override(capability=(9, 0), num_sms=132, pdl=True, interpreting=False)
    _HOPPER.__enter__()  # (kept referenced: for the whole process)

    def configure(settings: dict):
        tuning.reset()
        tuning.set_tuning(**dict({"plans": False}, **settings))
    return configure, "microscale.linear"


def _setup_old():
    from microscale import qlinear as L

    L.launch = L._launch_direct = _intercept
    L._num_sms = lambda device: 132
    L._pdl_capable = lambda device: True
    L._interpreting = lambda: False
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    modes = {"never": "0", "always": "1", "auto": "auto", "graph": "graph"}

    def configure(settings: dict):
        L._PLANS = False
        L._DECODE_TMA = modes[settings.get("decode_tma", "auto")]
        L._PREFILL_WS = settings.get("prefill_ws", True)
    return configure, "microscale.qlinear"


def _record_weights() -> tuple[list, dict]:
    """The cases of ``--record`` and their weights (quantized before CPU tensors stand in for CUDA ones)."""
    g = torch.Generator().manual_seed(0)
    cases = [(fmt, n, k, (m, m), settings, torch.bfloat16, False) for _, fmt, n, k, m, settings in CASES] + RECORD_CASES
    weights: dict = {}
    for fmt, n, k, *_ in cases:
        if (fmt, n, k) not in weights:
            weights[fmt, n, k] = ms.quantize(torch.randn(n, k, generator=g), fmt)
    return cases, weights


def _record(configure, cases: list, weights: dict, path: str, compare: str | None) -> None:
    """``--record``: every launch of ``cases``, written to ``path``."""
    global _RECORD
    g = torch.Generator().manual_seed(1)
    out: list = []
    routed = [0]
    try:
        from microscale.linear import op

        table_route = op.route

        def counted(*args, **kwargs):
            routed[0] += 1
            return table_route(*args, **kwargs)
        op.route = counted
    except ImportError:  # (the former qlinear)
        pass
    for fmt, n, k, seq, settings, dt, has_bias in cases:
        q = weights[fmt, n, k]
        q.__dict__.pop("_ms_linear_state", None)  # every case starts from a weight not used yet
        configure(settings)
        bias = torch.randn(n, generator=g).to(dt) if has_bias else None
        calls = []
        for m in seq:
            x = torch.randn(m, k, generator=g).to(dt)
            _ROLES.clear()
            _ROLES.update({x.data_ptr(): "x", q.data.data_ptr(): "q.data", q.scales.data_ptr(): "q.scales"})
            if bias is not None:
                _ROLES[bias.data_ptr()] = "bias"
            for _ in range(3):
                _RECORD = []
                y = ms.linear(x, q, bias)
                calls.append([m, list(y.shape), str(y.dtype), _RECORD])
                _RECORD = None
        out.append([fmt, n, k, list(seq), settings, str(dt), has_bias, calls])
    with open(path, "w") as fh:
        json.dump(out, fh)
    launches = sum(len(c[3]) for case in out for c in case[7])
    ncalls = sum(len(case[7]) for case in out)
    print(f"recorded {len(out)} cases, {ncalls} calls ({ncalls - routed[0]} by a cached route), {launches} launches "
          f"-> {path}")
    if compare:
        with open(compare) as fh:
            other = json.load(fh)
        same = json.loads(json.dumps(out)) == other
        print(f"identical to {compare}: {same}")
        if not same:
            for a, b in zip(json.loads(json.dumps(out)), other):
                if a != b:
                    print("first difference in case", a[:7])
                    for ca, cb in zip(a[7], b[7]):
                        if ca != cb:
                            print(" now:   ", ca)
                            print(" before:", cb)
                            break
                    break
            sys.exit(1)


def stand_in(uncached: bool = False):
    """Stand in the Hopper and Triton below the cached launcher for the rest of the process (CPU
    tensors report ``is_cuda``: make weights first). Returns ``(configure(settings), which)``;
    ``uncached``: ``tuning.route_cache`` off (every call routed through the table)."""
    torch.Tensor.is_cuda = property(lambda self: True)  # CPU tensors stand in for CUDA ones
    torch.cuda.is_current_stream_capturing = lambda: False
    _launch.current_stream = lambda: 0
    try:
        import microscale.linear.routing  # noqa: F401
        configure, which = _setup_new()
    except ImportError:
        return _setup_old()
    if not uncached:
        return configure, which

    def configure_uncached(settings: dict):
        configure(dict(settings, route_cache=False))
    return configure_uncached, which + " (route_cache off)"


def _moe(g: torch.Generator, calls: int, repeats: int) -> None:
    """``--moe``: one token through gpt-oss-20b's experts (32 x [5760, 2880] and [2880, 2880], MXFP4, top-4): the
    composed CUDA forward unplanned (``moe.op._experts_forward``: routing, two GEMMs, slot sum) and the whole
    ``ms.moe_experts`` call replaying its call plan."""
    from microscale.moe import op, prepare_experts

    e, h, i = 32, 2880, 2880
    gu = ms.quantize(torch.randn(e, 2 * i, h, generator=g), "mxfp4")
    dn = ms.quantize(torch.randn(e, h, i, generator=g), "mxfp4")
    x = torch.randn(1, h, generator=g).bfloat16()
    idx = torch.randperm(e, generator=g)[:4].view(1, 4)
    tw = torch.softmax(torch.randn(1, 4, generator=g), -1)
    pgu, pdn = prepare_experts(gu), prepare_experts(dn)
    configure, which = stand_in()
    cases = [("unplanned forward", {"plans": False},
              lambda: op._experts_forward(x, pgu, pdn, idx, tw, None, None, "swiglu_clamped", 1.702, 7.0, "interleaved")),
             ("moe_experts, plan", {"plans": True},
              lambda: ms.moe_experts(x, gu, dn, idx, tw, activation="swiglu_clamped", layout="interleaved"))]
    print(f"{which}: µs per call (median of {repeats} x {calls} calls), Triton stood in below the cached launcher")
    for label, settings, call in cases:
        configure(settings)
        # (a plan: the first call marks the key, the second records it, the third replays)
        for _ in range(3):
            call()
        _LAUNCHED.clear()
        call()
        kernels = "+".join(f if isinstance(f, str) else _name(f) for f in _LAUNCHED)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                call()
            times.append((time.perf_counter_ns() - t0) / calls / 1e3)
        print(f"{label:20s} {statistics.median(times):8.2f}   {kernels}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--record", help="write every launch of the cases to this JSON file, time nothing")
    ap.add_argument("--compare", help="with --record: a former record to compare with")
    ap.add_argument("--uncached", action="store_true", help="tuning.route_cache off (each call takes the table)")
    ap.add_argument("--moe", action="store_true", help="time ms.moe_experts instead (one token, gpt-oss-20b experts)")
    a = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    if a.moe:
        return _moe(g, a.calls, a.repeats)
    if a.record:
        rec_cases, weights = _record_weights()
    else:
        data = [(ms.quantize(torch.randn(n, k, generator=g), fmt), torch.randn(m, k, generator=g).to(torch.bfloat16))
                for _, fmt, n, k, m, _ in CASES]
    configure, which = stand_in(uncached=a.uncached)
    if a.record:
        return _record(configure, rec_cases, weights, a.record, a.compare)
    print(f"{which}: µs per call (median of {a.repeats} x {a.calls} calls), Triton stood in below the cached launcher")
    for (route, fmt, n, k, m, settings), (q, x) in zip(CASES, data):
        configure(settings)
        for _ in range(20):  # the weight's facts made, configs cached
            ms.linear(x, q)
        _LAUNCHED.clear()
        ms.linear(x, q)
        kernels = "+".join(f if isinstance(f, str) else _name(f) for f in _LAUNCHED)
        times = []
        for _ in range(a.repeats):
            t0 = time.perf_counter_ns()
            for _ in range(a.calls):
                ms.linear(x, q)
            times.append((time.perf_counter_ns() - t0) / a.calls / 1e3)
        print(f"{route:12s} {fmt:18s} m={m:<4d} {statistics.median(times):8.2f}   {kernels}")


if __name__ == "__main__":
    main()
