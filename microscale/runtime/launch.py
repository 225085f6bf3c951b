"""Launch Triton kernels with less host time than ``kernel[grid](...)`` (private).

``JITFunction.run`` binds and specializes every argument, builds a cache key from all of
them (our PTX constexprs are kilobytes of text) and assembles launch metadata on every
call: on the H200 machine's host ~100 µs for one of our launches, longer than the kernel
itself at decode sizes (docs/decisions/linear-host-time.md). :func:`launch` keys a cache of
compiled kernels on exactly what Triton specializes on (tensor dtype and 16-byte
alignment; integers' ``== 1``, divisibility by 16 and width; every other argument by
value), takes Triton's own path on a miss, and on a hit calls the compiled kernel's
launcher directly. It falls back to Triton's path whenever a launch hook is installed
(profilers), under the interpreter, and on Triton releases outside
:data:`microscale.runtime.target.SUPPORTED_TRITON` (its launcher internals are version
specific). A hit skips Triton's check that module globals a kernel read at compile time
are unchanged: microscale's kernels read only constants. Importing this module does not
need Triton; launching does.
"""
from __future__ import annotations

import threading

import torch

from . import target

try:
    from triton import knobs
    from triton.runtime import driver
except ImportError:  # the CPU paths never launch
    knobs = driver = None

#: the cached fast path (False: always Triton's own path, for A/B runs); taken only on the Triton
#: releases it was written for (:func:`microscale.runtime.target.triton_supported`)
_FAST = True
#: :func:`bind` encodes host TMA descriptors once (False: the compiled kernel's own launcher, which
#: encodes them at every launch)
_BIND = True
_CACHE: dict = {}
_PARAMS: dict = {}
_TLS = threading.local()


def record(into: list | None) -> None:
    """While ``into`` is a list, this thread's launches append ``(compiled kernel, grid,
    argument values)`` to it, or None for one that took Triton's own path (the call plans of
    ``microscale.linear``); None stops recording."""
    _TLS.record = into


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for host ints (``triton.cdiv`` is a constexpr function: a few µs per
    host call, several per launch)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``n`` (1 for ``n <= 1``), as ``triton.next_power_of_2``."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


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
    if knobs is None:
        return False
    for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if h is not None and getattr(h, "calls", True):
            return True
    return False


def launch(fn, grid: tuple, *args, **kwargs) -> None:
    """``fn[grid](*args, **kwargs)``: positional arguments are the kernel's leading
    parameters, keyword arguments the rest (constexprs, keyed by value; tensors) and
    launch options (``num_warps``, ``num_stages``, ``launch_pdl``...)."""
    if not _FAST or not target.triton_supported() or target.interpreting() or hooked():
        fn[grid](*args, **kwargs)
        rec = getattr(_TLS, "record", None)
        if rec is not None:
            rec.append(None)
        return
    # keyword arguments are constexprs / options (by value) or, rarely, tensors
    key = (fn, tuple(map(_spec, args)),
           tuple((k, _spec(v) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()))
    try:
        hit = _CACHE.get(key)
    except TypeError:  # an argument the cache cannot key (a host-side TMA descriptor): Triton's own launch
        fn[grid](*args, **kwargs)
        rec = getattr(_TLS, "record", None)
        if rec is not None:
            rec.append(None)
        return
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
    compiled.run(*_grid3(grid), current_stream(), compiled.function, compiled.packed_metadata, None, None, None,
                 *vals)


def _grid3(grid: tuple) -> tuple:
    """``grid`` as the launcher's three dimensions."""
    return grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1


def bind(compiled, grid: tuple, vals: list) -> tuple:
    """A recorded launch (:func:`record`) made ready for many replays: ``(fn, args, pos,
    ptrs)``; ``fn(stream, args)`` launches ``compiled`` on ``grid``, value ``i`` of ``vals`` is
    ``args[pos[i]]`` (where a replay puts its own tensors) and ``ptrs`` says whether a replay
    puts them in as their ``data_ptr()`` (a bound launch) or as tensors.

    Why: Triton's launcher does per launch what a replay need not redo. It turns every host
    TMA descriptor into a ``CUtensorMap`` again (a driver encode and Python list work per
    descriptor: the linear op's ``decode_tma`` backend has three), and for every tensor argument
    calls ``data_ptr()`` and asks the driver what the pointer is (``cuPointerGetAttribute``);
    an integer argument it takes as the address. Where the compiled kernel's launcher is
    Triton's C launcher (``__triton_launcher``), alone or inside its host-descriptor wrapper
    (whose closure holds it, the descriptor positions and their metadata), and the kernel needs
    no scratch memory, the descriptors are encoded here once with Triton's own
    ``make_tensordesc_arg``, CUDA tensors become their addresses and ``fn`` calls the C
    launcher directly. The tensors behind ``vals`` must then stay alive and where they are
    (the caller keeps ``vals``). Elsewhere (another launcher, ``_BIND`` off)
    ``fn`` is the compiled kernel's own launcher with ``vals`` as they are."""
    g = _grid3(grid)
    raw = _raw_launcher(compiled) if _BIND else None
    if raw is None:
        def run(stream, args):
            compiled.run(*g, stream, compiled.function, compiled.packed_metadata, None, None, None, *args)
        return run, list(vals), list(range(len(vals))), False
    launcher, indices, metas, encode = raw
    head = (compiled.run.launch_cooperative_grid, compiled.run.launch_pdl, None, None,
            compiled.packed_metadata, None, None, None)
    args: list = []
    pos = []
    d = 0
    for i, v in enumerate(vals):
        pos.append(len(args))
        if i in indices:
            args.extend(encode(v, metas[d]))
            d += 1
        else:
            args.append(v.data_ptr() if isinstance(v, torch.Tensor) and v.is_cuda else v)
    fn = compiled.function

    def run_raw(stream, a):
        launcher(*g, stream, fn, *head, *a)
    return run_raw, args, pos, True


def _raw_launcher(compiled):
    """``(C launcher, descriptor positions, their metadata, encode)`` below ``compiled``'s
    launcher: Triton's C launcher itself (no descriptors) or the one inside the closure of
    its host-descriptor wrapper (``wrap_handle_tensordesc``); None for anything else or when
    the kernel needs scratch memory."""
    run = getattr(compiled, "run", None)
    inner = getattr(run, "launch", None)
    if (inner is None or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1)
            or not hasattr(run, "launch_cooperative_grid") or not hasattr(run, "launch_pdl")):
        return None
    if getattr(inner, "__module__", None) == "__triton_launcher":
        return inner, frozenset(), (), None
    code, cells = getattr(inner, "__code__", None), getattr(inner, "__closure__", None)
    if code is None or cells is None:
        return None
    free = dict(zip(code.co_freevars, (c.cell_contents for c in cells)))
    encode = inner.__globals__.get("make_tensordesc_arg")
    if (encode is None or inner.__globals__.get("_BASE_ARGS_FORMAT_LEN") != 13
            or not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= free.keys()
            or getattr(free["launcher"], "__module__", None) != "__triton_launcher"):
        return None
    return free["launcher"], free["tensordesc_indices"], free["tensordesc_meta"], encode
