"""Checks of an op's output against the reference: bit-exact for codecs, relative
Frobenius error against float64 for matmuls."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

__all__ = ["LINEAR_TOL", "Check", "check_qtensor", "check_bits", "rel_fro", "check_matmul"]

#: Relative Frobenius error a bf16-output matmul must stay under (DESIGN.md, Testing).
LINEAR_TOL = 1e-2


@dataclass(frozen=True)
class Check:
    """The outcome of comparing an output with the reference.

    Attributes:
        ok: the output passed.
        metric: what ``value`` measures ('mismatches' for bit-exact checks, 'rel_fro'
            for relative Frobenius error, 'roundtrip_rel' for peers checked by error).
        value: the measured value.
        detail: a human-readable summary.
    """

    ok: bool
    metric: str
    value: float
    detail: str = ""


def _bit_mismatches(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> int:
    """Number of elements whose bits differ (NaNs with equal bits match); -1 on a
    shape/dtype/presence mismatch."""
    if a is None or b is None:
        return 0 if a is None and b is None else -1
    if a.shape != b.shape or a.dtype != b.dtype:
        return -1
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    ia = a.contiguous().view(ints[a.element_size()])
    ib = b.contiguous().to(a.device).view(ints[b.element_size()])
    return int((ia != ib).sum())


_QFIELDS = ("data", "scales", "global_scale", "zero_points")


def check_qtensor(q: Any, ref: Any) -> Check:
    """Bit-exact comparison of two QTensors field by field."""
    bad = {f: _bit_mismatches(getattr(q, f, None), getattr(ref, f, None)) for f in _QFIELDS}
    total = sum(v for v in bad.values() if v > 0)
    broken = [f for f, v in bad.items() if v < 0]
    ok = total == 0 and not broken
    detail = "bit-exact" if ok else ", ".join(
        f"{f}: {'shape/dtype differ' if v < 0 else f'{v} mismatches'}" for f, v in bad.items() if v)
    return Check(ok, "mismatches", float(total if not broken else -1), detail)


def check_bits(y: torch.Tensor, ref: torch.Tensor) -> Check:
    """Bit-exact comparison of two dense tensors."""
    n = _bit_mismatches(y, ref)
    ok = n == 0
    detail = "bit-exact" if ok else ("shape/dtype differ" if n < 0 else f"{n} of {ref.numel()} elements differ")
    return Check(ok, "mismatches", float(n), detail)


def rel_fro(y: torch.Tensor, ref: torch.Tensor) -> float:
    """``||y - ref|| / ||ref||`` in float64 (inf when y has NaN/Inf or shapes differ)."""
    if y.shape != ref.shape:
        return float("inf")
    y64 = y.to(torch.float64)
    if not bool(torch.isfinite(y64).all()):
        return float("inf")
    r64 = ref.to(device=y.device, dtype=torch.float64)
    return float((y64 - r64).norm() / r64.norm().clamp_min(1e-300))


def check_matmul(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, tol: float = LINEAR_TOL) -> Check:
    """``y`` against ``x @ w^T`` computed in float64, by relative Frobenius error."""
    ref = x.to(torch.float64) @ w.to(torch.float64).T
    err = rel_fro(y, ref)
    return Check(err < tol, "rel_fro", err, f"rel Frobenius error {err:.3g} (tolerance {tol:g})")
