"""GPU quantize for every format (Triton; device code in :mod:`._kernels.quantize`).

:func:`quantize` has the signature of :func:`microscale.reference.quantize` and bit-identical
results (except ``rounding='stochastic'``, which cannot reproduce the CPU generator's draws:
callers fall back to the reference, see :func:`~.params.unsupported_reason`). It returns a
:class:`~microscale.QTensor` with row-major scales.

No host synchronisation on the hot path: the dynamic NVFP4 per-tensor amax is reduced
on the GPU into a maximum that the quantize kernel reads. Exceptions:
``nonfinite='error'`` (reads an error flag back to raise), and dynamic two-level
quantization under the ``compressed-tensors`` convention (its exact reciprocal global
scale goes into ``QTensor.meta`` as a Python float). A static ``global_scale`` given as
a CUDA tensor is not range-checked (that would synchronise); numbers and CPU tensors are.
"""
from __future__ import annotations

import functools

import torch

from .. import reference
from ..formats import Format, NonFinite, Overflow, Rounding, ScaleLayout, ScaleRule, TwoLevel, get_scale_layout, \
    packed_len
from ..formats.kinds import ScaleKind
from ..options import QuantizeOptions
from ..qtensor import QTensor
from ..runtime import target
from . import params as _p
from . import tuning
from .tuning import QuantizeConfig

__all__ = ["quantize"]

_NP_MAX = 1024  # most partial maxima of the global amax reduction


@functools.cache
def _device():
    """The launcher and the amax / quantize kernel modules: they import Triton, so on first use."""
    from ..runtime import launch
    from ._kernels import amax, quantize

    return launch, amax, quantize


def _prepare(x, fmt, scale_rule, block_size, rounding, overflow, nonfinite, global_scale, convention, pad,
             op="quantize"):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type != "cuda" and not target.interpreting():  # Triton would say "0 active drivers"
        raise ValueError(f"{op}: x is on {x.device}; this is the GPU kernel's entry point: pass a CUDA tensor "
                         "(ms.quantize / ms.dequantize take CPU tensors through the reference; TRITON_INTERPRET=1 "
                         "emulates the kernel on the CPU)")
    o = QuantizeOptions.resolve(fmt, scale_rule=scale_rule, block_size=block_size, rounding=rounding,
                                overflow=overflow, nonfinite=nonfinite, global_scale=global_scale,
                                convention=convention, pad=pad, op=op)
    fmt, rounding, overflow, nonfinite = o.fmt, o.rounding, o.overflow, o.nonfinite
    why = _p.unsupported_reason(fmt, rounding)
    if why:
        raise NotImplementedError(f"{op}: {why}")
    xp = reference._check_input(x, fmt, o.pad, op)
    gscale = None
    if fmt.global_scale and o.global_scale is not None:
        g = o.global_scale
        if isinstance(g, torch.Tensor) and g.is_cuda:
            gscale = g.to(device=x.device, dtype=torch.float32).reshape(())
        else:  # a fill kernel, not a host-to-device copy, so the call can be captured in a CUDA graph
            gscale = torch.full((), float(g), dtype=torch.float32, device=x.device)
    return fmt, rounding, overflow, nonfinite, xp, gscale


