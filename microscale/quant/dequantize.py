"""GPU dequantize for every format (Triton; device code in :mod:`._kernels.dequantize`),
bit-identical to :func:`microscale.reference.dequantize`."""
from __future__ import annotations

import functools

import torch

from ..formats import Overflow, Rounding
from ..formats.kinds import ScaleKind
from ..qtensor import QTensor
from . import params as _p
from . import tuning
from .tuning import QuantizeConfig

__all__ = ["dequantize"]


@functools.cache
def _device():
    """The launcher and the dequantize kernel module: they import Triton, so on first use."""
    from ..runtime import launch
    from ._kernels import dequantize

    return launch, dequantize


def dequantize(q: QTensor, dtype: torch.dtype = torch.float32, config: QuantizeConfig | None = None, *,
               apply_global: bool = True) -> torch.Tensor:
    """Decode ``q`` with the Triton kernel; bit-identical to the reference. ``apply_global=False``
    leaves a two-level format's per-tensor scale out (element x block scale only)."""
    q.validate()  # the kernel addresses scales and zero points by the data's shape: never past their ends
    fmt = q.fmt
    why = _p.unsupported_reason(fmt)
    if why:
        raise NotImplementedError(f"dequantize: {why}")
    rl, deq_k = _device()
    e = fmt.element
    pshape = q.padded_shape
    K = pshape[-1]
    R = q.data.numel() // max(q.data.shape[-1], 1)
    cfg = config or tuning.choose_dequantize_config(fmt, R, K)
    tuning.check_config(cfg, fmt, dequantize=True)
    out = _p._empty(pshape, dtype, q.device)
    skind = _p._scale_kind(fmt)
    scales = q.scales.contiguous()
    scales = scales.view(torch.uint8) if skind < ScaleKind.FP16 else scales
    data = q.data.contiguous()
    nan = sorted(e.nan_codes)
    grid = (rl.cdiv(R, cfg.tile_rows), rl.cdiv(K, cfg.tile_cols))
    g = q.global_scale
    if g is not None:
        g = g.to(device=q.device, dtype=torch.float32).reshape(1)
    p32 = _p._pack32(fmt, cfg) and data.storage_offset() % 4 == 0
    # 4-bit codes into 16-bit outputs: per-block tables and byte permutes (8 entries for
    # sign-magnitude float codes, 16 otherwise); 8-bit codes: the byte path (hardware
    # f8 -> f16 conversion for E4M3fn / E5M2 on the GPU)
    lut = 0
    if e.bits == 4 and p32 and fmt.block_rows == 1 and out.element_size() == 2:
        lut = 8 if e.kind == "float" and e.signed else 16
    hw8 = 0
    if e.bits == 8:
        hw8 = _p._hw_fp8(e, Rounding.NEAREST_EVEN, Overflow.SATURATE) or 3
    even = R % cfg.tile_rows == 0 and K % cfg.tile_cols == 0
    pdl = _p._pdl_ok(q.device)
    rl.launch(deq_k._dequantize_kernel, grid,
        data.view(torch.int32) if p32 else data, scales,
        data if q.zero_points is None else q.zero_points.contiguous(), data if g is None else g,
        out, R, K, K // fmt.block_size,
        TR=cfg.tile_rows, TK=cfg.tile_cols, B=fmt.block_size, BR=fmt.block_rows,
        BITS=e.bits, IS_INT=e.kind == "int", SIGNED=e.signed, STEP=float(2.0 ** -e.frac_bits), MBITS=e.mbits,
        POW=float(2.0 ** (127 - e.bias)), NAN_MIN=nan[0] if nan else -1,
        INF_CODE=e.inf_code if e.has_inf else -1,
        SCALE_KIND=skind, HAS_ZP=fmt.zero_point, HAS_GLOBAL=fmt.global_scale and apply_global, MANUAL_BF16=_p._MANUAL_BF16,
        PACK32=p32, LUT=lut, HW8=hw8, EVEN=even, ASM=_p._ASM,
        KWD=4 if K % 32 == 0 else 2 if K % 16 == 0 else 1 if K % 8 == 0 else 0,
        HINTS=tuning.current().deq_cache_hints, PDL=pdl,
        num_warps=cfg.num_warps, enable_fp_fusion=False, **({"launch_pdl": True} if pdl else {}),
    )
    if tuple(pshape) != tuple(q.shape):
        out = out[tuple(slice(0, n) for n in q.shape)]
    return out
