"""Layer 2: the reference quantizer and dequantizer in plain PyTorch (any device).

This is the oracle the kernels are tested against: vectorized, exact, slow is fine.
"""
from __future__ import annotations

import math

import torch

from .formats import (
    Format, NonFinite, Overflow, Rounding, ScaleRule, TwoLevel, e8m0_from_amax,
    pack_codes, packed_len, round_integer, unpack_codes,
)
from .formats.elements import _enum, beyond_float32, div_exact as _div
from .options import QuantizeOptions, resolve_format
from .qtensor import QTensor

__all__ = ["quantize", "dequantize", "resolve_format", "nvfp4_global_scale"]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
E4M3_MAX, E2M1_MAX = 448.0, 6.0


def fit_float32(x: torch.Tensor, overflow: Overflow, op: str = "quantize") -> torch.Tensor:
    """float64 input: finite values beyond float32's range (which the quantizers compute in)
    become +-float32 max under ``overflow='saturate'`` and raise under ``'native'``.
    Other dtypes pass through untouched (no pass over the data)."""
    if x.dtype != torch.float64 or x.numel() == 0:
        return x
    big = beyond_float32(x)
    if not bool(big.any()):
        return x
    if overflow is Overflow.SATURATE:
        return torch.where(big, x.clamp(-_F32_MAX, _F32_MAX), x)
    v = float(x[big].abs().max())
    raise ValueError(f"{op}: x has finite values beyond float32's range (|x| up to {v:.6g} > {_F32_MAX:.8g}); "
                     "quantization computes in float32: pass overflow='saturate' to clamp them to "
                     "+-float32 max")


_F32_MAX = torch.finfo(torch.float32).max


def _check_input(x: torch.Tensor, fmt: Format, pad: bool, op: str,
                 overflow: Overflow = Overflow.NATIVE) -> torch.Tensor:
    """``x`` checked, fitted to float32's range (:func:`fit_float32`) and padded to whole blocks."""
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{op}: x has dtype {x.dtype}; expected one of float32, float16, bfloat16, float64")
    if not isinstance(pad, bool):
        raise TypeError(f"{op}: pad must be a bool, got {pad!r} ({type(pad).__name__})")
    x = fit_float32(x, overflow, op)
    if x.dim() < max(1, 2 if fmt.block_rows > 1 else 1):
        raise ValueError(f"{op}: x must have at least {2 if fmt.block_rows > 1 else 1} dims for {fmt.name}")
    k = x.shape[-1]
    pads = [0, (-k) % fmt.block_size]
    if fmt.block_rows > 1:
        pads += [0, (-x.shape[-2]) % fmt.block_rows]
    if any(pads):
        if not pad:
            what = (f"K={k} is not a multiple of the {fmt.name} block size {fmt.block_size}" if pads[1]
                    else f"rows={x.shape[-2]} is not a multiple of the {fmt.name} block rows {fmt.block_rows}")
            raise ValueError(f"{op}: {what}; pass pad=True to pad")
        x = torch.nn.functional.pad(x, pads)
    return x