def _launch(x2: torch.Tensor, fmt: Format, rounding: Rounding, overflow: Overflow, nonfinite: NonFinite,
            gscale: torch.Tensor | None, layout: ScaleLayout, config: QuantizeConfig | None,
            prologue: int = 0, y2: torch.Tensor | None = None, w: torch.Tensor | None = None, eps: float = 0.0,
            dest: tuple | None = None):
    """Run the quantize kernel on a 2-D ``[R, K]`` input (whole blocks).
    Returns (data, scales, zero_points, global scale or None, flags or None).

    ``dest = (rows, data, scales, zero_points)``: input row ``r`` is written to row ``rows[r]`` (int64) of
    the given contiguous buffers instead of new ones (row-major scales, 1-D blocks, a static global scale):
    ``data`` rows of the packed row length, ``scales`` (raw storage) and ``zero_points`` rows of ``K / B``."""
    rl, amax_k, quant_k = _device()
    cdiv, next_pow2 = rl.cdiv, rl.next_pow2
    tune = tuning.current()
    dev = x2.device
    if not x2.is_contiguous():  # the global-amax pass reads x flat
        x2 = x2.contiguous()
    if y2 is not None and not y2.is_contiguous():
        y2 = y2.contiguous()
    R, K = x2.shape
    elem, B, BR = fmt.element, fmt.block_size, fmt.block_rows
    pk = tune.packed and _p._packed_bf16(x2, fmt, rounding, overflow, nonfinite, prologue)
    cfg = config or tuning.choose_config(fmt, R, K, packed=pk)
    tuning.check_config(cfg, fmt)
    SR, SC = R // BR, K // B
    lay = _p._layout_code(layout)
    if dest is not None:
        dst, data, scales, zps = dest
        if lay != 0 or BR != 1 or (fmt.global_scale and gscale is None) or prologue:
            raise ValueError("quantize_into_rows: row-major scales, 1-D blocks and a static global scale only "
                             f"({fmt.name}: block rows {BR}, global scale {'given' if gscale is not None else 'missing'}"
                             f"{', a prologue' if prologue else ''})")
        if dst.dtype != torch.int64 or dst.shape != (R,) or data.shape[-1] != packed_len(K, elem.bits) or \
                scales.shape[-1] != SC or not (data.is_contiguous() and scales.is_contiguous()):
            raise ValueError(f"quantize_into_rows: rows {tuple(dst.shape)} {dst.dtype}, data "
                             f"{tuple(data.shape)}, scales {tuple(scales.shape)} do not fit [{R}, {K}] in {fmt.name}")
    else:
        data = _p._empty((R, packed_len(K, elem.bits)), torch.uint8, dev)
        zps = _p._empty((SR, SC), torch.uint8, dev) if fmt.zero_point else None
        if lay == 0:
            scales = _p._empty((SR, SC), fmt.scale.storage, dev)
        else:
            rp, cp = layout.padded_shape(SR, SC)
            if (rp, cp) != (SR, SC):  # the padding is zeros
                scales = torch.zeros((rp * cp,), dtype=fmt.scale.storage, device=dev)
            else:
                scales = _p._empty((rp * cp,), fmt.scale.storage, dev)
    skind = _p._scale_kind(fmt)
    scale_arg = scales.view(torch.uint8) if skind < ScaleKind.FP16 else scales
    flags = torch.zeros(2, dtype=torch.int32, device=dev) if nonfinite is NonFinite.ERROR else None
    two = _p._TWO_LEVEL[fmt.two_level] if fmt.global_scale else 0
    dynamic = two != 0 and gscale is None
    dummy = data  # any pointer for unused arguments
    parts, n_part, np_ = dummy, 1, 16
    gs_out = None
    if dynamic:
        if prologue:
            raise NotImplementedError("fused prologues need a static global_scale for two-level formats")
        n = x2.numel()
        BLOCK = 4096
        chunks = cdiv(n, BLOCK)
        iters = next_pow2(cdiv(chunks, _NP_MAX))
        progs = cdiv(chunks, iters)
        # one atomic maximum: each quantize program then reads one word instead of up to _NP_MAX partial maxima
        parts = torch.zeros(1, dtype=torch.int32, device=dev)
        n_part, np_ = 1, 1
        rl.launch(amax_k._finite_amax_partials_kernel, (progs,), x2, parts, n, BLOCK=BLOCK, ITERS=iters,
                  ATOMIC=True, num_warps=8)
        gs_out = torch.empty(2, dtype=torch.float32, device=dev)
    k_per_prog = cdiv(K, cfg.tile_cols) * cfg.tile_cols if prologue == 1 else cfg.tile_cols * cfg.k_tiles
    grid = (cdiv(R, cfg.tile_rows), cdiv(K, k_per_prog))
    ep = _p._element_params(elem, overflow)
    frac_scale = float(2.0 ** elem.frac_bits)
    p32 = _p._pack32(fmt, cfg)
    pdl = _p._pdl_ok(dev)
    rl.launch(quant_k._quantize_kernel, grid,
        x2, dummy if y2 is None else y2, dummy if w is None else w,
        data.view(torch.int32) if p32 else data, scale_arg, dummy if zps is None else zps,
        dummy if gscale is None else gscale, parts, dummy if gs_out is None else gs_out,
        dummy if flags is None else flags, dummy if dest is None else dest[0],
        R, K, x2.stride(0), 0 if y2 is None else y2.stride(0), SC, n_part, k_per_prog, float(eps),
        TR=cfg.tile_rows, TK=cfg.tile_cols, B=B, BR=BR,
        FRAC_SCALE=frac_scale, **ep,
        SCALE_KIND=skind, SCALE_MAX=float(fmt.scale.max) if skind >= ScaleKind.FP16 else 0.0,
        SNAN=_p._scale_nan_bits(fmt),
        SIBITS=fmt.scale.storage.itemsize * 8, RULE=_p._RULES[fmt.scale_rule],
        TWO_LEVEL=two, GS_DYNAMIC=dynamic, NP=np_, LAYOUT=lay,
        ROUNDING=0 if rounding is Rounding.NEAREST_EVEN else 1,
        NONFIN=_p._NONFIN[nonfinite],
        DEFAULT_NAN=_p._DEFAULT_NAN, MUL_NAN_SECOND=_p._MUL_NAN_SECOND, PROLOGUE=prologue,
        N_ITER=k_per_prog // cfg.tile_cols,
        MANUAL_BF16=_p._MANUAL_BF16, PACK32=p32, FAST=True, MARKSTEIN=_p._MARKSTEIN,
        HW_FP8=_p._hw_fp8(elem, rounding, overflow), ASM=_p._ASM,
        PK=pk and p32, PREFETCH=tune.prefetch,  # (a user config whose columns split a word of codes keeps the float32 path)
        EVEN=R % cfg.tile_rows == 0 and K % k_per_prog == 0, PDL=pdl, DST=dest is not None,
        num_warps=cfg.num_warps, enable_fp_fusion=False, **({"launch_pdl": True} if pdl else {}),
    )
    g = None
    if two:
        g = gscale if gscale is not None else gs_out[0]
    return data, scales, zps, g, flags, gs_out


