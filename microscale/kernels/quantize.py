"""GPU quantize / dequantize for every format (Triton; kernels in ``_quantize_kernels``).

Public functions:

* :func:`quantize` — same signature and bit-identical results as
  :func:`microscale.reference.quantize` (except ``rounding='stochastic'``, which cannot
  reproduce the CPU generator's draws: callers fall back to the reference, see
  :func:`unsupported_reason`). Returns a :class:`~microscale.QTensor` with row-major scales.
* :func:`quantize_for_gemm` — the same quantization with the scales written by the
  kernel directly in a GEMM layout (``swizzled_128x4`` for cuBLAS/CUTLASS block-scaled
  GEMMs and tcgen05, ``swizzled_8x4``, or ``row_major``): returns a
  :class:`GemmQuantized` (packed codes, flat scales, global scale). Its scales equal
  ``get_scale_layout(layout).swizzle(reference scales)``.
* :func:`dequantize` — bit-identical to :func:`microscale.reference.dequantize`.

No host synchronisation on the hot path: the dynamic NVFP4 per-tensor amax is reduced
on the GPU into per-program partial maxima that the quantize kernel reads. Exceptions:
``nonfinite='error'`` (reads an error flag back to raise), and dynamic two-level
quantization under the ``compressed-tensors`` convention (its exact reciprocal global
scale goes into ``QTensor.meta`` as a Python float). A static ``global_scale`` given as
a CUDA tensor is not range-checked (that would synchronise); numbers and CPU tensors are.

Format fields become kernel constexprs in :class:`_Params` — no per-format code.
Tiling lives in :class:`QuantizeConfig`, chosen by :func:`choose_config` and overridable.
"""
from __future__ import annotations

import functools
import os
import struct
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

import torch

from .. import reference
from ..formats import (
    ElementCodec, Format, NonFinite, Overflow, Rounding, ScaleLayout, ScaleRule, TwoLevel, get_scale_layout,
    packed_len,
)
from ..formats.elements import _enum
from ..qtensor import QTensor
from . import _quantize_kernels as _k
from ..runtime.launch import cdiv, launch, next_pow2, pdl_capable

__all__ = ["QuantizeConfig", "choose_config", "choose_dequantize_config", "GemmQuantized", "quantize", "quantize_for_gemm", "dequantize",
           "unsupported_reason"]


