"""Lossless refolding of a block-scaled weight into fp8 E4M3 codes with one float32 scale per 128
elements of a row (``fp8_e4m3_block128``) or per 128 x 128 block (``fp8_e4m3_block128x128``, where the
weight's values allow it), so that ``scaled_mm(..., fast_accum=True)`` runs MXFP4 / MXFP6 weights x fp8
activations on Hopper's fp8 tensor cores.

Why it is exact: an E2M1 value times a power of two ``2^k`` is an E4M3 value for ``k`` in a 15-step window
(docs/scaled-mm.md), and E2M3 / E3M2 values in narrower ones. Each row's 128-element chunk gets the scale
``2^b * global_scale`` with ``b`` chosen so that the chunk's largest magnitude lands in E4M3's top binade;
every element ``v / 2^b`` is then encoded to E4M3 and decoded back, and the chunk is *certified* when the
folded tensor's float32 values equal the original's bit for bit (as :func:`microscale.dequantize` computes
both). Chunks whose exponent spread exceeds E4M3's range are not exact: they are refused, or rounded to
nearest E4M3 where the caller allows it, and counted either way.

The folded copy is 8.25 bits an element (MXFP4 is 4.25), and serves decode too: the fp8 kernel streams it at
the fp8 byte rate.
"""
from __future__ import annotations

import torch

from .. import reference
from ..formats import Format, get_format
from ..qtensor import QTensor

__all__ = ["fold_fp8", "FOLD_FORMAT", "FOLD_FORMAT_2D"]

#: the folded weight's format: E4M3 codes, one float32 scale per 128 elements of a row
FOLD_FORMAT = "fp8_e4m3_block128"
#: with ``block_rows=128``: one float32 scale per 128 x 128 block (DeepSeek-V3's weight layout)
FOLD_FORMAT_2D = "fp8_e4m3_block128x128"
_CHUNK = 128
_E4M3_MAX = 448.0
_B_MIN = -126  # chunk scales stay normal float32 (a kernel may flush subnormal ones to zero)
_SOURCE_ONLY = ("two_level", "global_scale_inv")  # meta of the source's global scale, which the fold absorbs


def _fold_reason(w: QTensor) -> str | None:
    fmt = w.fmt
    if fmt.zero_point:
        return f"{fmt.name} has zero points (affine codes have no fp8 form)"
    if fmt.block_rows != 1:
        return (f"{fmt.name} has 2-D blocks ({fmt.block_rows} x {fmt.block_size}); it is fp8 already or needs rows "
                "kept apart")
    if _CHUNK % fmt.block_size:
        return f"{fmt.name}'s blocks of {fmt.block_size} do not nest in 128-element chunks"
    if len(w.shape) < 2:
        return f"needs a weight of at least 2 dims, got shape {tuple(w.shape)}"
    return None


def _unscaled(w: QTensor, rows: slice, kp: int) -> torch.Tensor:
    """Rows ``rows`` of ``w``'s values before its global scale, float32 ``[r, kp]`` (zeros past K): the
    reference dequantize of those rows with the global scale set to 1 (an exact multiply)."""
    data = w.data.reshape(-1, w.data.shape[-1])[rows]
    scales = w.scales.reshape(-1, w.scales.shape[-1])[rows]
    one = torch.ones((), dtype=torch.float32, device=w.data.device) if w.fmt.global_scale else None
    part = QTensor(data, scales, w.fmt, torch.Size((data.shape[0], int(w.shape[-1]))), w.dtype, one, None, {})
    u = reference.dequantize(part, torch.float32)
    return torch.nn.functional.pad(u, (0, kp - u.shape[-1])) if kp > u.shape[-1] else u


