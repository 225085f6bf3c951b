"""Launches of ``rmsnorm_linear``'s norm kernel for the sm_90 compile check: bf16 / fp16 activations,
norm and gated norm, decode and prefill token counts (the projections after it are the linear op's
own launches, which its compile cases cover)."""
from __future__ import annotations

import torch


def launches(mode: str = "full") -> None:
    """Norm and gated norm at 1 and 200 tokens (the kernel takes no format; ``mode`` is the
    compile check's and changes nothing here)."""
    from ..runtime import target
    from .norm_linear import _norm_rows

    del mode
    with target.override(capability=(9, 0), num_sms=132):  # (not interpreting: the GPU's INTERP=False path)
        for k in (512, 20000):  # rows kept in registers; rows read twice
            for dtype in (torch.bfloat16, torch.float16):
                nw = torch.rand(k).to(dtype)
                for m in (1, 200):
                    x = torch.randn(m, k).to(dtype)
                    _norm_rows(x, nw, None, 1e-6)
                    _norm_rows(x, nw, torch.randn(m, k).to(dtype), 1e-6)