def _empty(shape, dtype, device) -> torch.Tensor:
    """Allocation of every kernel output (tests replace it to poison outputs)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _f32_bits(v: float) -> int:
    return struct.unpack("<i", struct.pack("<f", v))[0]


def _host_default_nan() -> int:
    """Bits (as int32) of the NaN the host CPU's float32 vector division 0/0 returns:
    the reference runs there, and the sign of such a NaN decides an element code."""
    z = torch.zeros(64, dtype=torch.float32)
    return int((z / z).view(torch.int32)[0])


def _host_mul_nan_second() -> bool:
    """Whether the host's ``x * m`` (m broadcast over a block) keeps m's NaN when both
    are NaN (the compiler may commute the multiply; seen: it does on x86)."""
    a = torch.full((4, 16), -float("nan"))
    b = torch.full((4, 1), float("nan"))
    return bool(((a * b).view(torch.int32) >= 0).all())


_DEFAULT_NAN = _host_default_nan()
_MUL_NAN_SECOND = _host_mul_nan_second()
# The interpreter's float32 -> bf16 cast does not round to nearest even: round on the bits.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
_MANUAL_BF16 = _INTERPRET
# Markstein division on the fast path needs a single-rounding fma (the interpreter rounds twice)
_MARKSTEIN = not _INTERPRET
# PTX inline assembly (the interpreter cannot run it) where it pins an instruction choice
_ASM = not _INTERPRET
# the packed bf16 path of the quantize kernel (``_packed_bf16``); off: the float32 path
_PACKED = os.environ.get("MICROSCALE_QUANT_PACKED", "1") == "1"
# dequantize's streaming cache hints (evict-first code loads, .cs stores) on whole tiles: H200
# +2-3% of copy (sweep); the same hints gave quantize nothing (+-1%) and were dropped there
_DEQ_HINTS = os.environ.get("MICROSCALE_DEQ_CACHE_HINTS", "1") == "1"
# the packed path's programs that loop over column tiles load the next tile before encoding
# the current one (``PREF`` in the kernel)
_PREFETCH = os.environ.get("MICROSCALE_QUANT_PREFETCH", "1") == "1"
# the quantize / dequantize kernels launched as programmatic dependents on Hopper+ (each
# waits for the previous kernel before any read; dequantize also lets the next kernel
# launch early, hiding launch and ramp between kernels: ``_k._pdl_start``)
_PDL = os.environ.get("MICROSCALE_QUANT_PDL", "1") == "1" and not _INTERPRET


def _pdl_ok(dev: torch.device) -> bool:
    """Whether the quantize / dequantize kernels launch as programmatic dependents on ``dev``."""
    return _PDL and pdl_capable(dev)


_RULES = {ScaleRule.FLOOR: 0, ScaleRule.CEIL: 1, ScaleRule.EVEN: 2, ScaleRule.RCEIL: 3, ScaleRule.AMAX: 4,
          ScaleRule.MINMAX: 5}
_TWO_LEVEL = {TwoLevel.MODELOPT: 1, TwoLevel.TORCHAO: 2, TwoLevel.COMPRESSED_TENSORS: 3}
_NP_MAX = 1024  # most partial maxima of the global amax reduction


# ----------------------------------------------------------------------------------
# format -> constexprs
# ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _element_params(e: ElementCodec, overflow: Overflow) -> MappingProxyType:
    if e.kind == "float":
        nan = sorted(e.nan_codes)
        top = (1 << (e.bits - 1)) - 1
        if nan and nan != list(range(nan[0], top + 1)):
            raise NotImplementedError(f"{e.name}: NaN codes must be the top magnitude codes for the kernels")
    if overflow is Overflow.NATIVE and e.kind == "float":
        ovf = e.inf_code if e.has_inf else (e.nan_codes[0] if e.has_nan else e.max_code)
    else:
        ovf = e.max_code
    sub_c = 2.0 ** (e.emin - e.mbits + 23)
    return MappingProxyType(dict(  # cached: read-only
        BITS=e.bits, IS_INT=e.kind == "int", SIGNED=e.signed, MBITS=e.mbits, BIAS=e.bias, MAX_CODE=e.max_code,
        NAN_CODE=e.nan_codes[0] if e.has_nan else -1, OVF_CODE=ovf, MIN_NORMAL=float(e.min_normal),
        SUB_C=sub_c, SUB_C_BITS=_f32_bits(sub_c), INV_MIN_SUB=float(1.0 / e.min_subnormal),
        ELEM_MAX=float(e.max), EMAX=e.emax, M_ELEM=e.mbits if e.kind == "float" else e.frac_bits,
    ))


def _scale_kind(fmt: Format) -> int:
    if fmt.scale.power_of_two:
        return 0
    if fmt.scale.storage == torch.float8_e4m3fn:
        return 1
    return 2


@functools.lru_cache(maxsize=256)
def _scale_nan_bits(fmt: Format) -> int:
    """Bits (signed int of the storage width) of the host's NaN cast to the scale dtype."""
    st = fmt.scale.storage
    if not st.is_floating_point or st.itemsize == 1:
        return 0
    ity = torch.int16 if st.itemsize == 2 else torch.int32
    return int(torch.tensor(float("nan"), dtype=torch.float32).to(st).view(ity))


def _layout_code(layout: ScaleLayout) -> int:
    if not layout.tile_rows:
        return 0
    if layout.tile_cols == 4 and layout.tile_rows == 128 and layout.sub_rows == 32:
        return 1
    if layout.tile_cols == 4 and layout.tile_rows == 8 and not layout.sub_rows:
        return 2
    raise NotImplementedError(f"scale layout {layout.name!r} has no kernel support")


def _hw_fp8(e: ElementCodec, rounding: Rounding, overflow: Overflow) -> int:
    """1 / 2 when the GPU's ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` computes this codec's
    encode exactly (RNE, saturate; NaN-free tiles): E4M3fn / E5M2 by their fields."""
    if _INTERPRET or rounding is not Rounding.NEAREST_EVEN or overflow is not Overflow.SATURATE:
        return 0
    if e.kind != "float" or e.bits != 8:
        return 0
    if (e.ebits, e.mbits, e.bias, tuple(e.nan_codes), e.inf_code) == (4, 3, 7, (0x7F,), None):
        return 1
    if (e.ebits, e.mbits, e.bias, e.inf_code) == (5, 2, 15, 0x7C):
        return 2
    return 0


