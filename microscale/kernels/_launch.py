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

import torch
from triton import knobs
from triton.runtime import driver

#: ``MICROSCALE_FAST_LAUNCH=0`` (read at import) always takes Triton's own path (A/B runs)
_FAST = os.environ.get("MICROSCALE_FAST_LAUNCH", "1") == "1"
_CACHE: dict = {}
_PARAMS: dict = {}


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


def _hooked() -> bool:
    """Whether a launch hook (profilers, proton) wants launch metadata."""
    for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if h is not None and getattr(h, "calls", True):
            return True
    return False


def launch(fn, grid: tuple, *args, **kwargs) -> None:
    """``fn[grid](*args, **kwargs)``: positional arguments are the kernel's leading
    parameters, keyword arguments the rest (constexprs, keyed by value; tensors) and
    launch options (``num_warps``, ``num_stages``, ``launch_pdl``...)."""
    if not _FAST or os.environ.get("TRITON_INTERPRET", "0") == "1" or _hooked():
        fn[grid](*args, **kwargs)
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
        return
    compiled, params = hit
    vals = list(args)
    for name, default in params[len(args):]:
        vals.append(kwargs.get(name, default))
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    drv = driver.active  # the stream Triton's own launch would use
    stream = drv.get_current_stream(drv.get_current_device())
    compiled.run(grid[0], g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None, *vals)
