"""Launches of ``rmsnorm_linear``'s norm kernel for the sm_90 compile check: bf16 / fp16 activations,
norm and gated norm, decode and prefill token counts (the projections after it are the linear op's
own launches, which its compile cases cover)."""
from __future__ import annotations

import torch


def launches(mode: str = "full") -> None:
    """Norm and gated norm, 1 and 200 tokens, over each registry format's weights (``mode`` "smoke":
    NVFP4)."""
    from .. import formats, reference
    from ..runtime import target
    from .norm_linear import _fused_run

    with target.override(capability=(9, 0), num_sms=132):  # (not interpreting: the GPU's INTERP=False path)
        k = 512
        for name in ["nvfp4"] if mode == "smoke" else sorted(formats.registry):
            fmt = formats.registry[name]
            n = max(256, fmt.block_rows)
            ws = [reference.quantize(torch.randn(n, k), fmt) for _ in range(2)]
            if fmt.global_scale:  # q/k/v sharing a per-tensor scale join into one launch
                ws = [type(w)(w.data, w.scales, w.fmt, w.shape, w.dtype, ws[0].global_scale, w.zero_points, w.meta)
                      for w in ws]
            for dtype in (torch.bfloat16, torch.float16):
                nw = torch.rand(k).to(dtype)
                for m in (1, 200):
                    x = torch.randn(m, k).to(dtype)
                    _fused_run(x, nw, ws, [None, torch.randn(n)], 1e-6, None, True)
                    _fused_run(x, nw, ws[:1], [None], 1e-6, torch.randn(m, k).to(dtype), True)