def _raise_flags(flags, fmt: Format, op: str) -> None:
    if flags is None:
        return
    f = flags.tolist()
    if f[0]:
        raise ValueError(f"{op}: x has NaN or Inf (nonfinite='error')")
    if f[1]:
        raise ValueError(f"{fmt.element.name}.encode: input has NaN or Inf (nonfinite='error')")


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
    config: QuantizeConfig | None = None,
) -> QTensor:
    """Quantize with the Triton kernel; arguments as :func:`microscale.quantize`
    (``config`` overrides the tiling). Bit-identical to the reference."""
    op = "quantize"
    fmt, rounding, overflow, nonfinite, xp, gscale = _prepare(
        x, fmt, scale_rule, block_size, rounding, overflow, nonfinite, global_scale, convention, pad, op)
    k = xp.shape[-1]
    x2 = xp.reshape(-1, k)
    data, scales, zps, g, flags, gs_out = _launch(x2, fmt, rounding, overflow, nonfinite, gscale,
                                                  get_scale_layout("row_major"), config)
    _raise_flags(flags, fmt, op)
    meta = {"two_level": fmt.two_level.value} if fmt.global_scale else {}
    if fmt.global_scale and gscale is None and fmt.two_level is TwoLevel.COMPRESSED_TENSORS:
        meta["global_scale_inv"] = float(gs_out[1])  # host sync: the exact stored value goes into meta
    lead = tuple(xp.shape[:-1])
    br = fmt.block_rows
    sshape = (*lead[:-1], lead[-1] // br, k // fmt.block_size) if br > 1 else (*lead, k // fmt.block_size)
    return QTensor(data.reshape(*lead, -1), scales.reshape(sshape), fmt, x.shape, x.dtype,
                   None if g is None else g.reshape(()), None if zps is None else zps.reshape(sshape), meta)


def quantize_into_rows(x2: torch.Tensor, fmt: Format, global_scale: torch.Tensor | None, rows: torch.Tensor,
                       data: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None) -> None:
    """Quantize the rows of ``x2`` ``[R, K]`` in ``fmt`` (nearest-even, saturate, NaN propagated, a static
    ``global_scale`` for two-level formats) and write row ``r``'s codes, scales and zero points to row
    ``rows[r]`` (int64, on the device) of ``data``, ``scales`` (raw storage) and ``zero_points``: one launch,
    no host sync, the bytes :func:`quantize` would return for that row. Used by the paged KV cache.

    ``x2`` is checked and fitted to float32 as :func:`microscale.quantize` does (float64 beyond float32's
    range saturates). The buffers are checked (dtypes, device, widths; ``zero_points`` exactly for formats
    with zero points); row indices are checked against ``data``'s rows when ``rows`` is on the CPU, and
    are the caller's to keep in range on a GPU (checking them there would read them back)."""
    op = "quantize_into_rows"
    x2 = reference._check_input(reference.fit_float32(x2, Overflow.SATURATE), fmt, False, op)
    if x2.dim() != 2:
        raise ValueError(f"{op}: x2 must be [rows, K], got {tuple(x2.shape)}")
    if fmt.zero_point != (zero_points is not None):
        raise ValueError(f"{op}: {fmt.name} {'needs' if fmt.zero_point else 'has no'} zero_points")
    for name, t, dt in (("rows", rows, torch.int64), ("data", data, torch.uint8),
                        ("scales", scales, fmt.scale.storage), ("zero_points", zero_points, torch.uint8)):
        if t is None:
            continue
        if t.dtype != dt:
            raise TypeError(f"{op}: {name} has dtype {t.dtype}; expected {dt}")
        if t.device != x2.device:
            raise ValueError(f"{op}: {name} is on {t.device}, x2 on {x2.device}")
    if rows.device.type == "cpu" and rows.numel() and not (0 <= int(rows.min()) and int(rows.max()) < data.shape[0]):
        raise IndexError(f"{op}: rows span [{int(rows.min())}, {int(rows.max())}]; data has {data.shape[0]} rows")
    if zero_points is not None and (zero_points.shape != scales.shape or not zero_points.is_contiguous()):
        raise ValueError(f"{op}: zero_points {tuple(zero_points.shape)} must be contiguous and shaped as scales "
                         f"{tuple(scales.shape)}")
    _launch(x2 if x2.is_contiguous() else x2.contiguous(), fmt, Rounding.NEAREST_EVEN, Overflow.SATURATE,
            NonFinite.PROPAGATE, global_scale, get_scale_layout("row_major"), None,
            dest=(rows, data, scales, zero_points))
