"""Quantizers that lower the error and still produce ordinary QTensors.

Every method here returns the same kind of :class:`~microscale.QTensor` that
``ms.quantize(x, fmt)`` (round-to-nearest, ``"rtn"``) returns: the canonical codes and the
format's own scale codec, so dequantize, every kernel and every checkpoint convention
read it unchanged. Only *which* scale a block gets differs; the elements are then encoded
with round-to-nearest-even under that scale.

* ``"mse"``: per block, try candidate scales near the round-to-nearest one and keep the
  one with the least squared error. Candidates: E8M0 scales ``B-2 .. B+2``; UE4M3 scales the
  16 codes around the rtn code (``c-8 .. c+8``, positive finite codes only); float scales
  ``s * f`` for ``f`` in 1.0, 0.975, ..., 0.7. The rtn choice is always a candidate and wins
  ties, so no block gets worse (the error is summed in float64).
* ``"4over6"``: formats with E2M1 elements and a non-power-of-two scale (NVFP4, fp4_fp16,
  fp4_fp32): each block's scale maps its amax to 6 (rtn) or to 4 (``amax_b / 4``, encoded
  with the scale codec; two-level formats divide by the tensor's global scale as well); the
  lower squared error wins, 6 on ties. Mapping to 4 puts the block's largest values on the
  finer part of the E2M1 grid (..., 3, 4) at the cost of the 6.

Both work on any device with plain torch ops (the rtn codes come from ``ms.quantize``).
"""
from __future__ import annotations

import torch

from ..formats import Format, NonFinite, Overflow, Rounding, pack_codes, unpack_codes
from ..qtensor import QTensor

__all__ = ["METHODS", "quantize_with", "block_errors"]

#: The quantize methods (``ms.quantize(..., method=...)``); ``rtn`` is the plain quantizer.
METHODS = ("rtn", "mse", "4over6")

_E8M0_STEPS = range(-2, 3)
_UE4M3_STEPS = range(-8, 9)
_FLOAT_FACTORS = tuple(1.0 - 0.025 * i for i in range(13))


def _check(fmt: Format, method: str) -> None:
    if fmt.zero_point:
        raise ValueError(f"quantize: method={method!r} does not apply to the affine format {fmt.name!r} "
                         "(zero points); use method='rtn'")
    if fmt.block_rows != 1:
        raise ValueError(f"quantize: method={method!r} supports 1-D blocks only; {fmt.name!r} has "
                         f"{fmt.block_rows}x{fmt.block_size} blocks")
    if method == "4over6" and (fmt.element.name != "e2m1" or fmt.scale.power_of_two):
        raise ValueError(f"quantize: method='4over6' needs E2M1 elements with a non-power-of-two scale "
                         f"(nvfp4, fp4_fp16, fp4_fp32); {fmt.name!r} has {fmt.element.name} elements and "
                         f"{fmt.scale.name} scales")


