"""Bytes and flops models, ceilings, and the throughput figures derived from them.

Everything here is plain arithmetic on integers and floats (no torch, no GPU), so the
models are unit-tested in CI. Conventions:

* bytes are the fewest bytes an op must move through device memory: each input read
  once, each output written once (METHOD.md, "two numbers first");
* times are in milliseconds, bandwidth in GB/s (1e9 bytes/s), rates in TFLOP/s;
* a copy's bandwidth counts bytes read plus bytes written, so the copy ceiling and
  every op's achieved bandwidth are measured in the same unit.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

__all__ = [
    "CEILING_KINDS",
    "Ceilings",
    "Throughput",
    "copy_bytes",
    "quantize_bytes",
    "dequantize_bytes",
    "linear_bytes",
    "linear_flops",
    "gbps",
    "tflops",
    "throughput",
]

#: The ceilings a case can be held against: device copy bandwidth, cuBLAS bf16
#: matmul rate, and ``torch._scaled_mm`` fp8 rate.
CEILING_KINDS: tuple[str, ...] = ("copy", "bf16_mm", "fp8_mm")


@dataclass(frozen=True)
class Ceilings:
    """Ceilings measured in the same run as the ops they are compared with.

    Attributes:
        copy_gbps: device-to-device copy bandwidth, bytes read + written, GB/s.
        bf16_tflops: cuBLAS bf16 matmul rate, TFLOP/s (None where not measured).
        fp8_tflops: ``torch._scaled_mm`` fp8 e4m3 rate, TFLOP/s (None where not measured).
    """

    copy_gbps: Optional[float] = None
    bf16_tflops: Optional[float] = None
    fp8_tflops: Optional[float] = None

    def compute(self, kind: Optional[str]) -> Optional[float]:
        """The compute ceiling (TFLOP/s) named by ``kind`` ('bf16_mm' or 'fp8_mm'), or None."""
        if kind is None:
            return None
        if kind not in CEILING_KINDS:
            raise ValueError(f"ceiling kind={kind!r} is not one of {CEILING_KINDS}")
        return {"bf16_mm": self.bf16_tflops, "fp8_mm": self.fp8_tflops, "copy": None}[kind]

    def to_dict(self) -> dict:
        """JSON-able form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Ceilings":
        """Inverse of :meth:`to_dict` (unknown keys ignored)."""
        return cls(**{k: d.get(k) for k in ("copy_gbps", "bf16_tflops", "fp8_tflops")})


def _nonneg(name: str, value: int) -> int:
    if int(value) != value or value < 0:
        raise ValueError(f"{name}={value!r} must be a non-negative integer")
    return int(value)


def copy_bytes(nbytes: int) -> int:
    """Bytes moved by a device-to-device copy of ``nbytes``: read once, written once."""
    return 2 * _nonneg("nbytes", nbytes)


def quantize_bytes(numel: int, q_nbytes: int, in_elem_bytes: int = 2) -> int:
    """Quantize: read ``numel`` high-precision elements (bf16: 2 bytes each), write the
    QTensor's ``q_nbytes`` (codes + scales + global scale + zero points)."""
    return _nonneg("numel", numel) * _nonneg("in_elem_bytes", in_elem_bytes) + _nonneg("q_nbytes", q_nbytes)


def dequantize_bytes(numel: int, q_nbytes: int, out_elem_bytes: int = 2) -> int:
    """Dequantize: read the QTensor's ``q_nbytes``, write ``numel`` elements (bf16: 2 bytes)."""
    return _nonneg("q_nbytes", q_nbytes) + _nonneg("numel", numel) * _nonneg("out_elem_bytes", out_elem_bytes)


def linear_bytes(m: int, n: int, k: int, weight_nbytes: int, act_elem_bytes: int = 2,
                 out_elem_bytes: int = 2, bias_nbytes: int = 0) -> int:
    """``y[M,N] = x[M,K] @ W[N,K]^T``: read the weight (``weight_nbytes``, quantized or
    not) and the activations ``M*K``, write ``M*N`` outputs, read the bias if any."""
    m, n, k = _nonneg("M", m), _nonneg("N", n), _nonneg("K", k)
    return (_nonneg("weight_nbytes", weight_nbytes) + m * k * _nonneg("act_elem_bytes", act_elem_bytes)
            + m * n * _nonneg("out_elem_bytes", out_elem_bytes) + _nonneg("bias_nbytes", bias_nbytes))


def linear_flops(m: int, n: int, k: int) -> int:
    """Floating-point operations of ``x[M,K] @ W[N,K]^T``: one multiply and one add per
    product term, ``2*M*N*K``."""
    return 2 * _nonneg("M", m) * _nonneg("N", n) * _nonneg("K", k)


def gbps(nbytes: float, ms: float) -> float:
    """Achieved bandwidth in GB/s (1e9 bytes/s) of ``nbytes`` moved in ``ms`` milliseconds."""
    if ms <= 0:
        raise ValueError(f"ms={ms!r} must be positive")
    return nbytes / ms / 1e6


def tflops(flops: float, ms: float) -> float:
    """Achieved rate in TFLOP/s of ``flops`` done in ``ms`` milliseconds."""
    if ms <= 0:
        raise ValueError(f"ms={ms!r} must be positive")
    return flops / ms / 1e9


@dataclass(frozen=True)
class Throughput:
    """What a measured time means against the models and the ceilings.

    Attributes:
        gbps: achieved bandwidth (bytes model / time).
        tflops: achieved rate (flops model / time); 0 for ops with no flops model.
        pct_copy: achieved bandwidth as % of the copy ceiling (None without one).
        pct_compute: achieved rate as % of the compute ceiling (None without one).
        floor_ms: the roofline floor, max(bytes / copy bw, flops / compute rate)
            over the ceilings that are known (None if none is).
        pct_roofline: ``floor_ms / ms`` in % — how close the op is to the floor.
        bound: 'memory' or 'compute', whichever term sets the floor (None if unknown).
    """

    gbps: float
    tflops: float
    pct_copy: Optional[float]
    pct_compute: Optional[float]
    floor_ms: Optional[float]
    pct_roofline: Optional[float]
    bound: Optional[str]


def throughput(nbytes: int, flops: int, ms: float, ceilings: Ceilings,
               compute_kind: Optional[str] = None) -> Throughput:
    """Achieved GB/s and TFLOP/s of an op that moved ``nbytes`` and did ``flops`` in
    ``ms``, and their percentage of the ceilings (``compute_kind`` names the compute
    ceiling that applies: 'bf16_mm', 'fp8_mm' or None for ops without a matmul)."""
    bw = gbps(nbytes, ms)
    rate = tflops(flops, ms)
    peak = ceilings.compute(compute_kind) if flops else None
    pct_copy = 100.0 * bw / ceilings.copy_gbps if ceilings.copy_gbps else None
    pct_compute = 100.0 * rate / peak if peak else None
    t_mem = nbytes / ceilings.copy_gbps / 1e6 if ceilings.copy_gbps else None
    t_cmp = flops / peak / 1e9 if peak else None
    terms = [(t, name) for t, name in ((t_mem, "memory"), (t_cmp, "compute")) if t is not None]
    if terms:
        floor_ms, bound = max(terms)
        pct_roofline = 100.0 * floor_ms / ms
    else:
        floor_ms, bound, pct_roofline = None, None, None
    return Throughput(gbps=bw, tflops=rate, pct_copy=pct_copy, pct_compute=pct_compute,
                      floor_ms=floor_ms, pct_roofline=pct_roofline, bound=bound)
