"""Layer 2: the oracle of the both-quantized matmul ``out = a @ b^T`` (a, b QTensors, any device).

Numerics (docs/scaled-mm.md says where they come from):

* Both operands are QTensors with their blocks along K: ``a`` ``[M, K]``, ``b`` ``[N, K]``.
  K is cut into *chunks* of ``kb = min(block_a, block_b)`` elements (block sizes are powers
  of two, so a chunk lies inside one block of each operand).
* Every product of two *unscaled* element values (the element code decoded, minus its zero
  point for affine formats) is exact; a chunk's products are summed and the sum rounded to
  float32 once (this oracle sums in float64; a kernel summing in float32 differs only by
  summation order).
* The chunk sum is multiplied by ``fp32(s_a * s_b)``, the product of the two block scales
  rounded to float32 (exact for E8M0 x E8M0, E8M0 x UE4M3 and UE4M3 x UE4M3), and added to a
  float32 accumulator in K order, starting at 0. For fp8 block-128 (DeepSeek) operands this is
  DeepSeek's promotion to float32 every 128 K.
* After the last chunk: ``acc * fp32(g_a * g_b)`` when either operand has a global (per-tensor)
  scale, then ``+ bias`` (float32), then one rounding to ``out_dtype``.
* Non-finite values propagate as IEEE float32 arithmetic does (a NaN code or NaN scale makes its
  chunk NaN; Inf times a zero chunk sum is NaN).
"""
from __future__ import annotations

import torch

from .formats import unpack_codes
from .qtensor import QTensor

__all__ = ["scaled_mm_reference", "chunk_size", "check_operands", "OUT_DTYPES"]

OP = "scaled_mm"
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def chunk_size(a: QTensor, b: QTensor) -> int:
    """Elements of K per scale chunk: the smaller block size (it must divide the larger)."""
    ba, bb = a.fmt.block_size, b.fmt.block_size
    kb = min(ba, bb)
    if max(ba, bb) % kb:
        raise ValueError(f"{OP}: block sizes {ba} (a, {a.fmt.name}) and {bb} (b, {b.fmt.name}) do not nest; "
                         "expected one to divide the other")
    return kb


def check_operands(a: object, b: object, bias: object, out_dtype: object) -> tuple[int, int, int]:
    """Validate the operands; returns ``(M, N, K)``."""
    for name, q in (("a", a), ("b", b)):
        if not isinstance(q, QTensor):
            raise TypeError(f"{OP}: {name} must be a QTensor, got {type(q).__name__}")
        if len(q.shape) != 2:
            raise ValueError(f"{OP}: {name} must be 2-D [rows, K], got shape {tuple(q.shape)}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"{OP}: a has K={a.shape[1]} but b has K={b.shape[1]}; expected equal")
    if a.device != b.device:
        raise ValueError(f"{OP}: a is on {a.device} but b is on {b.device}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"{OP}: out_dtype={out_dtype!r}; expected one of bfloat16, float16, float32")
    m, k = int(a.shape[0]), int(a.shape[1])
    n = int(b.shape[0])
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or not bias.dtype.is_floating_point:
            raise TypeError(f"{OP}: bias must be a float tensor or None, got {bias!r:.80}")
        if tuple(bias.shape) != (n,):
            raise ValueError(f"{OP}: bias has shape {tuple(bias.shape)}; expected ({n},)")
        if bias.device != a.device:
            raise ValueError(f"{OP}: bias is on {bias.device} but a is on {a.device}")
    chunk_size(a, b)
    return m, n, k


def _values_and_scales(q: QTensor, kpad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Unscaled element values (float64, zero point subtracted) ``[rows, kpad]`` with every
    element at or beyond the true K set to 0, and the decoded block scales (float32) expanded
    to one row per row ``[rows, blocks]``."""
    fmt = q.fmt
    rows, k = int(q.shape[0]), int(q.shape[1])
    kp = q.padded_shape[-1]
    codes = unpack_codes(q.data, fmt.element.bits, kp)[:rows]
    v = fmt.element.decode(codes).to(torch.float64)
    s = fmt.scale.decode(q.scales).to(torch.float32)
    if fmt.block_rows > 1:
        s = s.repeat_interleave(fmt.block_rows, dim=0)
    s = s[:rows]
    if fmt.zero_point:
        zp = q.zero_points.to(torch.float64)
        if fmt.block_rows > 1:
            zp = zp.repeat_interleave(fmt.block_rows, dim=0)
        v = v - zp[:rows].repeat_interleave(fmt.block_size, dim=1)
    v = torch.nn.functional.pad(v[:, :k], (0, kpad - k))
    return v, s


def scaled_mm_reference(a: QTensor, b: QTensor, bias: torch.Tensor | None = None,
                        out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``a @ b^T (+ bias)`` with the numerics of the module docstring; ``[M, N]`` in ``out_dtype``.

    Args:
        a: QTensor ``[M, K]`` (the activations), any registered format.
        b: QTensor ``[N, K]`` (the weight), any registered format whose block size nests with a's.
        bias: optional float ``[N]``, added in float32.
        out_dtype: bfloat16, float16 or float32.
    """
    m, n, k = check_operands(a, b, bias, out_dtype)
    kb = chunk_size(a, b)
    kpad = -(-k // kb) * kb if k else 0
    chunks = kpad // kb
    va, sa = _values_and_scales(a, kpad)
    vb, sb = _values_and_scales(b, kpad)
    acc = torch.zeros((m, n), dtype=torch.float32, device=a.device)
    ra, rb = a.fmt.block_size // kb, b.fmt.block_size // kb
    for c in range(chunks):
        p = (va[:, c * kb:(c + 1) * kb] @ vb[:, c * kb:(c + 1) * kb].T).to(torch.float32)
        s = sa[:, c // ra, None] * sb[None, :, c // rb]
        acc = acc + p * s
    g = None
    for q in (a, b):
        if q.global_scale is not None:
            gq = q.global_scale.to(device=acc.device, dtype=torch.float32).reshape(())
            g = gq if g is None else g * gq
    if g is not None:
        acc = acc * g
    if bias is not None:
        acc = acc + bias.to(torch.float32)
    return acc.to(out_dtype)
