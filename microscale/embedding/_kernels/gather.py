"""The embedding gather kernel: rows of a quantized ``[V, K]`` table picked by token ids and
dequantized in the same pass, bit-identical to :func:`microscale.reference.dequantize` of the
gathered rows. Element and scale decoding are the quant family's (``_decode``, ``_scale_decode``)."""
from __future__ import annotations

import triton
import triton.language as tl

from ...quant._kernels.common import _cast
from ...quant._kernels.elements import _decode
from ...quant._kernels.scales import _scale_decode


@triton.jit
def _embedding_kernel(
    ids_ptr, data_ptr, scale_ptr, zp_ptr, gscale_ptr, out_ptr, flag_ptr, T, V, K, KO, SC,
    TR: tl.constexpr, TK: tl.constexpr, B: tl.constexpr, BR: tl.constexpr,
    BITS: tl.constexpr, IS_INT: tl.constexpr, SIGNED: tl.constexpr, STEP: tl.constexpr,
    MBITS: tl.constexpr, POW: tl.constexpr, NAN_MIN: tl.constexpr, INF_CODE: tl.constexpr,
    SCALE_KIND: tl.constexpr, HAS_ZP: tl.constexpr, HAS_GLOBAL: tl.constexpr, MANUAL_BF16: tl.constexpr,
    WORD32: tl.constexpr = False,
):
    """out[t, :KO] = dequantize(table)[ids[t], :KO] for a ``[TR, TK]`` tile of tokens x columns.

    An id outside ``[0, V)`` reads nothing: its row is written as NaN and ``flag`` is set to 1
    (the host raises on it). ``K`` is the stored (block-padded) row length, ``KO`` the output's.
    ``WORD32``: ``data_ptr`` is the codes viewed as int32 words (rows a whole number of words), read a
    word at a time (sm_90: 17.2 instead of 21.8 SASS instructions an element for NVFP4 with the split
    store below, 15.8 for MXFP4; the gather runs at the same element rate for every format, so its
    instructions, not its bytes, set the pace)."""
    PACK_WORD: tl.constexpr = (8 % BITS) != 0  # 3-, 5-, 6-bit codes: 8 codes in BITS bytes
    G: tl.constexpr = 8 if PACK_WORD else 8 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    NB: tl.constexpr = TK // B

    toks = tl.program_id(0) * TR + tl.arange(0, TR)
    tmask = toks < T
    ids = tl.load(ids_ptr + toks, mask=tmask, other=0).to(tl.int64)
    bad = tmask & ((ids < 0) | (ids >= V))
    tl.atomic_max(flag_ptr + tl.zeros([TR], tl.int32), bad.to(tl.int32), mask=bad)
    ok = tmask & ~bad
    rows = tl.where(ok, ids, 0)
    k0 = tl.program_id(1) * TK
    cols = k0 + tl.arange(0, TK)
    if PACK_WORD:
        grp = (k0 // 8) + tl.arange(0, TK // 8)
        j = tl.arange(0, 8)
        boff = rows[:, None, None] * ((K // 8) * BITS) + grp[None, :, None] * BITS + j[None, None, :]
        bmask = ok[:, None, None] & (grp * 8 < K)[None, :, None] & (j < BITS)[None, None, :]
        byts = tl.load(data_ptr + boff, mask=bmask, other=0).to(tl.int64)
        word = tl.sum(byts << (j * 8).to(tl.int64)[None, None, :], axis=2)
        codes = ((word[:, :, None] >> (j * BITS).to(tl.int64)[None, None, :]) & MASK).to(tl.int32)
    elif WORD32:  # 4 * G codes a word
        CW: tl.constexpr = 4 * G
        wcols = (k0 // CW) + tl.arange(0, TK // CW)
        words = tl.load(data_ptr + rows[:, None] * (K // CW) + wcols[None, :],
                        mask=ok[:, None] & (wcols * CW < K)[None, :], other=0)
        codes = (words[:, :, None] >> (tl.arange(0, CW) * BITS)[None, None, :]) & MASK
    else:
        bcols = (k0 // G) + tl.arange(0, TK // G)
        byts = tl.load(data_ptr + rows[:, None] * (K // G) + bcols[None, :],
                       mask=ok[:, None] & (bcols * G < K)[None, :], other=0).to(tl.int32)
        if G == 1:
            codes = byts
        else:
            codes = (byts[:, :, None] >> (tl.arange(0, G) * BITS)[None, None, :]) & MASK
    v = _decode(tl.reshape(codes, [TR, TK]), BITS, IS_INT, SIGNED, STEP, MBITS, POW, NAN_MIN, INF_CODE)
    vb = tl.reshape(v, [TR, NB, B])
    scol = (k0 // B) + tl.arange(0, NB)
    smask = ok[:, None] & (scol * B < K)[None, :]
    soff = (rows // BR)[:, None] * SC + scol[None, :]  # 2-D blocks: BR table rows share a scale row
    s = _scale_decode(tl.load(scale_ptr + soff, mask=smask, other=0), SCALE_KIND)
    if HAS_ZP:
        zp = tl.load(zp_ptr + soff, mask=smask, other=0).to(tl.float32)
        vb = vb - zp[:, :, None]
    out = vb * s[:, :, None]
    if HAS_GLOBAL:
        out = out * tl.load(gscale_ptr)
    out = tl.reshape(out, [TR, TK])
    # the good rows, then the NaN rows of bad ids: two predicated stores instead of a select an element
    optr = out_ptr + toks.to(tl.int64)[:, None] * KO + cols[None, :]
    cm = (cols < KO)[None, :]
    tl.store(optr, _cast(out, out_ptr.dtype.element_ty, MANUAL_BF16), mask=ok[:, None] & cm)
    tl.store(optr, _cast(tl.full([TR, TK], float("nan"), tl.float32), out_ptr.dtype.element_ty, MANUAL_BF16),
             mask=bad[:, None] & cm)
