"""Peers: the other ways to do an op, timed in the same run for ratios.

* cuBLAS bf16 ``F.linear`` on a dense bf16 weight of the same shape;
* ``torch.compile`` of the reference dequantize followed by ``F.linear`` (and of the
  reference dequantize alone);
* torchao's NVFP4 / MX quantizers, when torchao imports;
* a plain Triton ``tl.dot_scaled`` bf16 x MXFP4 kernel (E2M1 codes, E8M0 scales per 32);
* OpenAI's ``triton_kernels`` ``matmul_ogs`` MoE forward on MXFP4 experts, when it imports.

Every peer is built lazily and raises :class:`Skip` with a reason when it does not
apply or cannot be built here; nothing in this module runs at import.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

__all__ = [
    "Skip",
    "quiet_compiler",
    "compiled",
    "torchao_quantizer",
    "dot_scaled_mxfp4_applies",
    "dot_scaled_mxfp4_linear",
    "require_triton_kernels",
    "matmul_ogs_experts",
    "matmul_ogs_moe",
]


class Skip(Exception):
    """Raised by a case or peer builder that cannot run here; the message is the reason."""


def quiet_compiler() -> None:
    """Compile in this process only: Inductor's pool of compile workers otherwise keeps
    CPUs busy after a compile and perturbs the timings that follow it."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    try:
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1
    except Exception:  # an Inductor without this knob: nothing to quiet
        pass


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile(fn)`` with a fresh dynamo cache, so that earlier cases' recompiles
    never push this one over the recompile limit (which would silently run eager)."""
    import torch._dynamo as dynamo

    quiet_compiler()
    dynamo.reset()
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo.config, name):
            setattr(dynamo.config, name, max(getattr(dynamo.config, name), 64))
    return torch.compile(fn, dynamic=False)


# ---- torchao ------------------------------------------------------------------------

def torchao_quantizer(fmt: Any) -> Callable[[torch.Tensor], Any]:
    """torchao's quantizer for ``fmt`` (a microscale Format) under ``torch.compile``,
    returning torchao's tensor subclass; raises :class:`Skip` if torchao is absent or
    has no quantizer for the format. Which torchao quantizer fits is read from the
    format's fields (element, block size, scale codec, global scale)."""
    try:
        from torchao.prototype.mx_formats.mx_tensor import MXTensor
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale
    except Exception as exc:  # ImportError, or torchao failing against this torch
        raise Skip(f"torchao not importable ({type(exc).__name__})") from None
    el, sc = fmt.element.name, fmt.scale.name
    if fmt.block_rows != 1 or fmt.zero_point:
        raise Skip(f"torchao has no quantizer for {fmt.name}")
    if el == "e2m1" and sc == "ue4m3" and fmt.block_size == 16 and fmt.global_scale:
        def nvfp4(x: torch.Tensor) -> Any:
            pts = per_tensor_amax_to_scale(x.abs().amax().to(torch.float32))
            return NVFP4Tensor.to_nvfp4(x, block_size=16, per_tensor_scale=pts)
        return compiled(nvfp4)
    elem_dtypes = {"e2m1": getattr(torch, "float4_e2m1fn_x2", None), "e4m3": torch.float8_e4m3fn,
                   "e5m2": torch.float8_e5m2}
    if sc == "e8m0" and not fmt.global_scale and elem_dtypes.get(el) is not None:
        elem_dtype, block = elem_dtypes[el], fmt.block_size

        def mx(x: torch.Tensor) -> Any:
            return MXTensor.to_mx(x, elem_dtype, block_size=block)
        return compiled(mx)
    raise Skip(f"torchao has no quantizer for {fmt.name}")