def _packed_bf16(x2: torch.Tensor, fmt: Format, rounding: Rounding, overflow: Overflow, nonfinite: NonFinite,
                 prologue: int) -> bool:
    """The quantize kernel's packed path (``PK``): bf16 input read as int32 words of two
    elements, encoded two per 32-bit operation (``_encode_p2_bf16x2``). For 4-bit float
    elements with an E8M0 (power-of-two) scale or the two-level NVFP4 scheme, RNE and
    saturation, NaN propagation, whole blocks of 16 or 32 elements in 4-byte aligned rows;
    everything else keeps the float32 path."""
    e = fmt.element
    scale_ok = (fmt.scale.power_of_two and _RULES[fmt.scale_rule] <= 3) if not fmt.global_scale else \
        fmt.two_level in _TWO_LEVEL
    return (x2.dtype == torch.bfloat16 and prologue == 0 and fmt.block_rows == 1 and scale_ok
            and e.kind == "float" and e.bits == 4 and e.signed and rounding is Rounding.NEAREST_EVEN
            and (overflow is Overflow.SATURATE or _element_params(e, overflow)["OVF_CODE"] == e.max_code)
            and nonfinite is NonFinite.PROPAGATE and fmt.block_size in (16, 32)
            and x2.shape[1] % fmt.block_size == 0 and x2.stride(0) % 2 == 0 and x2.data_ptr() % 4 == 0)


def _pack32(fmt: Format, cfg: QuantizeConfig) -> bool:
    """Codes go through int32 words when 32 bits hold whole codes and whole blocks."""
    bits = fmt.element.bits
    return 32 % bits == 0 and (fmt.block_size * bits) % 32 == 0 and (cfg.tile_cols * bits) % 32 == 0


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def unsupported_reason(fmt: Format, rounding: Rounding | str = Rounding.NEAREST_EVEN) -> str | None:
    """Why the kernels can't run this format/rounding (the caller falls back to the
    reference), or ``None``."""
    rounding = _enum(Rounding, rounding, "rounding")
    if rounding is Rounding.STOCHASTIC:
        return "stochastic rounding follows the CPU generator's draws (reference only)"
    if not _pow2(fmt.block_size) or not _pow2(fmt.block_rows):
        return f"block {fmt.block_rows}x{fmt.block_size} is not a power of two"
    if fmt.element.bits % 8 and 8 % fmt.element.bits and fmt.block_size < 8:
        return "odd-width codes need blocks of at least 8"
    if fmt.global_scale and fmt.scale_rule is ScaleRule.MINMAX:
        return "two-level affine formats are not supported"
    return None


# ----------------------------------------------------------------------------------
# tiling
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuantizeConfig:
    """Tile of one program: ``tile_rows`` x ``tile_cols`` elements (powers of two;
    ``tile_rows`` a multiple of the format's block rows, ``tile_cols`` of its block size)."""

    tile_rows: int
    tile_cols: int
    num_warps: int = 4
    #: quantize only: column tiles one program loops over (amortizes its fixed work; the fused
    #: RMSNorm quantizer always loops over whole rows)
    k_tiles: int = 1


