"""Every launch configuration of the accuracy package's Triton kernels, for the sm_90
compile check (tools/compile_check.py intercepts the launches; nothing runs on a GPU)."""
from __future__ import annotations

import torch

__all__ = ["launches"]


def launches(mode: str = "full") -> None:
    """Call the public GPU entry point over each block size (the formats' 16, 32, 64, 128
    and multiples) and each input dtype (``mode`` "smoke": block 16, bf16)."""
    from ._hadamard_kernel import block_hadamard_triton

    smoke = mode == "smoke"
    for block in (16,) if smoke else (16, 32, 64, 128, 256):
        for dtype in (torch.bfloat16,) if smoke else (torch.float32, torch.float16, torch.bfloat16):
            block_hadamard_triton(torch.randn(8, 512).to(dtype), block)
