"""The global amax of dynamic two-level quantization, reduced on the GPU without a host
sync: per-program (or one atomic) maxima of the finite elements' bits, and the decode /
encode global scales computed from them inside the quantize kernel."""
from __future__ import annotations

import triton
import triton.language as tl

from .common import _bits, _flt, _isfinite, _to_f32


@triton.jit
def _finite_amax_partials_kernel(x_ptr, part_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr,
                                 ATOMIC: tl.constexpr = False):
    """``part[pid]`` = float32 bits of max |x| over the finite elements of this program's
    ``ITERS`` consecutive chunks of ``BLOCK`` elements (non-negative float bits order as ints).
    ``ATOMIC``: instead, an atomic max of those bits into ``part[0]`` (zeroed by the caller;
    max is order-independent, so the result is the same in any order)."""
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * (BLOCK * ITERS)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in tl.static_range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        x = _to_f32(tl.load(x_ptr + offs, mask=offs < n, other=0.0))
        b = _bits(x) & 0x7FFFFFFF
        acc = tl.maximum(acc, tl.where(b < 0x7F800000, b, 0))
    if ATOMIC:
        tl.atomic_max(part_ptr, tl.max(acc, axis=0))
    else:
        tl.store(part_ptr + pid, tl.max(acc, axis=0))


@triton.jit
def _global_from_partials(part_ptr, n_part, TWO_LEVEL: tl.constexpr, NP: tl.constexpr):
    """(s_dec, gs) from the partial maxima: ``reference.nvfp4_global_scale`` /
    ``compressed_tensors_global_scale``."""
    if NP == 1:  # one (atomically reduced) maximum
        amax = _flt(tl.load(part_ptr))
    else:
        o = tl.arange(0, NP)
        amax = _flt(tl.max(tl.load(part_ptr + o, mask=o < n_part, other=0), axis=0))
    if TWO_LEVEL == 3:
        # torch evaluates ``2688.0 / t`` as ``t.reciprocal() * 2688.0`` (two roundings)
        gs = tl.math.div_rn(1.0, tl.maximum(amax, 1.1754943508222875e-38)) * 2688.0
        gs = tl.where(_isfinite(gs) & (amax > 0), gs, 1.0)
        s = tl.math.div_rn(1.0, gs)
    else:
        s = tl.where(amax > 0, tl.math.div_rn(amax, 2688.0), 1.0)
        gs = tl.math.div_rn(1.0, s)
    return s, gs
