"""The exact both-quantized matmul on tensor cores (device code: ``_scaled_kernels._scaled_mm_kernel``):
any pair of registered formats whose block sizes nest; bf16 MMAs by default, fp8 MMAs on request
where both operands' unscaled values are exact in one fp8 type and the chunk is >= 32 (fp8
block-128, MXFP8, MXFP4/MXFP6 x MXFP8 E4M3). The kernel reads both operands as they are stored
(:class:`~microscale.linear.scaled.ScaledOperand`: packed codes, raw scale bits): a launch
prepares nothing on the device."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ...formats import Format
from ...formats.elements import ElementCodec
from ...qtensor import QTensor
from ...reference_scaled import OP, chunk_size
from ...runtime import target
from ...runtime.launch import cdiv, launch
from ..packed import format_constexprs
from ..scaled import ScaledOperand, _rebuild, parse_meta, prepare_operand

_KEYS = ("BITS", "IS_FLOAT", "MBITS", "SIGNED", "ELEM_C", "SPECIALS", "INF_MAG", "NAN_MAG", "HAS_ZP",
         "SCALE_KIND", "SB", "GROUP", "GROUP_ROWS")


@functools.lru_cache(maxsize=None)
def operand_constexprs(fmt: Format) -> dict:
    """The kernel's constexprs for one operand's format (NaN/Inf-aware decode whenever its element
    has such codes)."""
    el = fmt.element
    specials = el.kind == "float" and bool(el.nan_codes or el.inf_code is not None)
    ce = format_constexprs(fmt, specials)
    return {k: ce[k] for k in _KEYS}


@dataclass(frozen=True)
class ScaledConfig:
    """Output tile ``block_m x block_n`` (the K step is the chunk: the smaller block size) and
    the MMA's operand type ``fp8``: 0 bf16, 1 e4m3, 2 e5m2 (see :func:`fp8_kind`)."""

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    fp8: int = 0


@functools.lru_cache(maxsize=None)
def _finite_values(el: ElementCodec) -> torch.Tensor:
    """Every finite unscaled value of ``el`` (float64, one per code)."""
    v = el.decode(torch.arange(1 << el.bits, dtype=torch.int32).to(torch.uint8)).to(torch.float64)
    return v[torch.isfinite(v)]


def _exact_in(el: ElementCodec, dtype: torch.dtype) -> bool:
    """Whether every finite unscaled value of ``el`` survives a cast to ``dtype`` (exhaustive)."""
    if el.bits > 8 or el.inf_code is not None and dtype == torch.float8_e4m3fn:
        return False
    v = _finite_values(el)
    return bool(torch.equal(v.to(dtype).to(torch.float64), v))


def fp8_kind(fa: Format, fb: Format) -> int:
    """The fp8 operand type both operands' unscaled values fit exactly (1 e4m3, 2 e5m2), or 0 (bf16):
    affine formats and chunks under 32 (the fp8 MMA's K step) take bf16."""
    if fa.zero_point or fb.zero_point or min(fa.block_size, fb.block_size) < 32:
        return 0
    for kind, dt in ((1, torch.float8_e4m3fn), (2, torch.float8_e5m2)):
        if _exact_in(fa.element, dt) and _exact_in(fb.element, dt):
            return kind
    return 0


def choose_scaled_config(m: int, n: int, fa: Format | None = None, fb: Format | None = None) -> ScaledConfig:
    """Tiles by token count (16 tokens for decode, 64 and 128 beyond), bf16 operands. fp8 operands
    (``ScaledConfig(fp8=fp8_kind(fa, fb))``) are opt-in: on an H200 the fp8 MMA's in-instruction
    sums measured 2e-5 to 1.3e-4 relative error against the oracle, past the 1e-5 bound. 16-row
    tiles need a chunk of >= 32: on an H100, 16 x 16 chunks (NVFP4) gave wrong sums (rel. error 1.4)."""
    fp8 = 0
    chunk = min(fa.block_size, fb.block_size) if fa is not None and fb is not None else 16
    if m <= 16 and chunk >= 32:
        return ScaledConfig(block_m=16, block_n=64, fp8=fp8)
    if m <= 16:
        return ScaledConfig(block_m=64, block_n=64, fp8=fp8)
    if m <= 64:
        return ScaledConfig(block_m=64, block_n=64, fp8=fp8)
    return ScaledConfig(block_m=128, block_n=128, num_warps=8, num_stages=3, fp8=fp8)


#: From this many rows of ``a`` on, operands exact in bf16 (:func:`bf16_exact`) are dequantized and
#: multiplied by cuBLAS: on an H100 at 4096 x 28672 x 8192 the tile kernel took 31-56 ms, cuBLAS 2.8.
DEQUANT_GEMM_M = 256
# bf16 x bf16 -> float32 GEMMs through torch.mm (torch >= 2.8)
_MM_OUT_DTYPE = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 8)


@functools.lru_cache(maxsize=None)
def bf16_exact(fmt: Format) -> bool:
    """Whether every finite element x block-scale product of ``fmt`` is exact in bf16 (exhaustive over
    the element's codes and, for UE4M3 scales, the scale's; power-of-two scales only shift, exactly
    down to bf16's smallest subnormal 2^-133). Affine formats and float32 / float16 / bf16 scales are not."""
    if fmt.zero_point or not (fmt.scale.power_of_two or fmt.scale.name == "ue4m3"):
        return False
    v = _finite_values(fmt.element)
    if fmt.scale.name == "ue4m3":
        raw = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fmt.scale.storage)
        s = fmt.scale.decode(raw).to(torch.float64)
        s = s[torch.isfinite(s) & (s > 0)]
        v = (v[:, None] * s[None, :]).reshape(-1)
    return bool(torch.equal(v.to(torch.bfloat16).to(torch.float64), v))


