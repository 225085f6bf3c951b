"""Launch Triton kernels with less host time than ``kernel[grid](...)`` (private).

``JITFunction.run`` binds and specializes every argument, builds a cache key from all of
them (our PTX constexprs are kilobytes of text) and assembles launch metadata on every
call: on the H200 machine's host ~100 µs for one of our launches, longer than the kernel
itself at decode sizes (``benchmarks/NOTES_linear.md``). :func:`launch` keys a cache of
compiled kernels on exactly what Triton specializes on (tensor dtype and 16-byte
alignment; integers' ``== 1``, divisibility by 16 and width; every other argument by
value), takes Triton's own path on a miss, and on a hit calls the compiled kernel's
launcher directly. It falls back to Triton's path whenever a launch hook is installed
(profilers) and under the interpreter. A hit skips Triton's check that module globals a
kernel read at compile time are unchanged: microscale's kernels read only constants.
"""
from __future__ import annotations

import functools
import os
import threading

import torch
from triton import knobs
from triton.runtime import driver

#: ``MICROSCALE_FAST_LAUNCH=0`` (read at import) always takes Triton's own path (A/B runs)
_FAST = os.environ.get("MICROSCALE_FAST_LAUNCH", "1") == "1"
_CACHE: dict = {}
_PARAMS: dict = {}
_TLS = threading.local()


def record(into: list | None) -> None:
    """While ``into`` is a list, this thread's launches append ``(compiled kernel, grid,
    argument values)`` to it, or None for one that took Triton's own path (the call plans of
    :func:`microscale.qlinear.linear`); None stops recording."""
    _TLS.record = into


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for host ints (``triton.cdiv`` is a constexpr function: a few µs per
    host call, several per launch)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``n`` (1 for ``n <= 1``), as ``triton.next_power_of_2``."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@functools.lru_cache(maxsize=64)
def pdl_capable(device: torch.device) -> bool:
    """Programmatic dependent launch (``griddepcontrol``) on ``device``: an NVIDIA GPU of
    compute capability 9.0 or newer (not ROCm, whose capability numbers overlap)."""
    return (device.type == "cuda" and torch.version.hip is None
            and torch.cuda.get_device_capability(device) >= (9, 0))


def _spec(a):
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0, a.device.index)
    if isinstance(a, bool):
        return ("b", a)
    if isinstance(a, int):
        return ("i", a == 1, a % 16 == 0, -(1 << 31) <= a < (1 << 31), a >= (1 << 63))
    if isinstance(a, float):
        return "f"
    if hasattr(a, "block_shape") and hasattr(a, "layout"):  # a TMA tensor descriptor: what its type holds
        return ("desc", a.base.dtype, tuple(a.block_shape), a.layout, a.padding)
    return a  # constexprs and None: by value (must be hashable)


def hooked() -> bool:
    """Whether a launch hook (profilers, proton) wants launch metadata."""
    for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if h is not None and getattr(h, "calls", True):
            return True
    return False


def launch(fn, grid: tuple, *args, **kwargs) -> None:
    """``fn[grid](*args, **kwargs)``: positional arguments are the kernel's leading
    parameters, keyword arguments the rest (constexprs, keyed by value; tensors) and
    launch options (``num_warps``, ``num_stages``, ``launch_pdl``...)."""
    if not _FAST or os.environ.get("TRITON_INTERPRET", "0") == "1" or hooked():
        fn[grid](*args, **kwargs)
        rec = getattr(_TLS, "record", None)
        if rec is not None:
            rec.append(None)
        return
    # keyword arguments are constexprs / options (by value) or, rarely, tensors
    key = (fn, tuple(map(_spec, args)),
           tuple((k, _spec(v) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()))
    hit = _CACHE.get(key)
    if hit is None:
        compiled = fn[grid](*args, **kwargs)
        if compiled is not None and hasattr(compiled, "packed_metadata"):  # a compiled kernel, not a future
            params = _PARAMS.get(fn)
            if params is None:
                params = _PARAMS[fn] = [(p.name, p.default) for p in fn.params]
            _CACHE[key] = (compiled, params)
        rec = getattr(_TLS, "record", None)
        if rec is not None:
            rec.append((compiled, grid, _values(params, args, kwargs)) if key in _CACHE else None)
        return
    compiled, params = hit
    vals = _values(params, args, kwargs)
    run_recorded(compiled, grid, vals)
    rec = getattr(_TLS, "record", None)
    if rec is not None:
        rec.append((compiled, grid, vals))


def _values(params: list, args: tuple, kwargs: dict) -> list:
    """The launcher's argument list: ``args``, then every other parameter from ``kwargs`` or
    its default."""
    vals = list(args)
    for name, default in params[len(args):]:
        vals.append(kwargs.get(name, default))
    return vals


def current_stream() -> int:
    """The stream Triton's own launch would use: the current device's current stream."""
    drv = driver.active
    return drv.get_current_stream(drv.get_current_device())


def run_recorded(compiled, grid: tuple, vals) -> None:
    """Launch ``compiled`` with launcher values as :func:`record` keeps them, on
    :func:`current_stream`."""
    stream = current_stream()
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                 compiled.function, compiled.packed_metadata, None, None, None, *vals)
