"""Facts about the machine a GPU path runs on: Triton's presence and version, the
interpreter, a device's compute capability, SM count and programmatic-launch support.

Every GPU path asks here instead of asking torch or the environment itself, so that
tests can stand in another machine with :func:`override` (e.g. an sm_90 device with 132
SMs on a CPU-only host). Nothing here imports Triton unless asked.
"""
from __future__ import annotations

import contextlib
import functools
import os
from typing import Iterator

import torch

__all__ = ["SUPPORTED_TRITON", "has_triton", "triton_version", "triton_supported", "require_triton",
           "interpreting", "capability", "num_sms", "pdl_capable", "override"]

#: the Triton releases the GPU kernels and the launcher were written and tested against: ``[lo, hi)``
SUPPORTED_TRITON = ((3, 6), (3, 7))

_FACTS = ("triton_version", "interpreting", "capability", "num_sms", "pdl")
_over: dict = {}  # the facts :func:`override` stands in (empty: the real machine)


@functools.lru_cache(maxsize=1)
def _real_triton_version() -> tuple[int, ...] | None:
    try:
        import triton
    except ImportError:
        return None
    parts = []
    for p in triton.__version__.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def triton_version() -> tuple[int, ...] | None:
    """The installed Triton's ``(major, minor, patch)``, or None when Triton does not import."""
    if "triton_version" in _over:
        return _over["triton_version"]
    return _real_triton_version()


def has_triton() -> bool:
    """Whether Triton imports (the GPU kernels need it; the CPU paths never do)."""
    return triton_version() is not None


def _in_range(v: tuple[int, ...] | None) -> bool:
    return v is not None and SUPPORTED_TRITON[0] <= v[:2] < SUPPORTED_TRITON[1]


@functools.lru_cache(maxsize=1)
def _real_supported() -> bool:
    return _in_range(_real_triton_version())


def triton_supported() -> bool:
    """Whether the installed Triton is within :data:`SUPPORTED_TRITON` (asked per launch: cached)."""
    if "triton_version" in _over:
        return _in_range(_over["triton_version"])
    return _real_supported()


def require_triton(what: str) -> None:
    """Raise a clear error when ``what`` (a GPU path) cannot run: Triton missing, or a release
    outside :data:`SUPPORTED_TRITON`."""
    v = triton_version()
    (lo0, lo1), (hi0, hi1) = SUPPORTED_TRITON
    want = f"triton>={lo0}.{lo1},<{hi0}.{hi1}"
    if v is None:
        raise ImportError(f"microscale: {what} needs Triton ({want}), which is not installed; CPU tensors "
                          "run the reference path without it")
    if not triton_supported():
        raise RuntimeError(f"microscale: {what} was written for {want}, but triton "
                           f"{'.'.join(map(str, v))} is installed; install a supported release "
                           "(CPU tensors run the reference path with any)")


def interpreting() -> bool:
    """Whether Triton kernels run in its interpreter (``TRITON_INTERPRET=1``, Triton's own switch)."""
    if "interpreting" in _over:
        return _over["interpreting"]
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=64)
def _real_capability(device: torch.device) -> tuple[int, int]:
    if device.type != "cuda":
        return (0, 0)
    return torch.cuda.get_device_capability(device)


def capability(device: torch.device) -> tuple[int, int]:
    """``(major, minor)`` compute capability of a CUDA ``device``; ``(0, 0)`` for other devices."""
    if "capability" in _over:
        return _over["capability"]
    return _real_capability(device)


@functools.lru_cache(maxsize=64)
def _real_num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8  # (the interpreter: a small machine, so that tests see split and unsplit grids)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (8 for a non-CUDA device: the interpreter's stand-in)."""
    if "num_sms" in _over:
        return _over["num_sms"]
    return _real_num_sms(device)


@functools.lru_cache(maxsize=64)
def _real_pdl(device: torch.device) -> bool:
    return device.type == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability(device) >= (9, 0)


def pdl_capable(device: torch.device) -> bool:
    """Programmatic dependent launch (``griddepcontrol``) on ``device``: an NVIDIA GPU of
    compute capability 9.0 or newer (not ROCm, whose capability numbers overlap)."""
    if "pdl" in _over:
        return _over["pdl"]
    return _real_pdl(device)


@contextlib.contextmanager
def override(**facts) -> Iterator[None]:
    """Stand in other target facts while the block runs (tests, tools): any of
    ``triton_version`` (a tuple, or None for no Triton), ``interpreting``, ``capability``,
    ``num_sms``, ``pdl``. Nested overrides stack; the previous facts come back on exit."""
    bad = set(facts) - set(_FACTS)
    if bad:
        raise TypeError(f"override: unknown target facts {sorted(bad)}; expected some of {list(_FACTS)}")
    saved = dict(_over)
    _over.update(facts)
    try:
        yield
    finally:
        _over.clear()
        _over.update(saved)