def _fold_blocks(ub: torch.Tensor, gs: torch.Tensor | None, e4m3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold blocks ``ub`` ``[n, elems]`` (unscaled float32 values): E4M3 codes ``[n, elems]``, float32 scales
    ``[n]`` (``2^b``, times ``gs``) and which blocks are not exact (``[n]`` bool)."""
    orig = ub * gs if gs is not None else ub
    amax = ub.abs().amax(-1)
    # b: amax / 2^b in [256, 512), one binade lower where that passes E4M3's max (448); never below
    # _B_MIN (a block that would need less holds only values under 2^-126: exact only if they fit there)
    b = (torch.frexp(amax).exponent.to(torch.int32) - 9).clamp_min(_B_MIN)
    b = torch.where(torch.ldexp(amax, -b.float()) > _E4M3_MAX, b + 1, b)
    b = torch.where(amax > 0, b, torch.zeros_like(b))
    c = e4m3.encode(torch.ldexp(ub, -b.float()[:, None]))  # (nearest even, saturating: the lossy blocks' rounding)
    sc = torch.ldexp(torch.ones_like(amax), b.float())
    if gs is not None:
        sc = sc * gs
    # certified: the folded values, as dequantize computes them, equal the original's bit for bit
    folded = e4m3.decode(c) * sc[:, None]
    return c, sc, ~(folded.view(torch.int32) == orig.view(torch.int32)).all(-1)


def fold_fp8(w: QTensor, *, allow_lossy: bool = False, name: str = "weight", rows_per_pass: int = 2048,
             block_rows: int = 1) -> QTensor:
    """``w`` refolded into E4M3 codes with one float32 power-of-two scale per block of 128 elements along K and
    ``block_rows`` rows: the form ``scaled_mm(a, w, fast_accum=True)`` and ``linear(x, w,
    act_format="fp8_e4m3_block128", fast_accum=True)`` run on fp8 tensor cores (with fp8 block-128 activations).

    ``block_rows=1`` gives ``fp8_e4m3_block128`` (a scale per row and 128 columns: the most weights fold exactly);
    ``block_rows=128`` gives ``fp8_e4m3_block128x128`` (DeepSeek-V3's weight layout: one scale per 128 x 128
    block, which the fp8 kernels promote with one scalar per tile, measured about twice as fast at prefill
    on an H100), exact where each block's values fit E4M3 under one scale.

    Exact where it can be: every block whose values fit E4M3 under one power-of-two scale decodes to the same
    float32 values as ``w`` (checked here, bit for bit, block by block). With ``block_rows=1``, MXFP4 chunks
    fit unless their 32-element blocks' scales span more than about 2^14; MXFP6 and MXFP8 chunks fit less
    often; NVFP4 (UE4M3 block scales) rarely. 128-row blocks need that across 128 rows.

    Args:
        w: QTensor ``[..., N, K]`` with 1-D blocks that divide 128 and no zero points (MXFP4, MXFP6, MXFP8,
            fp4 / fp8 with float scales, ...). Leading dims (experts) are kept.
        allow_lossy: round the blocks that are not exact to nearest E4M3 (saturating) instead of refusing.
        name: what to call ``w`` in errors (its checkpoint key, say).
        rows_per_pass: rows decoded at a time (bounds the temporaries to about 28 bytes x rows x K).
        block_rows: 1 or 128, the rows a scale covers.

    Returns:
        A QTensor of format ``fp8_e4m3_block128`` or ``fp8_e4m3_block128x128`` with ``w``'s shape, dtype and meta
        (less the keys of its global scale's convention, which the block scales absorb), plus
        ``meta["folded_from"]`` (the source format's name) and ``meta["inexact_chunks"]`` (blocks rounded:
        0 unless ``allow_lossy`` rounded some). With 128-row blocks, rows past the last whole block are zero
        padding, as ``ms.quantize(..., pad=True)`` stores them.

    Raises:
        ValueError: ``w``'s format cannot fold (the reason is named), it holds NaN or Inf, or some blocks
            are not exact and ``allow_lossy`` is False (their count and the first one's rows and columns).
    """
    if not isinstance(w, QTensor):
        raise TypeError(f"fold_fp8: {name} must be a QTensor, got {type(w).__name__}")
    if block_rows not in (1, _CHUNK) or isinstance(block_rows, bool):
        raise ValueError(f"fold_fp8: block_rows={block_rows!r}; expected 1 or {_CHUNK}")
    out_name = FOLD_FORMAT if block_rows == 1 else FOLD_FORMAT_2D
    why = _fold_reason(w)
    if why:
        raise ValueError(f"fold_fp8: {name} cannot fold to {out_name}: {why}")
    out_fmt: Format = get_format(out_name)
    e4m3 = out_fmt.element
    k = int(w.shape[-1])
    kp = -(-k // _CHUNK) * _CHUNK
    chunks = kp // _CHUNK
    n = int(w.shape[-2])
    lead = tuple(int(d) for d in w.shape[:-2])
    mats = 1
    for d in lead:
        mats *= d
    br = block_rows
    np_ = -(-n // br) * br  # rows stored (whole row blocks)
    dev = w.data.device
    gs = None if w.global_scale is None else w.global_scale.to(device=dev, dtype=torch.float32).reshape(())
    codes = torch.zeros((mats, np_, kp), dtype=torch.uint8, device=dev)
    scales = torch.empty((mats, np_ // br, chunks), dtype=torch.float32, device=dev)
    step = max(br, max(1, rows_per_pass) // br * br)  # (a pass covers whole row blocks)
    inexact, first = 0, None
    for m in range(mats):
        for n0 in range(0, n, step):
            n1 = min(n, n0 + step)
            u = _unscaled(w, slice(m * n + n0, m * n + n1), kp)
            if not bool(torch.isfinite(u if gs is None else u * gs).all()):
                raise ValueError(f"fold_fp8: {name} holds NaN or Inf values (rows {m * n + n0}..{m * n + n1 - 1}); "
                                 "fp8 block scales cannot carry them")
            u = torch.nn.functional.pad(u, (0, 0, 0, (-u.shape[0]) % br))  # (zero rows: exact at any scale)
            rb = u.shape[0] // br
            # blocks [rb, chunks, br x 128]: a block's rows and columns side by side
            ub = u.view(rb, br, chunks, _CHUNK).permute(0, 2, 1, 3).reshape(rb * chunks, br * _CHUNK)
            c, sc, bad = _fold_blocks(ub, gs, e4m3)
            nbad = int(bad.sum())
            if nbad:
                if first is None:
                    i = int(bad.nonzero()[0, 0])
                    r = m * n + n0 + (i // chunks) * br
                    first = (r, min(r + br, m * n + n), (i % chunks) * _CHUNK, min(k, (i % chunks + 1) * _CHUNK))
                inexact += nbad
            codes[m, n0:n0 + rb * br] = c.view(rb, chunks, br, _CHUNK).permute(0, 2, 1, 3).reshape(rb * br, kp)
            scales[m, n0 // br:n0 // br + rb] = sc.view(rb, chunks)
    if inexact and not allow_lossy:
        r0, r1, c0, c1 = first
        what = "chunks (128 elements of a row)" if br == 1 else f"blocks ({br} x 128 elements)"
        rows = f"row {r0}" if br == 1 else f"rows {r0}:{r1}"
        raise ValueError(
            f"fold_fp8: {inexact} of {mats * (np_ // br) * chunks} {what} of {name} ({w.fmt.name}, "
            f"shape {tuple(w.shape)}) are not exact in E4M3 under one power-of-two scale (their values span more "
            f"than E4M3's range); the first is {rows}, columns {c0}:{c1}. Keep this weight in {w.fmt.name} (the "
            f"exact kernels){', fold it with block_rows=1' if br > 1 else ''}, or pass allow_lossy=True to round "
            "those blocks to nearest E4M3")
    meta = {key: v for key, v in w.meta.items() if key not in _SOURCE_ONLY}
    meta.update(folded_from=w.fmt.name, inexact_chunks=inexact)
    return QTensor(codes.reshape(*lead, np_, kp), scales.reshape(*lead, np_ // br, chunks), out_fmt,
                   torch.Size(w.shape), w.dtype, None, None, meta)
