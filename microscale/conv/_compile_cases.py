"""Every launch of the conv2d family's kernels, for the sm_90 compile check: the implicit GEMM
(both K orders, three activation dtypes, bias or none, groups, a ViT patch embedding) and the
depthwise kernel, over every registry format."""
from __future__ import annotations

import torch

#: (C_in, C_out, kernel, stride, padding, dilation, groups, order): general, patch embedding,
#: grouped with dilation, PyTorch's K order, depthwise 3x3 and 7x7 (ConvNeXt)
CASES = ((16, 32, 3, 1, 1, 1, 1, "hwc"), (3, 64, 16, 16, 0, 1, 1, "hwc"), (8, 16, 3, 2, 2, 2, 2, "hwc"),
         (16, 32, 3, 1, 1, 1, 1, "chw"), (32, 32, 3, 1, 1, 1, 32, "hwc"), (32, 64, 7, 1, 3, 1, 32, "hwc"))


#: formats run over every case, dtype and bias (the others: one GEMM and one depthwise case)
MAIN = ("nvfp4", "mxfp8_e4m3", "int4_affine_g32")


def launches(mode: str = "full") -> None:
    """Every registry format through the general GEMM case and the depthwise 3x3 case (bf16, with
    bias); :data:`MAIN`'s formats through every case in bf16 / fp16 / fp32 with and without bias
    (``mode`` "smoke": NVFP4 bf16 without bias, the general, patch-embedding and depthwise cases).
    Launched with CPU tensors standing in for CUDA ones (the GPU's INTERP=False specializations)."""
    from .. import formats
    from .layout import quantize_conv_weight
    from .op import _check, _triton_run

    if mode == "smoke":
        runs = [("nvfp4", c, torch.bfloat16, False) for c in (CASES[0], CASES[1], CASES[4])]
    else:
        runs = [(n, c, torch.bfloat16, True) for n in sorted(formats.registry) for c in (CASES[0], CASES[4])]
        runs += [(n, c, dt, b) for n in MAIN for c in CASES for dt in (torch.bfloat16, torch.float16, torch.float32)
                 for b in (False, True)]
    for name, (ci, co, k, s, p, d, g, order), dtype, has_bias in runs:
        w = quantize_conv_weight(torch.randn(co, ci // g, k, k), name, order=order)
        x = torch.randn(2, ci, 32, 32).to(dtype)
        bias = torch.randn(co) if has_bias else None
        _triton_run(x, w, bias, _check(x, w, bias, s, p, d, g), False)
