"""Every attention kernel specialization microscale ships, launched on CPU tensors for the
sm_90 compile check (``tools/compile_check.py`` intercepts the launches; nothing needs to run)."""
from __future__ import annotations

import torch

from ..runtime import target
from .cache import PagedKVCache
from .op import AttentionConfig, decode_attention, extend_attention

#: (preset, per_token, global_scale): every element / scale kind the cache takes
FORMATS = [("fp8_e4m3_fp32", True, None), ("mxfp8_e4m3", False, None), ("nvfp4", False, 0.02),
           ("mxfp4", False, None), ("int8_fp16", False, None), ("int4_fp16", False, None),
           ("int4_affine_g32", False, None), ("fp8_e4m3_fp16", False, None), ("mxint8", False, None)]


def launches(mode: str = "full") -> None:
    """Decode and extend over every format, head_dim 64 and 128, GQA groups 1/8, window,
    sinks and soft-cap on and off, q in bf16 and fp16, the default decode tiling, a 64-key /
    8-row / 8-warp one, the register cap, and 5 stages with programmatic launches (``mode``
    "smoke": NVFP4 only)."""
    smoke = mode == "smoke"
    with target.override(interpreting=True, pdl=True):  # (a Hopper: both launches programmatic)
        for fmt, per_token, gs in FORMATS[2:3] if smoke else FORMATS:
            for d, hkv, group in ((128, 8, 8),) if smoke else ((128, 8, 8), (64, 8, 8), (128, 4, 1)):
                c = PagedKVCache(fmt, num_layers=1, num_kv_heads=hkv, head_dim=d, num_pages=8, page_size=16,
                                 max_seqs=2, per_token=per_token, global_scale=gs)
                c.append(0, torch.randn(2, 40, hkv, d), torch.randn(2, 40, hkv, d))
                for dt in (torch.bfloat16,) if smoke else (torch.bfloat16, torch.float16):
                    q = torch.randn(2, hkv * group, d).to(dt)
                    decode_attention(q, c, 0)
                    decode_attention(q, c, 0, sliding_window=128, sinks=torch.randn(hkv * group), softcap=30.0)
                    if not smoke:  # 64 keys a step, 8 rows (the mma.sync fallback), 8 warps; the register cap
                        decode_attention(q, c, 0, config=AttentionConfig(64, 8, 3, num_warps=8))
                        decode_attention(q, c, 0, config=AttentionConfig(128, 16, 3, maxnreg=168))
                        # double-buffered code loads, programmatic launches (the sweep's candidates)
                        decode_attention(q, c, 0, config=AttentionConfig(128, 16, 3, num_stages=5, pdl=True))
                    qe = torch.randn(40, hkv * group, d).to(dt)
                    extend_attention(qe, c, 0, [40], seqs=[1])
                    extend_attention(qe, c, 0, [40], seqs=[1], sliding_window=128,
                                     sinks=torch.randn(hkv * group), config=AttentionConfig(64, 64, 2))