def dequant_gemm_launch(oa: ScaledOperand, ob: ScaledOperand, bias: torch.Tensor | None,
                        out_dtype: torch.dtype) -> torch.Tensor:
    """``a @ b^T`` for operands exact in bf16 without their global scales: both dequantized to bf16
    (element x block scale, exact), multiplied by cuBLAS (exact products, float32 sums), then
    ``fp32(g_a * g_b)``, bias and one rounding, as the oracle orders them."""
    from ...quant.dequantize import dequantize

    def values(o: ScaledOperand) -> torch.Tensor:
        fmt, shape, _, _ = parse_meta(o.meta)
        unit = None if o.global_scale is None else torch.ones((), dtype=torch.float32, device=o.codes.device)
        q = _rebuild(o.codes, o.scales, unit, o.zero_points, o.meta)
        return dequantize(q, torch.bfloat16)[..., :shape[1]]

    a, b = values(oa), values(ob)
    g = None
    if oa.global_scale is not None or ob.global_scale is not None:
        ga = oa.global_scale if oa.global_scale is not None else 1.0
        gb = ob.global_scale if ob.global_scale is not None else 1.0
        g = (ga * gb).reshape(())
    if g is None and out_dtype == torch.bfloat16 and (bias is None or bias.dtype == torch.bfloat16):
        # cuBLAS adds the bias to the float32 sums and rounds once
        return torch.mm(a, b.T) if bias is None else torch.addmm(bias, a, b.T)
    if not a.is_cuda:  # (CPU, under the interpreter: products of bf16 values are exact in float32 too)
        acc = a.float() @ b.float().T
    elif _MM_OUT_DTYPE:
        acc = torch.mm(a, b.T, out_dtype=torch.float32)
    else:  # torch < 2.8 has no float32 output for bf16 GEMMs: the tile kernel, exact too
        return scaled_exact_launch(oa, ob, bias, out_dtype)
    if g is not None:
        acc.mul_(g)
    if bias is not None:
        acc.add_(bias.to(torch.float32))
    return acc.to(out_dtype)


def scaled_exact_run(a: QTensor, b: QTensor, bias: torch.Tensor | None, out_dtype: torch.dtype,
                     config: ScaledConfig | None = None, out: torch.Tensor | None = None,
                     b_operand: ScaledOperand | None = None) -> torch.Tensor:
    """Launch the kernel for checked operands (``microscale.reference_scaled.check_operands``).
    ``out`` may be passed (tests poison it); ``b_operand`` is b's kept operand
    (:func:`microscale.linear.scaled.weight_operand`)."""
    chunk_size(a, b)
    ob = b_operand if b_operand is not None else prepare_operand(b)
    return scaled_exact_launch(prepare_operand(a), ob, bias, out_dtype, config, out)


def scaled_exact_launch(oa: ScaledOperand, ob: ScaledOperand, bias: torch.Tensor | None, out_dtype: torch.dtype,
                        config: ScaledConfig | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the kernel on prepared operands (whose formats nest: checked by the caller)."""
    from .._kernels import _scaled_kernels as kern

    fa, (m, k), _, _ = parse_meta(oa.meta)
    fb, (n, _), _, _ = parse_meta(ob.meta)
    dev = oa.codes.device
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=dev)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.copy_(torch.zeros((m, n), device=dev) if bias is None else bias.float().expand(m, n))
    kb = min(fa.block_size, fb.block_size)
    c = config if config is not None else choose_scaled_config(m, n, fa, fb)
    if kb < 16 or (c.fp8 and kb < 32):
        raise ValueError(f"{OP}: chunk of {kb} elements; the tensor-core kernel needs blocks of >= 16 "
                         "(>= 32 for fp8 operands)")
    dummy = oa.codes
    za = oa.zero_points if oa.zero_points is not None else dummy
    zb = ob.zero_points if ob.zero_points is not None else dummy
    ce = {f"A_{key}": v for key, v in operand_constexprs(fa).items()}
    ce.update({f"B_{key}": v for key, v in operand_constexprs(fb).items()})
    launch(kern._scaled_mm_kernel, (cdiv(m, c.block_m), cdiv(n, c.block_n)),
           oa.codes, oa.scales, za, oa.global_scale if oa.global_scale is not None else dummy,
           ob.codes, ob.scales, zb, ob.global_scale if ob.global_scale is not None else dummy,
           bias if bias is not None else dummy, out, m, n, k, oa.codes.stride(0), oa.scales.stride(0),
           za.stride(0), ob.codes.stride(0), ob.scales.stride(0), zb.stride(0), out.stride(0),
           **ce, HAS_GA=oa.global_scale is not None, HAS_GB=ob.global_scale is not None, HAS_BIAS=bias is not None,
           KB=kb, CHUNKS=cdiv(k, kb), BLOCK_M=c.block_m, BLOCK_N=c.block_n, FP8=c.fp8, INTERP=target.interpreting(),
           num_warps=c.num_warps, num_stages=c.num_stages)
    return out