@functools.lru_cache(maxsize=1024)
def choose_config(fmt: Format, rows: int, k: int, packed: bool = False) -> QuantizeConfig:
    """Tiling heuristic, from the H200 sweeps (16384^2 bf16, best of 3 interleaved rounds;
    ``benchmarks/h200_2026-12-01c/sweep5.log``): few rows and wide columns move memory best.

    * The packed bf16 path (``packed``) for MXFP4 and one-level 8-bit float formats: 4K
      elements per program on 4 warps, up to 2048 columns (2 x 2048). MXFP4 0.98-1.02 of
      copy (16 x 256: 0.85), MXFP8 0.96-0.98 (0.87-0.89).
    * The packed path for the two-level NVFP4: 1 x 1024 on one warp (its per-tile "all
      blocks clean" vote is then one warp reduction), each program looping over up to 4
      such tiles along the row (``k_tiles``) with the next tile prefetched: 0.99-1.01 of
      copy at 16384^2, 0.88-0.90 at 8192^2 (one tile per program 0.89-0.92 / 0.83-0.86;
      2 x 2048 on 4 warps: 0.83; ``h200_2026-12-01d/sweep*.log``).
    * Everything else (the float32 path): 16 x 256 on 4 warps, as measured for it before.
    """
    b, br = fmt.block_size, fmt.block_rows
    e = fmt.element
    if packed and fmt.global_scale:  # NVFP4: one warp, 1 x 1024, up to 4 tiles per program
        tk = max(b, min(1024, next_pow2(k)))
        nt = cdiv(k, tk)
        kt = next(t for t in (4, 2, 1) if nt % t == 0)  # (whole spans: no masked tiles)
        return QuantizeConfig(max(1, min(next_pow2(max(rows, 1)), 1024 // tk)), tk, 1, kt)
    wide = br == 1 and (packed or (not fmt.global_scale and e.kind == "float" and e.bits == 8))
    tk = max(b, min(2048 if wide else 256, next_pow2(k)))
    tr = max(br, min(next_pow2(max(rows, 1)), 4096 // tk))
    return QuantizeConfig(tr, tk, _warps(tr * tk, 8 if tr * tk > 8192 else 4))


def _warps(elements: int, warps: int) -> int:
    """``warps``, halved while a thread would get fewer than 4 of a (small) tile's elements."""
    while warps > 1 and elements < 128 * warps:
        warps //= 2
    return warps


@functools.lru_cache(maxsize=1024)
def choose_dequantize_config(fmt: Format, rows: int, k: int) -> QuantizeConfig:
    """Dequantize tiling: 8K elements per program on 4 warps, up to 2048 columns (4 x 2048)
    for 1-row blocks; 2-D blocks 16 x 512 (32 x 1024 for 8-bit codes) on 8 warps. From the
    H200 sweep (``benchmarks/h200_2026-12-01c/sweep5.log``, 16384^2 -> bf16, cache hints on):
    NVFP4 / MXFP4 / MXFP8 0.908 / 0.906 / 0.916 of copy at 4 x 2048 against 0.883 / 0.891 /
    0.910 at the earlier 16 x 512 (32 x 1024)."""
    b, br = fmt.block_size, fmt.block_rows
    if br == 1:
        tk = max(b, min(2048, next_pow2(k)))
        tr = max(1, min(next_pow2(max(rows, 1)), 8192 // tk))
        return QuantizeConfig(tr, tk, _warps(tr * tk, 8 if tr * tk > 8192 else 4))
    wide = fmt.element.bits == 8
    tk = max(b, min(1024 if wide else 512, next_pow2(k)))
    tr = max(br, min(next_pow2(max(rows, 1)), (32768 if wide else 8192) // tk))
    return QuantizeConfig(tr, tk, _warps(tr * tk, 8 if tr * tk >= 8192 else 4))


def _check_config(cfg: QuantizeConfig, fmt: Format, dequantize: bool = False) -> None:
    if not (_pow2(cfg.tile_rows) and _pow2(cfg.tile_cols)) or cfg.tile_rows % fmt.block_rows or \
            cfg.tile_cols % max(fmt.block_size, 8):
        raise ValueError(f"config {cfg} does not tile {fmt.name} blocks of {fmt.block_rows}x{fmt.block_size}")
    if cfg.k_tiles < 1 or (dequantize and cfg.k_tiles != 1):
        raise ValueError(f"config {cfg}: k_tiles must be >= 1 (and 1 for dequantize)")


# ----------------------------------------------------------------------------------
# quantize
# ----------------------------------------------------------------------------------


class GemmQuantized(NamedTuple):
    """Kernel-level quantize output for block-scaled GEMMs."""

    data: torch.Tensor  #: packed codes ``[..., K*bits/8]`` (uint8, canonical packing)
    scales: torch.Tensor  #: flat scales in ``layout`` (storage dtype of the scale codec)
    global_scale: torch.Tensor | None  #: float32 0-d decode multiplier (two-level formats)
    layout: str  #: the scale layout's name
    rows: int  #: rows of the (row-major) scale matrix
    cols: int  #: columns of the (row-major) scale matrix


def _prepare(x, fmt, scale_rule, block_size, rounding, overflow, nonfinite, global_scale, convention, pad,
             op="quantize"):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a torch.Tensor, got {type(x).__name__}")
    fmt = reference.resolve_format(fmt, block_size, scale_rule, convention)
    rounding = _enum(Rounding, rounding, "rounding")
    overflow = _enum(Overflow, overflow, "overflow")
    nonfinite = _enum(NonFinite, nonfinite, "nonfinite")
    why = unsupported_reason(fmt, rounding)
    if why:
        raise NotImplementedError(f"{op}: {why}")
    if global_scale is not None and not fmt.global_scale:
        raise ValueError(f"{op}: global_scale applies only to two-level formats, not {fmt.name!r}")
    xp = reference._check_input(x, fmt, pad, op)
    gscale = None
    if fmt.global_scale and global_scale is not None:
        if not isinstance(global_scale, torch.Tensor) or not global_scale.is_cuda:
            g = float(global_scale)
            if not (0 < g < float("inf")):
                raise ValueError(f"{op}: global_scale={g} must be finite and > 0")
            # a fill kernel, not a host-to-device copy, so the call can be captured in a CUDA graph
            gscale = torch.full((), g, dtype=torch.float32, device=x.device)
        else:
            gscale = global_scale.to(device=x.device, dtype=torch.float32).reshape(())
    return fmt, rounding, overflow, nonfinite, xp, gscale


_NONFIN = {NonFinite.PROPAGATE: 0, NonFinite.ZERO: 1, NonFinite.ERROR: 2}


def _launch(x2: torch.Tensor, fmt: Format, rounding: Rounding, overflow: Overflow, nonfinite: NonFinite,
            gscale: torch.Tensor | None, layout: ScaleLayout, config: QuantizeConfig | None,
            prologue: int = 0, y2: torch.Tensor | None = None, w: torch.Tensor | None = None, eps: float = 0.0):
    """Run the quantize kernel on a 2-D ``[R, K]`` input (whole blocks).
    Returns (data, scales, zero_points, global scale or None, flags or None)."""
    dev = x2.device
    if not x2.is_contiguous():  # the global-amax pass reads x flat
        x2 = x2.contiguous()
    if y2 is not None and not y2.is_contiguous():
        y2 = y2.contiguous()
    R, K = x2.shape
    elem, B, BR = fmt.element, fmt.block_size, fmt.block_rows
    pk = _PACKED and _packed_bf16(x2, fmt, rounding, overflow, nonfinite, prologue)
    cfg = config or choose_config(fmt, R, K, packed=pk)
    _check_config(cfg, fmt)
    SR, SC = R // BR, K // B
    data = _empty((R, packed_len(K, elem.bits)), torch.uint8, dev)
    lay = _layout_code(layout)
    if lay == 0:
        scales = _empty((SR, SC), fmt.scale.storage, dev)
    else:
        rp, cp = layout.padded_shape(SR, SC)
        if (rp, cp) != (SR, SC):  # the padding is zeros
            scales = torch.zeros((rp * cp,), dtype=fmt.scale.storage, device=dev)
        else:
            scales = _empty((rp * cp,), fmt.scale.storage, dev)
    skind = _scale_kind(fmt)
    scale_arg = scales.view(torch.uint8) if skind < 2 else scales
    zps = _empty((SR, SC), torch.uint8, dev) if fmt.zero_point else None
    flags = torch.zeros(2, dtype=torch.int32, device=dev) if nonfinite is NonFinite.ERROR else None
    two = _TWO_LEVEL[fmt.two_level] if fmt.global_scale else 0
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
        # one atomic maximum: each quantize program then reads one word instead of up to
        # _NP_MAX partial maxima (2.5 SASS instructions per element at 16 x 256 tiles)
        parts = torch.zeros(1, dtype=torch.int32, device=dev)
        n_part, np_ = 1, 1
        launch(_k._finite_amax_partials_kernel, (progs,), x2, parts, n, BLOCK=BLOCK, ITERS=iters, ATOMIC=True,
               num_warps=8)
        gs_out = torch.empty(2, dtype=torch.float32, device=dev)
    k_per_prog = cdiv(K, cfg.tile_cols) * cfg.tile_cols if prologue == 1 else cfg.tile_cols * cfg.k_tiles
    grid = (cdiv(R, cfg.tile_rows), cdiv(K, k_per_prog))
    ep = _element_params(elem, overflow)
    frac_scale = float(2.0 ** elem.frac_bits)
    p32 = _pack32(fmt, cfg)
    pdl = _pdl_ok(dev)
    launch(_k._quantize_kernel, grid,
        x2, dummy if y2 is None else y2, dummy if w is None else w,
        data.view(torch.int32) if p32 else data, scale_arg, dummy if zps is None else zps,
        dummy if gscale is None else gscale, parts, dummy if gs_out is None else gs_out,
        dummy if flags is None else flags,
        R, K, x2.stride(0), 0 if y2 is None else y2.stride(0), SC, n_part, k_per_prog, float(eps),
        TR=cfg.tile_rows, TK=cfg.tile_cols, B=B, BR=BR,
        FRAC_SCALE=frac_scale, **ep,
        SCALE_KIND=skind, SCALE_MAX=float(fmt.scale.max) if skind == 2 else 0.0, SNAN=_scale_nan_bits(fmt),
        SIBITS=fmt.scale.storage.itemsize * 8, RULE=_RULES[fmt.scale_rule],
        TWO_LEVEL=two, GS_DYNAMIC=dynamic, NP=np_, LAYOUT=lay,
        ROUNDING=0 if rounding is Rounding.NEAREST_EVEN else 1,
        NONFIN=_NONFIN[nonfinite],
        DEFAULT_NAN=_DEFAULT_NAN, MUL_NAN_SECOND=_MUL_NAN_SECOND, PROLOGUE=prologue, N_ITER=k_per_prog // cfg.tile_cols,
        MANUAL_BF16=_MANUAL_BF16, PACK32=p32, FAST=True, MARKSTEIN=_MARKSTEIN,
        HW_FP8=_hw_fp8(elem, rounding, overflow), ASM=_ASM,
        PK=pk and p32, PREFETCH=_PREFETCH,  # (a user config whose columns split a word of codes keeps the float32 path)
        EVEN=R % cfg.tile_rows == 0 and K % k_per_prog == 0, PDL=pdl,
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
    fmt: str | Format,
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


def quantize_for_gemm(
    x: torch.Tensor,
    fmt: str | Format,
    *,
    scale_layout: str | ScaleLayout = "swizzled_128x4",
    scale_rule: str | ScaleRule | None = None,
    block_size: int | None = None,
    rounding: str | Rounding = Rounding.NEAREST_EVEN,
    overflow: str | Overflow = Overflow.SATURATE,
    nonfinite: str | NonFinite = NonFinite.PROPAGATE,
    global_scale: float | torch.Tensor | None = None,
    convention: str | TwoLevel | None = None,
    pad: bool = False,
    config: QuantizeConfig | None = None,
) -> GemmQuantized:
    """Quantize ``x`` (rows = all leading dims) with the scales written directly in
    ``scale_layout``. Affine formats are not GEMM operands here (zero points)."""
    op = "quantize_for_gemm"
    layout = get_scale_layout(scale_layout)
    fmt, rounding, overflow, nonfinite, xp, gscale = _prepare(
        x, fmt, scale_rule, block_size, rounding, overflow, nonfinite, global_scale, convention, pad, op)
    if fmt.zero_point:
        raise ValueError(f"{op}: affine format {fmt.name!r} has zero points; use quantize()")
    k = xp.shape[-1]
    x2 = xp.reshape(-1, k)
    data, scales, _, g, flags, _ = _launch(x2, fmt, rounding, overflow, nonfinite, gscale, layout, config)
    _raise_flags(flags, fmt, op)
    if not layout.tile_rows:
        scales = scales.reshape(-1)
    return GemmQuantized(data.reshape(*xp.shape[:-1], -1), scales, None if g is None else g.reshape(()),
                         layout.name, x2.shape[0] // fmt.block_rows, k // fmt.block_size)


# ----------------------------------------------------------------------------------
# dequantize
# ----------------------------------------------------------------------------------


# Dequantize stores through Triton's shared-memory layout conversion (one 16-byte vector
# per lane: coalesced). True: each thread stores its decoded bytes straight from its
# registers (st.global.v4); measured on the H200 at 0.45-0.70 of copy against 0.85-0.86 for
# 4-bit codes (uncoalesced: 64 contiguous bytes per thread), kept as a DEQ_SWEEP variant.
_DEQ_REG_STORE = os.environ.get("MICROSCALE_DEQ_REG_STORE", "0") == "1"


def dequantize(q: QTensor, dtype: torch.dtype = torch.float32, config: QuantizeConfig | None = None) -> torch.Tensor:
    """Decode ``q`` with the Triton kernel; bit-identical to the reference."""
    q.validate()  # the kernel addresses scales and zero points by the data's shape: never past their ends
    fmt = q.fmt
    why = unsupported_reason(fmt)
    if why:
        raise NotImplementedError(f"dequantize: {why}")
    e = fmt.element
    pshape = q.padded_shape
    K = pshape[-1]
    R = q.data.numel() // max(q.data.shape[-1], 1)
    cfg = config or choose_dequantize_config(fmt, R, K)
    _check_config(cfg, fmt, dequantize=True)
    out = _empty(pshape, dtype, q.device)
    skind = _scale_kind(fmt)
    scales = q.scales.contiguous()
    scales = scales.view(torch.uint8) if skind < 2 else scales
    data = q.data.contiguous()
    nan = sorted(e.nan_codes)
    grid = (cdiv(R, cfg.tile_rows), cdiv(K, cfg.tile_cols))
    g = q.global_scale
    if g is not None:
        g = g.to(device=q.device, dtype=torch.float32).reshape(1)
    p32 = _pack32(fmt, cfg) and data.storage_offset() % 4 == 0
    # 4-bit codes into 16-bit outputs: per-block tables and byte permutes (8 entries for
    # sign-magnitude float codes, 16 otherwise); 8-bit codes: the byte path (hardware
    # f8 -> f16 conversion for E4M3fn / E5M2 on the GPU)
    lut = 0
    if e.bits == 4 and p32 and fmt.block_rows == 1 and out.element_size() == 2:
        lut = 8 if e.kind == "float" and e.signed else 16
    hw8 = 0
    if e.bits == 8:
        hw8 = _hw_fp8(e, Rounding.NEAREST_EVEN, Overflow.SATURATE) or 3
    even = R % cfg.tile_rows == 0 and K % cfg.tile_cols == 0
    pdl = _pdl_ok(q.device)
    launch(_k._dequantize_kernel, grid,
        data.view(torch.int32) if p32 else data, scales, data if q.zero_points is None else q.zero_points.contiguous(), data if g is None else g,
        out, R, K, K // fmt.block_size,
        TR=cfg.tile_rows, TK=cfg.tile_cols, B=fmt.block_size, BR=fmt.block_rows,
        BITS=e.bits, IS_INT=e.kind == "int", SIGNED=e.signed, STEP=float(2.0 ** -e.frac_bits), MBITS=e.mbits,
        POW=float(2.0 ** (127 - e.bias)), NAN_MIN=nan[0] if nan else -1,
        INF_CODE=e.inf_code if e.has_inf else -1,
        SCALE_KIND=skind, HAS_ZP=fmt.zero_point, HAS_GLOBAL=fmt.global_scale, MANUAL_BF16=_MANUAL_BF16,
        PACK32=p32, LUT=lut, HW8=hw8, EVEN=even, ASM=_ASM, KWD=4 if K % 32 == 0 else 2 if K % 16 == 0 else 1 if K % 8 == 0 else 0,
        SMEM_STORE=not _DEQ_REG_STORE, HINTS=_DEQ_HINTS, PDL=pdl,
        num_warps=cfg.num_warps, enable_fp_fusion=False, **({"launch_pdl": True} if pdl else {}),
    )
    if tuple(pshape) != tuple(q.shape):
        out = out[tuple(slice(0, n) for n in q.shape)]
    return out