def _blocks_of(q: QTensor, x: torch.Tensor):
    """x (padded to the QTensor's padded shape) as float32 [rows, nblk, B], the rtn codes
    (same view, uint8) and raw scales [rows, nblk]."""
    fmt = q.fmt
    pshape = q.padded_shape
    xp = x.detach()
    pads = [0, pshape[-1] - x.shape[-1]]
    if any(pads):
        xp = torch.nn.functional.pad(xp, pads)
    b = fmt.block_size
    rows = xp.numel() // max(pshape[-1], 1)
    xb = xp.reshape(rows, pshape[-1] // b, b).to(torch.float32)
    codes = unpack_codes(q.data, fmt.element.bits, pshape[-1]).reshape(xb.shape)
    return xb, codes, q.scales.reshape(xb.shape[:2])


def _scale_mult(fmt: Format, raw: torch.Tensor, q: QTensor) -> torch.Tensor:
    """Decoded block scale times the global scale (what a code is multiplied by)."""
    s = fmt.scale.decode(raw)
    if q.global_scale is not None:
        s = s * q.global_scale.to(s.device)
    return s


def block_errors(xb: torch.Tensor, codes: torch.Tensor, mult: torch.Tensor, fmt: Format) -> torch.Tensor:
    """Squared error per block (float64) of codes ``[rows, nblk, B]`` under per-block
    multipliers ``[rows, nblk]`` against ``xb``."""
    deq = fmt.element.decode(codes).to(torch.float64) * mult.to(torch.float64).unsqueeze(-1)
    d = xb.to(torch.float64) - deq
    return (d * d).sum(-1)


def _encode(xb: torch.Tensor, mult: torch.Tensor, fmt: Format) -> torch.Tensor:
    safe = torch.where(mult > 0, mult, torch.ones_like(mult))
    return fmt.element.encode(xb / safe.unsqueeze(-1), Rounding.NEAREST_EVEN, Overflow.SATURATE, NonFinite.PROPAGATE)


def _candidates(fmt: Format, raw: torch.Tensor, method: str, q: QTensor, xb: torch.Tensor):
    """Candidate raw scales (same dtype and shape as ``raw``), the rtn one excluded."""
    codec = fmt.scale
    if method == "4over6":
        amax = xb.abs().amax(-1)
        s = amax / 4.0
        if q.global_scale is not None:
            s = s / q.global_scale.to(s.device)
        yield codec.encode(s)
        return
    if codec.name == "e8m0":
        base = raw.to(torch.int32)
        for d in _E8M0_STEPS:
            if d:
                yield (base + d).clamp(0, 254).to(torch.uint8)
    elif codec.name == "ue4m3":
        base = raw.view(torch.uint8).to(torch.int32)
        for d in _UE4M3_STEPS:
            if d:  # 1..0x7E: the positive finite E4M3 codes (0x7F is NaN)
                yield (base + d).clamp(1, 0x7E).to(torch.uint8).view(torch.float8_e4m3fn)
    else:
        s = codec.decode(raw)
        for f in _FLOAT_FACTORS[1:]:
            yield codec.encode(s * f)


def quantize_with(x: torch.Tensor, fmt: str | Format, method: str, **kwargs) -> QTensor:
    """``ms.quantize(x, fmt, method=method, **kwargs)`` for a method other than ``"rtn"``
    (see the module doc); ``kwargs`` as :func:`microscale.quantize` takes them."""
    from ..ops import quantize

    if method not in METHODS:
        raise ValueError(f"quantize: method={method!r} is not known; expected one of {', '.join(METHODS)}")
    if kwargs.get("rounding", "nearest_even") not in ("nearest_even", Rounding.NEAREST_EVEN):
        raise ValueError(f"quantize: method={method!r} rounds to nearest even; got rounding={kwargs['rounding']!r}")
    q = quantize(x, fmt, **kwargs)
    if method == "rtn":
        return q
    fmt = q.fmt
    _check(fmt, method)
    xb, best_codes, best_raw = _blocks_of(q, x)
    best_err = block_errors(xb, best_codes, _scale_mult(fmt, best_raw, q), fmt)
    for raw in _candidates(fmt, best_raw, method, q, xb):
        mult = _scale_mult(fmt, raw, q)
        codes = _encode(xb, mult, fmt)
        err = block_errors(xb, codes, mult, fmt)
        better = (err < best_err) & (mult > 0) & torch.isfinite(mult)  # (NaN error: keep rtn)
        best_err = torch.where(better, err, best_err)
        best_raw = torch.where(better, raw.view(torch.uint8), best_raw.view(torch.uint8)).view(best_raw.dtype) \
            if raw.dtype == torch.float8_e4m3fn else torch.where(better, raw, best_raw)
        best_codes = torch.where(better.unsqueeze(-1), codes, best_codes)
    data = pack_codes(best_codes.reshape(-1, q.padded_shape[-1]), fmt.element.bits).reshape(q.data.shape)
    return QTensor(data, best_raw.reshape(q.scales.shape).contiguous(), fmt, q.shape, q.dtype, q.global_scale,
                   None, dict(q.meta))