def _blocks(xf: torch.Tensor, fmt: Format) -> tuple[torch.Tensor, tuple[int, ...]]:
    """View ``xf`` with block axes; return it and the axes to reduce over."""
    k = xf.shape[-1]
    if fmt.block_rows == 1:
        return xf.reshape(*xf.shape[:-1], k // fmt.block_size, fmt.block_size), (-1,)
    n = xf.shape[-2]
    return (xf.reshape(*xf.shape[:-2], n // fmt.block_rows, fmt.block_rows, k // fmt.block_size, fmt.block_size),
            (-3, -1))


def _unblock_scales(s: torch.Tensor, fmt: Format) -> torch.Tensor:
    """Per-block tensor -> broadcastable against the blocked view."""
    return s.unsqueeze(-1) if fmt.block_rows == 1 else s.unsqueeze(-2).unsqueeze(-1)


def _finite_amax(x: torch.Tensor) -> torch.Tensor:
    """float32 amax of |x| over its finite elements."""
    x = x.detach()
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    lo, hi = torch.aminmax(x)  # one pass, no |x| copy (15x faster than abs().amax() for bf16 on CPU)
    amax = torch.maximum(hi.abs(), lo.abs()).to(torch.float32)
    if not bool(torch.isfinite(amax)):  # rare: exclude NaN/Inf elements
        a = x.abs()
        amax = torch.where(torch.isfinite(a), a, torch.zeros((), dtype=a.dtype, device=a.device)).amax().float()
    return amax


def nvfp4_global_scale(x: torch.Tensor, convention: TwoLevel | str = TwoLevel.MODELOPT) -> torch.Tensor:
    """Per-tensor decode scale ``s_dec`` (float32 0-d) of the two-level NVFP4 scheme.

    ``amax/2688`` (2688 = 448*6) over the finite values of ``x``; compressed-tensors
    computes ``gs = 2688/max(amax, tiny)`` (NaN/Inf -> 1) and decodes with ``1/gs``.
    An all-zero tensor gets 1.0.
    """
    conv = _enum(TwoLevel, convention, "convention")
    amax = _finite_amax(x)
    one = torch.ones((), dtype=torch.float32, device=amax.device)
    if conv is TwoLevel.COMPRESSED_TENSORS:
        return one / compressed_tensors_global_scale(amax)
    s = _div(amax, E4M3_MAX * E2M1_MAX)
    return torch.where(amax > 0, s, one)


def compressed_tensors_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' stored (reciprocal) global scale ``gs = 2688/max(amax, tiny)``,
    NaN/Inf/zero-amax -> 1."""
    one = torch.ones((), dtype=torch.float32, device=amax.device)
    gs = (E4M3_MAX * E2M1_MAX) / torch.clamp(amax, min=torch.finfo(torch.float32).tiny)
    return torch.where(torch.isfinite(gs) & (amax > 0), gs, one)


def _two_level(xb, amax, fmt: Format, s_dec: torch.Tensor, gs_exact: torch.Tensor | None = None):
    """Block scales (raw ue4m3) and the divisor/multiplier that scales x into element range."""
    codec = fmt.scale
    conv = fmt.two_level
    if conv is TwoLevel.MODELOPT:
        sbf = amax / (E2M1_MAX * s_dec)
        sbf = torch.where(sbf == 0, torch.ones_like(sbf), sbf)
        raw = codec.encode(sbf)  # ModelOpt's plain torch cast (it saturates), no clamp first
        xs = xb / _unblock_scales(codec.decode(raw) * s_dec, fmt)
    elif conv is TwoLevel.TORCHAO:
        sbf = torch.clamp(_div(amax, E2M1_MAX) / s_dec, min=2.0**-6, max=E4M3_MAX)
        raw = codec.encode(sbf)
        xs = xb * _unblock_scales((1.0 / s_dec) / codec.decode(raw), fmt)
    else:  # compressed-tensors keeps the reciprocal global scale gs (exact, in meta)
        gs = 1.0 / s_dec if gs_exact is None else gs_exact
        sbf = torch.clamp(gs * _div(amax, E2M1_MAX), max=E4M3_MAX)
        raw = codec.encode(sbf)
        raw = torch.where(codec.decode(raw) == 0, torch.full_like(raw, 0.125), raw)
        xs = xb / _unblock_scales(codec.decode(raw) / gs, fmt)
    return raw, xs


def quantize(
    x: torch.Tensor,
    fmt: str | Format | QuantizeOptions,
    *,
    scale_rule: str | ScaleRule | None = None,
    block_size: int | None = None,
    rounding: str | Rounding = Rounding.NEAREST_EVEN,
    overflow: str | Overflow = Overflow.SATURATE,
    nonfinite: str | NonFinite = NonFinite.PROPAGATE,
    global_scale: float | torch.Tensor | None = None,
    convention: str | TwoLevel | None = None,
    pad: bool = False,
    generator: torch.Generator | None = None,
) -> QTensor:
    """Quantize ``x`` to ``fmt`` with the reference (PyTorch) path; see :func:`microscale.quantize`
    (``fmt`` may be resolved :class:`~microscale.options.QuantizeOptions`)."""
    op = "quantize"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a torch.Tensor, got {type(x).__name__}")
    o = QuantizeOptions.resolve(fmt, scale_rule=scale_rule, block_size=block_size, rounding=rounding,
                                overflow=overflow, nonfinite=nonfinite, global_scale=global_scale,
                                convention=convention, pad=pad, generator=generator, op=op)
    fmt, rounding, overflow, nonfinite, pad, generator = o.fmt, o.rounding, o.overflow, o.nonfinite, o.pad, o.generator
    shape, dtype = x.shape, x.dtype
    x = _check_input(x, fmt, pad, op, overflow)
    if nonfinite is NonFinite.ERROR and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{op}: x has NaN or Inf (nonfinite='error')")
    gscale = gs_exact = None
    meta = {"two_level": fmt.two_level.value} if fmt.global_scale else {}
    if fmt.global_scale:
        if o.global_scale is None:
            if fmt.two_level is TwoLevel.COMPRESSED_TENSORS:  # keep its stored gs exact
                gs_exact = compressed_tensors_global_scale(_finite_amax(x))
                gscale = 1.0 / gs_exact
                meta["global_scale_inv"] = float(gs_exact)
            else:
                gscale = nvfp4_global_scale(x, fmt.two_level)
        else:  # (checked by QuantizeOptions)
            gscale = torch.as_tensor(o.global_scale, dtype=torch.float32, device=x.device).reshape(())
    k = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    x2 = x.reshape(rows, k)
    br = fmt.block_rows
    # Work in row slabs of ~256K elements so every pass stays in cache (~3x faster on CPU).
    step = max(br, (_CHUNK // max(k, 1)) // br * br)
    data = torch.empty((rows, packed_len(k, fmt.element.bits)), dtype=torch.uint8, device=x.device)
    scales = torch.empty((rows // br, k // fmt.block_size), dtype=fmt.scale.storage, device=x.device)
    zps = torch.empty(scales.shape, dtype=torch.uint8, device=x.device) if fmt.zero_point else None
    for r0 in range(0, rows if k else 0, step):
        r1 = min(rows, r0 + step)
        d, sc, zp = _quantize_rows(x2[r0:r1], fmt, gscale, gs_exact, rounding, overflow, nonfinite, generator)
        data[r0:r1] = d
        scales[r0 // br:r1 // br] = sc
        if zps is not None:
            zps[r0 // br:r1 // br] = zp
    lead = tuple(x.shape[:-1])
    if br > 1:
        sshape = (*lead[:-1], lead[-1] // br, k // fmt.block_size)
    else:
        sshape = (*lead, k // fmt.block_size)
    return QTensor(data.reshape(*lead, data.shape[-1]), scales.reshape(sshape), fmt, shape, dtype, gscale,
                   None if zps is None else zps.reshape(sshape), meta)


_CHUNK = 1 << 18  # elements per slab: 1 MiB of float32, best measured on 2 cores (benchmarks/cpu_quantize.py)


def _quantize_rows(x, fmt: Format, gscale, gs_exact, rounding, overflow, nonfinite, generator):
    """Quantize a 2-D slab of whole blocks: returns (packed codes, raw scales, zero points)."""
    xf = x.to(torch.float32)  # (bf16 reductions are slow on CPU; converting first is cheaper)
    if nonfinite is NonFinite.ZERO:
        xf = torch.where(torch.isfinite(xf), xf, torch.zeros((), device=xf.device))
    xb, red = _blocks(xf, fmt)
    elem, codec, rule = fmt.element, fmt.scale, fmt.scale_rule
    amax = xb.abs().amax(dim=red)
    zp = None
    if fmt.global_scale:
        raw, xs = _two_level(xb, amax, fmt, gscale, gs_exact)
    elif rule.power_of_two:
        raw = e8m0_from_amax(amax, rule, elem)
        xs = xb / _unblock_scales(codec.decode(raw), fmt)
    elif rule is ScaleRule.AMAX:
        raw = codec.encode(_div(amax, elem.max))  # (a python divisor: inexact on CUDA)
        s = codec.decode(raw)
        xs = xb / _unblock_scales(torch.where(s == 0, torch.ones_like(s), s), fmt)
    else:  # MINMAX (affine): unsigned codes, x = (code - zp) * s
        # The block's range comes from its finite values: unsigned codes have no NaN or Inf, so
        # a NaN encodes as the zero point (decodes to 0, as ml_dtypes' NaN-less types do) and
        # +-Inf saturates to the largest / smallest code; the block's other values are kept.
        qmax = float(elem.max_code)
        xr = torch.where(torch.isfinite(xb), xb, torch.zeros((), device=xb.device))
        lo = torch.clamp(xr.amin(dim=red).to(torch.float32), max=0.0)
        hi = torch.clamp(xr.amax(dim=red).to(torch.float32), min=0.0)
        raw = codec.encode(_div(hi - lo, qmax))
        raw = torch.where(codec.decode(raw) > 0, raw, codec.encode(torch.ones_like(hi)))  # zero blocks
        s = codec.decode(raw)
        zpf = torch.clamp(round_integer(-lo / s), 0.0, qmax)
        zp = zpf.to(torch.uint8)
        q = round_integer(xb / _unblock_scales(s, fmt), rounding, generator) + _unblock_scales(zpf, fmt)
        q = torch.where(torch.isnan(q), _unblock_scales(zpf, fmt), q)
        codes = torch.nan_to_num(q).clamp(0.0, qmax).to(torch.uint8)
    if zp is None:
        codes = elem.encode(xs, rounding, overflow, nonfinite, generator)
    return pack_codes(codes.reshape(x.shape), elem.bits), raw, zp


def dequantize(q: QTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode a :class:`QTensor` with the reference path (any device)."""
    q.validate()  # (its fields may have been reassigned since construction)
    fmt = q.fmt
    pshape = q.padded_shape
    vals = fmt.element.decode(unpack_codes(q.data, fmt.element.bits, pshape[-1])).reshape(pshape)
    vb, _ = _blocks(vals, fmt)
    s = fmt.scale.decode(q.scales)
    if fmt.zero_point:
        vb = vb - _unblock_scales(q.zero_points.to(torch.float32), fmt)
    out = vb * _unblock_scales(s, fmt)
    if fmt.global_scale:
        out = out * q.global_scale.to(out.device)
    out = out.reshape(pshape)
    if tuple(pshape) != tuple(q.shape):
        out = out[tuple(slice(0, n) for n in q.shape)]
    return out.to(dtype)
