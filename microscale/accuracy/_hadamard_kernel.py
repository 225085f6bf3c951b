"""Triton fast Walsh-Hadamard transform over blocks of the last dim (GPU path of
:func:`microscale.accuracy.hadamard.block_hadamard`). Loaded on first use only."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .hadamard import check_block

__all__ = ["block_hadamard_triton"]


@triton.jit
def _fwht_kernel(x_ptr, y_ptr, n_rows, LOG2B: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
                 SCALE: tl.constexpr):
    """Each program transforms ROWS blocks of BLOCK contiguous elements (one block per row of
    the [n_rows, BLOCK] view): LOG2B butterfly stages on the register tile, then * SCALE."""
    pid = tl.program_id(0)
    r = pid * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK)
    offs = r.to(tl.int64)[:, None] * BLOCK + c[None, :]
    mask = (r < n_rows)[:, None]
    v = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    for s in tl.static_range(LOG2B):
        # butterfly of stride 2^s: pair element i with i + 2^s inside groups of 2^(s+1)
        v = tl.reshape(v, (ROWS, BLOCK >> (s + 1), 2, 1 << s))
        v = tl.permute(v, (0, 1, 3, 2))
        a, b = tl.split(v)
        v = tl.join(a + b, a - b)
        v = tl.permute(v, (0, 1, 3, 2))
        v = tl.reshape(v, (ROWS, BLOCK))
    tl.store(y_ptr + offs, (v * SCALE).to(y_ptr.dtype.element_ty), mask=mask)


def block_hadamard_triton(x: torch.Tensor, block: int, rows_per_program: int | None = None) -> torch.Tensor:
    """``x R`` (see :mod:`microscale.accuracy.hadamard`) with the Triton kernel; float32
    arithmetic, output in x's dtype (float32, float16 or bfloat16)."""
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"block_hadamard: x has dtype {x.dtype}; the kernel takes float32, float16 or bfloat16")
    check_block(block, x.shape[-1])
    xc = x.contiguous()
    y = torch.empty_like(xc)
    n = xc.numel() // block
    if n == 0:
        return y
    rows = rows_per_program or max(1, min(64, 4096 // block))
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1 or rows & (rows - 1):
        raise ValueError(f"block_hadamard: rows_per_program={rows_per_program!r} must be a power of two >= 1 "
                         "(a tile dimension)")
    log2b = block.bit_length() - 1
    grid = (triton.cdiv(n, rows),)
    _fwht_kernel[grid](xc, y, n, LOG2B=log2b, BLOCK=block, ROWS=rows, SCALE=float(block) ** -0.5)
    return y.view(x.shape)
