"""Host time per ``ms.linear`` call on a prepared weight, per route, without a GPU.

The process stands in a Hopper (sm_90, 132 SMs, programmatic launches) for CPU tensors that
report ``is_cuda``, and intercepts every kernel launch (the launcher's cache key is still
computed, nothing runs): what is left is the op's own Python and torch work per call, from the
call to the last launch: the route's choice, the weight's facts, the launch arguments. Call
plans are off (this measures the path a plan would record). Works on this tree's
``microscale.linear`` and on the former ``microscale.qlinear`` (for before / after numbers).

    PYTHONPATH=. python tools/host_time.py [--calls 2000] [--repeats 7]

Prints one line per route: the median over ``repeats`` loops of ``calls`` calls, in µs per call.
"""
from __future__ import annotations

import argparse
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


_LAUNCHED: list = []
_HOPPER = None


def _intercept(fn, grid, *args, **kwargs):
    """A launch that computes what the launcher's cache keys on, and runs nothing."""
    _LAUNCHED.append(fn)
    return (fn, tuple(map(_launch._spec, args)),
            tuple((k, _launch._spec(v) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()))


def _setup_new():
    from microscale.linear import tuning
    from microscale.linear.backends import decode_tma, gemv, gemv_mma, prefill, prefill_ws, splitk
    from microscale.runtime import target

    for md in (decode_tma, gemv, gemv_mma, prefill, prefill_ws, splitk):
        md.launch = _intercept
    prefill_ws.launch_direct = _intercept
    global _HOPPER
    _HOPPER = target.override(capability=(9, 0), num_sms=132, pdl=True, interpreting=False)
    _HOPPER.__enter__()  # (kept referenced: for the whole process)

    def configure(settings: dict):
        tuning.reset()
        tuning.set_tuning(plans=False, **settings)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    data = [(ms.quantize(torch.randn(n, k, generator=g), fmt), torch.randn(m, k, generator=g).to(torch.bfloat16))
            for _, fmt, n, k, m, _ in CASES]
    torch.Tensor.is_cuda = property(lambda self: True)  # CPU tensors stand in for CUDA ones
    torch.cuda.is_current_stream_capturing = lambda: False
    try:
        import microscale.linear.routing  # noqa: F401
        configure, which = _setup_new()
    except ImportError:
        configure, which = _setup_old()
    print(f"{which}: µs per call (median of {a.repeats} x {a.calls} calls), launches intercepted")
    for (route, fmt, n, k, m, settings), (q, x) in zip(CASES, data):
        configure(settings)
        for _ in range(20):  # the weight's facts made, configs cached
            ms.linear(x, q)
        _LAUNCHED.clear()
        ms.linear(x, q)
        kernels = "+".join(getattr(getattr(f, "fn", f), "__name__", "?") for f in _LAUNCHED)
        times = []
        for _ in range(a.repeats):
            t0 = time.perf_counter_ns()
            for _ in range(a.calls):
                ms.linear(x, q)
            times.append((time.perf_counter_ns() - t0) / a.calls / 1e3)
        print(f"{route:12s} {fmt:18s} m={m:<4d} {statistics.median(times):8.2f}   {kernels}")


if __name__ == "__main__":
    main()
