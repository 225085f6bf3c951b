"""Every launch of the embedding family's kernel, for the sm_90 compile check: each registry
format, three output dtypes, 1-D and 2-D block tables."""
from __future__ import annotations

import torch


def launches(mode: str = "full") -> None:
    """Each registry format (``mode`` "smoke": NVFP4) in three output dtypes."""
    from .. import formats, reference
    from ..runtime import target
    from .op import embedding_triton

    with target.override(interpreting=True):
        ids = torch.tensor([3, 0, 5], dtype=torch.int64)
        for name in ["nvfp4"] if mode == "smoke" else sorted(formats.registry):
            fmt = formats.registry[name]
            rows = 2 * fmt.block_rows if fmt.block_rows > 1 else 8
            q = reference.quantize(torch.randn(rows, 256), fmt, pad=True)
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                embedding_triton(ids, q, dtype, check=False)