def torchao_dequantize(t: Any, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Dense tensor from a torchao NVFP4Tensor / MXTensor (API differs across versions)."""
    for name in ("dequantize", "to_dtype"):
        f = getattr(t, name, None)
        if f is not None:
            return f(dtype)
    raise Skip("cannot dequantize the torchao tensor to check it")


# ---- plain tl.dot_scaled kernel for MXFP4 ---------------------------------------------

def dot_scaled_mxfp4_applies(fmt: Any) -> bool:
    """True for formats the plain ``tl.dot_scaled`` peer computes: E2M1 codes, E8M0
    scales per 32 along K, no global scale, no zero point, 1-row blocks."""
    return (fmt.element.name == "e2m1" and fmt.scale.name == "e8m0" and fmt.block_size == 32
            and not fmt.global_scale and not fmt.zero_point and fmt.block_rows == 1)


_KERNEL: Optional[Any] = None


def _kernel() -> Any:
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    try:
        import triton
        import triton.language as tl
    except Exception as exc:
        raise Skip(f"triton not importable ({type(exc).__name__})") from None
    if not hasattr(tl, "dot_scaled"):
        raise Skip(f"triton {triton.__version__} has no tl.dot_scaled")

    @triton.jit
    def dot_scaled_mxfp4_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K,
                                sxm, sxk, swn, swk, ssn, ssk, sym, syn,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # y[M, N] = x[M, K] (bf16) @ W[N, K]^T, W as E2M1 codes packed two per byte along
        # K (first element in the low nibble) with an E8M0 scale per 32 along K.
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        offs_kp = tl.arange(0, BLOCK_K // 2)
        offs_ks = tl.arange(0, BLOCK_K // 32)
        m_ok = offs_m < M
        n_ok = offs_n < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(x_ptr + offs_m[:, None] * sxm + (k0 + offs_k)[None, :] * sxk,
                        mask=m_ok[:, None], other=0.0)
            w = tl.load(w_ptr + offs_n[None, :] * swn + (k0 // 2 + offs_kp)[:, None] * swk,
                        mask=n_ok[None, :], other=0)
            s = tl.load(s_ptr + offs_n[:, None] * ssn + (k0 // 32 + offs_ks)[None, :] * ssk,
                        mask=n_ok[:, None], other=127)
            acc = tl.dot_scaled(x, None, "bf16", w, s, "e2m1", acc)
        tl.store(y_ptr + offs_m[:, None] * sym + offs_n[None, :] * syn, acc.to(y_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & n_ok[None, :])

    _KERNEL = (triton, dot_scaled_mxfp4_kernel)
    return _KERNEL


def _config(m: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): one small-M and one large-M
    tile; deliberately untuned, this is the 'plain kernel' peer."""
    if m <= 16:
        return 16, 64, 256, 4, 4
    if m <= 128:
        return 64, 128, 128, 4, 3
    return 128, 128, 128, 8, 3


def dot_scaled_mxfp4_linear(x: torch.Tensor, data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``x[M, K] @ W[N, K]^T`` in bf16 with a plain Triton ``tl.dot_scaled`` kernel, W
    given as MXFP4 ``data`` (uint8 [N, K/2]) and E8M0 ``scales`` (uint8 [N, K/32])."""
    triton, kernel = _kernel()
    if x.dim() != 2 or data.dim() != 2 or scales.dim() != 2:
        raise ValueError("dot_scaled_mxfp4_linear: x, data and scales must be 2-D")
    m, k = x.shape
    n = data.shape[0]
    if data.shape[1] * 2 != k or scales.shape != (n, k // 32):
        raise ValueError(f"dot_scaled_mxfp4_linear: x {tuple(x.shape)}, data {tuple(data.shape)} and "
                         f"scales {tuple(scales.shape)} do not describe one [M,K] x [N,K] product")
    bm, bn, bk, warps, stages = _config(m)
    if k % bk:
        raise ValueError(f"dot_scaled_mxfp4_linear: K={k} is not a multiple of BLOCK_K={bk}")
    scales = scales.view(torch.uint8)
    y = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    kernel[grid](x, data, scales, y, m, n, k, x.stride(0), x.stride(1), data.stride(0), data.stride(1),
                 scales.stride(0), scales.stride(1), y.stride(0), y.stride(1),
                 BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
    return y


def scaled_mm_fp8_tensorwise(x8: torch.Tensor, w8: torch.Tensor, sx: torch.Tensor, sw: torch.Tensor) -> torch.Tensor:
    """``torch._scaled_mm`` on e4m3 operands with one float32 scale per tensor (cuBLASLt fp8, fast
    accumulation), bf16 out: the fp8 GEMM anyone on Hopper has without a block-scaled kernel."""
    return torch._scaled_mm(x8, w8.T, sx, sw, out_dtype=torch.bfloat16, use_fast_accum=True)


def cublas_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """cuBLAS bf16 ``F.linear(x, w)`` (the peer every quantized linear is held against)."""
    return F.linear(x, w)


# ---- OpenAI triton_kernels' matmul_ogs (the MoE peer) -------------------------------------------------------
def require_triton_kernels() -> Any:
    """``triton_kernels`` (OpenAI's, from the Triton repository or vendored by vLLM; the PyPI package of that
    name is another project), or :class:`Skip`."""
    try:
        import triton_kernels.matmul_ogs as mo
    except Exception as exc:  # (absent, or another package of that name)
        raise Skip(f"triton_kernels (OpenAI's matmul_ogs) not importable: {type(exc).__name__}") from None
    return mo


def matmul_ogs_experts(q: Any) -> tuple:
    """An MXFP4 QTensor of experts ``[E, N, K]`` (codes two a byte, low nibble first; E8M0 scales per 32 along K:
    gpt-oss's ``*_blocks`` / ``*_scales``) as ``matmul_ogs`` takes it: ``[E, K, N]`` in the target's default
    layouts, with its ``PrecisionConfig``. On Hopper the scales' K groups are zero-padded to a multiple of 4 and
    split-K is pinned off, as vLLM does for this kernel."""
    require_triton_kernels()
    from triton_kernels.matmul_ogs import FlexCtx, PrecisionConfig
    from triton_kernels.matmul_ogs_details import opt_flags
    from triton_kernels.numerics import InFlexData
    from triton_kernels.tensor import FP4, convert_layout, wrap_torch_tensor
    from triton_kernels.tensor_details import layout

    codes, scales = q.data, q.scales.view(torch.uint8)
    if torch.cuda.get_device_capability(codes.device)[0] == 9:
        opt_flags.update_opt_flags_constraints({"split_k": 1})
        scales = F.pad(scales, (0, -scales.shape[-1] % 4))
    vl, vo = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    sl, so = layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8)
    w = convert_layout(wrap_torch_tensor(codes.transpose(-2, -1), dtype=FP4), vl, **vo)
    s = convert_layout(wrap_torch_tensor(scales.transpose(-2, -1)), sl, **so)
    return w, PrecisionConfig(weight_scale=s, flex_ctx=FlexCtx(rhs_data=InFlexData()))


def matmul_ogs_moe(x: torch.Tensor, w1: Any, pc1: Any, w2: Any, pc2: Any, logits: torch.Tensor,
                   idx16: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """gpt-oss's experts forward on ``matmul_ogs``: routing from the given top-k ids (``logits`` hold the log of
    each token's routing weights at its ids, so the kernel's softmax over the k gives them back), the gate/up
    GEMM gathering rows with the clamped SwiGLU of interleaved gate/up fused, the down GEMM scattering with the
    routing weights and summing each token's k slots."""
    mo = require_triton_kernels()
    from triton_kernels.routing import routing
    from triton_kernels.swiglu import swiglu_fn

    rdata, gather, scatter = routing(logits, idx16.shape[1], expt_indx=idx16)
    act = mo.FusedActivation(mo.FnSpecs("swiglu", swiglu_fn, ("alpha", "limit")), (alpha, limit), 2)
    h = mo.matmul_ogs(x, w1, None, rdata, gather_indx=gather, precision_config=pc1, fused_activation=act)
    y = mo.matmul_ogs(h, w2, None, rdata, scatter_indx=scatter, precision_config=pc2, gammas=rdata.gate_scal)
    return y.reshape(x.shape[0], -1)
