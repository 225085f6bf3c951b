"""The both-quantized matmul: ``scaled_mm(a, b)`` = ``a @ b^T`` for QTensors ``a`` ``[M, K]`` and
``b`` ``[N, K]`` (both block-scaled along K), its ``torch.library`` registration, and the linear op
with quantized activations (``ms.linear(x, w, act_format=...)``).

Numerics are the oracle's (:mod:`microscale.reference_scaled`; docs/scaled-mm.md): every product
exact, float32 sums per chunk of the smaller block size, chunk sums scaled by the product of the two
block scales and accumulated in float32 in K order, global scales after the last chunk. On CUDA the
backends of :mod:`.backends.scaled_exact` run it (every one with exact products and float32 sums);
elsewhere the oracle does.

Both operands reach the kernel as they are stored (:class:`ScaledOperand`: packed codes, raw scale
bits; views, no copies). The weight's operand is made once per weight version and kept in its
:class:`~microscale.linear.weight_state.WeightState` (:func:`weight_operand`), as the linear op
keeps its packed weight; so is a static activation scale (:func:`activation_scale`).
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import torch

from ..formats import Format, get_format
from ..qtensor import QTensor
from ..reference_scaled import OUT_DTYPES, check_operands, scaled_mm_reference
from .packed import fmt_json
from .weight_state import INT_VIEW, state

__all__ = ["scaled_mm", "ScaledOperand", "prepare_operand", "weight_operand", "activation_scale",
           "quantize_activation", "linear_act"]

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


@dataclass(frozen=True)
class ScaledOperand:
    """One operand as the kernel reads it, all on the operand's device: ``codes`` the QTensor's
    packed codes (uint8 ``[rows, bytes]``), ``scales`` its raw block scales viewed as an integer of
    their width ``[block rows, blocks]``, ``zero_points`` (uint8) or None, ``global_scale`` float32
    ``[1]`` or None, and ``meta`` (JSON: format, shape, dtype and QTensor meta) for the custom op."""

    codes: torch.Tensor
    scales: torch.Tensor
    zero_points: torch.Tensor | None
    global_scale: torch.Tensor | None
    meta: str


def _meta(q: QTensor) -> str:
    return (f'{{"fmt": {fmt_json(q.fmt)}, "shape": [{", ".join(str(int(s)) for s in q.shape)}], '
            f'"dtype": "{str(q.dtype).removeprefix("torch.")}", "meta": {json.dumps(q.meta)}}}')


@functools.lru_cache(maxsize=1024)
def parse_meta(meta: str) -> tuple[Format, tuple[int, ...], torch.dtype, dict]:
    """``(format, shape, dtype, QTensor meta)`` of a :attr:`ScaledOperand.meta` (parsed once per string;
    do not modify the returned dict)."""
    d = json.loads(meta)
    return Format.from_dict(d["fmt"]), tuple(d["shape"]), getattr(torch, d["dtype"]), d["meta"]


def prepare_operand(q: QTensor) -> ScaledOperand:
    """``q`` as the kernel reads it: views of its own tensors (a copy only where one is not
    contiguous, or a global scale not float32 on ``q``'s device), nothing unpacked or widened."""
    sc = q.scales.contiguous()
    gs = q.global_scale
    if gs is not None:
        gs = gs.reshape(1)
        if gs.dtype != torch.float32 or gs.device != q.data.device:
            gs = gs.to(device=q.data.device, dtype=torch.float32)
    return ScaledOperand(q.data.contiguous(), sc.view(INT_VIEW[sc.element_size()]),
                         None if q.zero_points is None else q.zero_points.contiguous(), gs, _meta(q))


@torch.compiler.disable
def weight_operand(q: QTensor) -> ScaledOperand:
    """:func:`prepare_operand` once per weight version, kept in ``q``'s weight state (made again
    after an in-place change of any of its tensors; not kept while a CUDA graph is captured)."""
    return state(q).fact(q, "scaled_operand", lambda: prepare_operand(q))


def _rebuild(codes, scales, gs, zp, meta: str) -> QTensor:
    fmt, shape, dtype, m = parse_meta(meta)
    return QTensor(codes, scales.view(fmt.scale.storage), fmt, torch.Size(shape), dtype,
                   None if gs is None else gs.reshape(()), zp, dict(m))


def _kernel_device(t: torch.Tensor) -> bool:
    """Whether operands on ``t``'s device run the kernel (CUDA) rather than the oracle."""
    return t.device.type == "cuda"


@torch.library.custom_op("microscale::scaled_mm", mutates_args=())
def _scaled_mm_op(a_codes: torch.Tensor, a_scales: torch.Tensor, a_gs: torch.Tensor | None,
                  a_zp: torch.Tensor | None, a_meta: str, b_codes: torch.Tensor, b_scales: torch.Tensor,
                  b_gs: torch.Tensor | None, b_zp: torch.Tensor | None, b_meta: str,
                  bias: torch.Tensor | None, out_dtype: str, fast_accum: bool = False) -> torch.Tensor:
    dt = getattr(torch, out_dtype)
    if _kernel_device(a_codes):
        from .backends import scaled_exact as be
        from .backends import scaled_fp8

        oa = ScaledOperand(a_codes, a_scales, a_zp, a_gs, a_meta)
        ob = ScaledOperand(b_codes, b_scales, b_zp, b_gs, b_meta)
        if bias is not None:
            bias = bias.contiguous()  # (the kernels read it as [N] with unit stride)
        fa, (m, _), _, _ = parse_meta(a_meta)
        if fast_accum and scaled_fp8.fast_accum_takes(fa, parse_meta(b_meta)[0], m):
            return scaled_fp8.scaled_fp8_launch(oa, ob, bias, dt)
        if m >= be.DEQUANT_GEMM_M and be.bf16_exact(fa) and be.bf16_exact(parse_meta(b_meta)[0]):
            return be.dequant_gemm_launch(oa, ob, bias, dt)
        return be.scaled_exact_launch(oa, ob, bias, dt)
    return scaled_mm_reference(_rebuild(a_codes, a_scales, a_gs, a_zp, a_meta),
                               _rebuild(b_codes, b_scales, b_gs, b_zp, b_meta), bias, dt)


@_scaled_mm_op.register_fake
def _(a_codes, a_scales, a_gs, a_zp, a_meta, b_codes, b_scales, b_gs, b_zp, b_meta, bias, out_dtype,
      fast_accum=False):
    m = parse_meta(a_meta)[1][0]
    n = parse_meta(b_meta)[1][0]
    return a_codes.new_empty((m, n), dtype=getattr(torch, out_dtype))


def _run(oa: ScaledOperand, ob: ScaledOperand, bias: torch.Tensor | None, out_dtype: torch.dtype,
         fast_accum: bool = False) -> torch.Tensor:
    return torch.ops.microscale.scaled_mm(oa.codes, oa.scales, oa.global_scale, oa.zero_points, oa.meta,
                                          ob.codes, ob.scales, ob.global_scale, ob.zero_points, ob.meta,
                                          bias, _DTYPE_NAMES[out_dtype], fast_accum)


def scaled_mm(a: QTensor, b: QTensor, *, bias: torch.Tensor | None = None,
              out_dtype: torch.dtype = torch.bfloat16, fast_accum: bool = False) -> torch.Tensor:
    """``a @ b^T (+ bias)`` with both operands quantized.

    Each operand's block and global scales are applied as :mod:`microscale.reference_scaled`
    states (the result equals that oracle up to float32 summation order). Any registered formats
    whose block sizes nest (one divides the other) combine: fp8 block-128 activations with
    128x128-block weights, MXFP8 x MXFP8, MXFP4 weights x MXFP8 activations, NVFP4 x NVFP4, ...

    ``b`` is the weight: what the kernel reads of it is made once per weight version and kept
    in its state (:func:`weight_operand`); ``a`` is read as it is stored (nothing is unpacked).

    Args:
        a: QTensor ``[M, K]`` (activations, e.g. from :func:`microscale.quantize`).
        b: QTensor ``[N, K]`` (the weight).
        bias: optional float ``[N]``, added in float32 after the scales.
        out_dtype: bfloat16 (default), float16 or float32.
        fast_accum: allow fp8 tensor cores whose in-instruction sums keep fewer bits than float32
            (Hopper), for operands whose codes are fp8 bytes and whose scales are float32 / float16
            (fp8 block-128): each chunk is promoted to float32 and scaled as DeepGEMM does, and the
            result may differ from the oracle by about 1e-4 relative (measured on Hopper) instead of
            float32 ordering. Other pairs (MXFP8 included: its exact kernels are fast), and CPU
            operands, stay exact. MXFP4 / MXFP6 weights reach the fp8 kernel as a folded copy
            (:func:`microscale.fold_fp8`, lossless where it certifies so).

    Returns:
        ``[M, N]`` in ``out_dtype``. On CUDA, formats whose element x block-scale values are exact
        in bf16 (NVFP4, every MX format) run, with bfloat16 output in eager calls, the linear op's
        tensor-core kernels on a's bf16 values (decode kernels up to 64 rows of ``a``, its prefill
        kernel beyond: ``scaled_exact.linear_run``); where those do not serve, from 32 rows a
        dequantize + cuBLAS GEMM with float32 output; the rest runs the exact bf16 tile kernel. CPU
        operands run the oracle.
    """
    check_operands(a, b, bias, out_dtype)
    if fast_accum and a.data.is_cuda:
        from .backends.scaled_fp8 import fast_accum_takes

        if fast_accum_takes(a.fmt, b.fmt, int(a.shape[0])):
            return _run(prepare_operand(a), weight_operand(b), bias, out_dtype, True)
    if a.data.is_cuda and not torch.compiler.is_compiling():
        from .backends.scaled_exact import linear_run  # (the linear op's exact kernels where they serve)

        y = linear_run(a, b, bias, out_dtype)
        if y is not None:
            return y
    return _run(prepare_operand(a), weight_operand(b), bias, out_dtype)


# ---- the linear op with quantized activations ---------------------------------------------------
def activation_scale_source(w: QTensor) -> tuple[str, tuple[float, ...]] | None:
    """Where ``w``'s static activation scale comes from, read on the host: ``(meta key, values)`` for
    ModelOpt's ``input_scale`` or else compressed-tensors' ``input_global_scale``; None for neither. Two
    weights with equal sources have the same :func:`activation_scale`."""
    for key in ("input_scale", "input_global_scale"):
        src = w.meta.get(key)
        if src is not None:
            return key, tuple(float(v) for v in src["values"])
    return None


def activation_scale(w: QTensor) -> torch.Tensor | None:
    """The static per-tensor activation scale ``w`` carries, as a decode multiplier (float32 0-d on
    ``w``'s device, kept in its state): ModelOpt's ``input_scale`` as it is, compressed-tensors'
    ``input_global_scale`` (an encode multiplier) as ``fl32(1 / g)``; None when it carries neither."""
    source = activation_scale_source(w)
    if source is None:
        return None
    key, values = source
    inverse = key == "input_global_scale"
    if len(values) != 1:
        raise ValueError(f"linear: the weight's {key} holds {len(values)} values; expected one (per tensor)")

    def make() -> torch.Tensor:
        s = torch.tensor(values[0], dtype=torch.float32)
        return (1.0 / s if inverse else s).to(w.data.device)

    return state(w).fact(w, ("act_scale", key, values), make)


def quantize_activation(x2: torch.Tensor, w: QTensor, fmt: Format) -> QTensor:
    """``x2`` ``[M, K]`` quantized to ``fmt`` as ``linear(..., act_format=fmt)`` does: block scales
    from the data (dynamic); for a two-level ``fmt`` the per-tensor scale is ``w``'s static
    activation scale (:func:`activation_scale`) where it carries one, else from ``x2``'s amax. K is
    zero-padded to a whole block."""
    from ..ops import quantize  # (the public quantize: the kernel on CUDA, the reference elsewhere)

    gs = activation_scale(w) if fmt.global_scale else None
    return quantize(x2, fmt, global_scale=gs, pad=True)


def linear_act(x: torch.Tensor, w: QTensor, bias: torch.Tensor | None, act_format: str | Format,
               fast_accum: bool = False) -> torch.Tensor:
    """``linear(x, w, bias, act_format=..., fast_accum=...)``: ``scaled_mm(quantize_activation(x), w)``, ``[..., N]`` in
    x's dtype."""
    if not isinstance(w, QTensor):
        raise TypeError(f"linear: act_format needs the weight as a QTensor, got {type(w).__name__} (a prepared "
                        "weight serves the weight-only kernels)")
    if not isinstance(x, torch.Tensor) or x.dtype not in OUT_DTYPES:
        raise TypeError(f"linear: with act_format, x must be a bfloat16, float16 or float32 tensor, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if len(w.shape) != 2 or x.dim() < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: x has shape {tuple(x.shape)} and the weight {tuple(w.shape)}; expected "
                         "x [..., K] and a 2-D weight [N, K]")
    fmt = get_format(act_format)
    lead = x.shape[:-1]
    a = quantize_activation(x.reshape(-1, x.shape[-1]), w, fmt)
    return scaled_mm(a, w, bias=bias, out_dtype=x.dtype, fast_accum=fast_accum).reshape(*lead, w.shape[0])
