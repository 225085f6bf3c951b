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


#: From this many rows of ``a`` on, operands exact in bf16 (:func:`bf16_exact`) that no linear kernel
#: takes (:func:`linear_run`) are dequantized and multiplied by cuBLAS: on an H100 (28672 x 8192) that took
#: 384-453 µs from 32 to 256 rows where the tile kernel took 765-2960 µs (16 rows: 388-555 µs against
#: 386-396 µs).
DEQUANT_GEMM_M = 32
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


def exact_values(q: QTensor) -> torch.Tensor:
    """``q``'s element x block-scale values in bf16, its per-tensor scale left out (exact for
    :func:`bf16_exact` formats): the Triton dequantize kernel (CUDA, or the CPU under the interpreter)."""
    from ...quant.dequantize import dequantize

    return dequantize(q, torch.bfloat16, apply_global=False)


def global_product(ga: torch.Tensor | None, gb: torch.Tensor | None) -> torch.Tensor | None:
    """``fp32(g_a * g_b)`` as float32 ``[1]`` (one of them where the other is None; None for neither),
    as the oracle rounds it."""
    if ga is None or gb is None:
        g = ga if gb is None else gb
        return None if g is None else g.reshape(1).to(torch.float32)
    return ga.reshape(1).to(torch.float32) * gb.reshape(1).to(torch.float32)


def dequant_gemm_launch(oa: ScaledOperand, ob: ScaledOperand, bias: torch.Tensor | None,
                        out_dtype: torch.dtype) -> torch.Tensor:
    """``a @ b^T`` for operands exact in bf16 without their global scales: both dequantized to bf16
    (element x block scale, exact), multiplied by cuBLAS (exact products, float32 sums), then
    ``fp32(g_a * g_b)``, bias and one rounding, as the oracle orders them."""
    a, b = (exact_values(_rebuild(o.codes, o.scales, o.global_scale, o.zero_points, o.meta)) for o in (oa, ob))
    g = global_product(oa.global_scale, ob.global_scale)
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


#: Up to this many rows of ``a`` :func:`linear_run` asks the linear op's decode kernels first (then its
#: prefill kernel): on an H100 (28672 x 8192) they streamed the weight at 73-85% of copy bandwidth where
#: the tile kernel reached 4-21%.
DECODE_MAX_M = 64


def linear_choice(a: QTensor, b: QTensor, out_dtype: torch.dtype) -> tuple[str, object]:
    """``(kernel, config)`` of :func:`linear_run` for ``a @ b^T``: ``("decode_tma", None)``,
    ``("gemv_mma", its config)`` or ``("prefill_ws", None)``; ``("", why not)`` where none serves."""
    from ..tuning import get as tuning
    from .decode_tma import decode_tma_reason
    from .gemv_mma import gemv_mma_default_config, gemv_mma_reason
    from .prefill_ws import prefill_ws_reason

    m, k = int(a.shape[0]), int(a.shape[1])
    if out_dtype != torch.bfloat16:
        return "", f"writes bfloat16 (the linear kernels' output), not {out_dtype}"
    if not (bf16_exact(a.fmt) and bf16_exact(b.fmt)):
        return "", "needs both formats' element x block-scale values exact in bf16"
    if m < 1:
        return "", "has no rows of a"
    if not (a.data.is_cuda and b.data.is_cuda):
        return "", "needs CUDA operands"
    probe = torch.empty((m, k), dtype=torch.bfloat16, device=a.data.device)  # (a's values: aligned, contiguous)
    whys = []
    if m <= DECODE_MAX_M:
        why = decode_tma_reason(b, probe)
        if why is None:
            return "decode_tma", None
        cfg = gemv_mma_default_config(b, probe)
        why2 = "has no config for this shape" if cfg is None else gemv_mma_reason(b, probe, cfg)
        if why2 is None:
            return "gemv_mma", cfg
        whys += [f"decode_tma {why}", f"gemv_mma {why2}"]
    why = prefill_ws_reason(b, probe) if tuning().prefill_ws else "is off (tuning.prefill_ws)"
    if why is None:
        return "prefill_ws", None
    return "", "; ".join(whys + [f"prefill_ws {why}"])


def linear_run(a: QTensor, b: QTensor, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor | None:
    """``a @ b^T`` through the linear op's exact tensor-core kernels (``decode_tma`` or ``gemv_mma`` for
    few rows, ``prefill_ws`` beyond; each: products exact, float32 sums, one rounding after bias): a's
    bf16 values without its global scale (:func:`exact_values`) times b's, the sums times
    ``fp32(g_a * g_b)`` in place of b's global scale. None where none serves (:func:`linear_choice`);
    b's tables are kept in its state as the linear op keeps them."""
    from .decode_tma import decode_tma_run
    from .gemv_mma import gemv_mma_run
    from .prefill_ws import prefill_ws_run

    kernel, cfg = linear_choice(a, b, out_dtype)
    if not kernel:
        return None
    x = exact_values(a)
    g = global_product(a.global_scale, b.global_scale)
    if kernel == "decode_tma":
        return decode_tma_run(x, b, bias, global_scale=g)
    if kernel == "gemv_mma":
        return gemv_mma_run(x, b, bias, cfg, global_scale=g)
    return prefill_ws_run(x, b, bias, global_scale=g)


def scaled_exact_run(a: QTensor, b: QTensor, bias: torch.Tensor | None, out_dtype: torch.dtype,
                     config: ScaledConfig | None = None, out: torch.Tensor | None = None,
                     b_operand: ScaledOperand | None = None) -> torch.Tensor:
    """Launch the kernel for checked operands (``microscale.reference_scaled.check_operands``).
    ``out`` may be passed (tests poison it); ``b_operand`` is b's kept operand
    (:func:`microscale.linear.scaled.weight_operand`)."""
    chunk_size(a, b)
    ob = b_operand if b_operand is not None else prepare_operand(b)
    return scaled_exact_launch(prepare_operand(a), ob, bias, out_dtype, config, out)


def launch_output(oa: ScaledOperand, ob: ScaledOperand, bias: torch.Tensor | None, out_dtype: torch.dtype,
                  out: torch.Tensor | None) -> tuple[Format, Format, tuple[int, int, int], torch.Tensor, bool]:
    """What a kernel launch on prepared operands starts from: both formats, ``(M, N, K)`` and the output
    (``out`` or a new one); ``done`` when nothing is left to launch (an empty output, or K = 0: bias or zeros
    written)."""
    fa, (m, k), _, _ = parse_meta(oa.meta)
    fb, (n, _), _, _ = parse_meta(ob.meta)
    dev = oa.codes.device
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=dev)
    done = m == 0 or n == 0 or k == 0
    if k == 0 and not (m == 0 or n == 0):
        out.copy_(torch.zeros((m, n), device=dev) if bias is None else bias.float().expand(m, n))
    return fa, fb, (m, n, k), out, done


def scaled_exact_launch(oa: ScaledOperand, ob: ScaledOperand, bias: torch.Tensor | None, out_dtype: torch.dtype,
                        config: ScaledConfig | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the kernel on prepared operands (whose formats nest: checked by the caller)."""
    from .._kernels import _scaled_kernels as kern

    fa, fb, (m, n, k), out, done = launch_output(oa, ob, bias, out_dtype, out)
    if done:
        return out
    dev = oa.codes.device
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
