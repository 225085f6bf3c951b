"""Expert weights for the grouped kernel: a 3-D QTensor ``[E, N, K]`` repacked per expert into the
linear op's split-K layout (:func:`microscale.linear.packed.prepare`) and stacked, once per weight
version (kept in the weight's state, :mod:`microscale.linear.weight_state`). The QTensor itself keeps
its canonical layout and is never modified.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..formats import Format
from ..linear.packed import PackedLinearWeight, fmt_json, format_constexprs, prepare
from ..linear.weight_state import state
from ..qtensor import QTensor

OP = "microscale.grouped_linear"


@dataclass
class PackedExperts:
    """Stacked :class:`~microscale.linear.PackedLinearWeight` tensors: ``codes`` int32
    ``[E, N, KW]``, ``scales`` int32 ``[E, N/block_rows, SW]``, ``zero_points`` like scales or
    None, one ``global_scale`` (float32 ``[1]``) for all experts or None. For E2M1 weights the
    decode path's tensor-core kernel takes (:func:`mma_operand`): ``words`` (the QTensor's own
    codes as int32 ``[E, N, K/8]``, a view), ``wscales`` (its scale bytes ``[E, N, K/block]``) and
    ``mma`` = (scale kind, E8M0 input, power of two of the epilogue); else None."""

    fmt: Format
    e: int
    n: int
    k: int
    container_bits: int
    codes: torch.Tensor
    scales: torch.Tensor
    zero_points: torch.Tensor | None
    global_scale: torch.Tensor | None
    specials: bool
    words: torch.Tensor | None = None
    wscales: torch.Tensor | None = None
    mma: tuple[int, int, int] | None = None

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def nbytes_per_expert(self) -> int:
        """Bytes the kernel reads per expert (codes, scales, zero points)."""
        t = [self.codes, self.scales, self.zero_points]
        return sum(x[0].numel() * x.element_size() for x in t if x is not None)

    def constexprs(self) -> dict:
        return format_constexprs(self.fmt, self.specials)

    def expert(self, i: int) -> PackedLinearWeight:
        """Expert ``i`` as the linear op's packed weight (views)."""
        zp = None if self.zero_points is None else self.zero_points[i]
        return PackedLinearWeight(self.fmt, self.n, self.k, self.container_bits, self.codes[i], self.scales[i], zp,
                                  self.global_scale, self.specials)

    def dense(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Decoded weights ``[E, N, K]`` (the reference's view; slow)."""
        return torch.stack([self.expert(i).to_qtensor().dequantize(dtype) for i in range(self.e)])


def check_experts(q: QTensor, name: str = "w") -> None:
    if not isinstance(q, QTensor):
        raise TypeError(f"{OP}: {name} must be a QTensor [E, N, K], got {type(q).__name__}")
    if len(q.shape) != 3:
        raise ValueError(f"{OP}: {name} must be 3-D [E, N, K], got shape {tuple(q.shape)}")
    if tuple(q.padded_shape[-1:]) != tuple(q.shape[-1:]) or q.shape[1] % q.fmt.block_rows:
        raise ValueError(f"{OP}: {name} of shape {tuple(q.shape)}: K and N must be multiples of the "
                         f"{q.fmt.name} block ({q.fmt.block_rows}x{q.fmt.block_size})")


def mma_operand(q: QTensor) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int]] | None:
    """``(words, scale bytes, (scale kind, E8M0 input, epilogue exponent))`` of a 3-D E2M1 weight for
    the decode path's tensor-core kernel (the linear op's ``gemv_mma`` decode, exact bf16 products),
    or None where it does not apply: codes other than E2M1 with UE4M3 (16) or E8M0 (32) block scales,
    K not a multiple of 64, E8M0 scales wider than its window (see
    :func:`microscale.linear.weight_state.e8m0_window`), or a scan not possible (CUDA graph capture)."""
    from ..linear.backends.gemv_mma import gemv_mma_scale_args
    from ..linear.weight_state import e8m0_window

    f = q.fmt
    el = f.element
    if not (el.kind == "float" and (el.bits, el.mbits, el.bias) == (4, 1, 1) and not f.zero_point
            and f.block_rows == 1 and (f.scale.name, f.block_size) in (("ue4m3", 16), ("e8m0", 32))):
        return None
    e, n, k = (int(v) for v in q.shape)
    if k % 64 or tuple(q.scales.shape) != (e, n, k // f.block_size):
        return None
    if f.scale.name == "e8m0" and e8m0_window(q) is None:
        return None
    sk, ke, post = gemv_mma_scale_args(q)
    words = q.data.contiguous().view(torch.int32)
    sb = q.scales.contiguous().view(torch.uint8)
    if words.data_ptr() % 16 or sb.data_ptr() % 4:
        return None
    return words, sb, (sk, ke, int(math.log2(post)))


def prepare_experts(q: QTensor) -> PackedExperts:
    """Repack a 3-D QTensor ``[E, N, K]`` for the grouped kernel (load time; one repack per expert),
    with the decode path's view of E2M1 weights (:func:`mma_operand`)."""
    check_experts(q)
    e, n, k = (int(s) for s in q.shape)
    parts = []
    for i in range(e):
        zp = None if q.zero_points is None else q.zero_points[i]
        sub = QTensor(q.data[i], q.scales[i], q.fmt, torch.Size((n, k)), q.dtype, q.global_scale, zp, dict(q.meta))
        parts.append(prepare(sub))
    stack = lambda name: None if getattr(parts[0], name) is None else \
        torch.stack([getattr(p, name) for p in parts]).contiguous()  # noqa: E731
    fmt_json(q.fmt)
    mo = mma_operand(q)
    return PackedExperts(q.fmt, e, n, k, parts[0].container_bits, stack("codes"), stack("scales"),
                         stack("zero_points"), parts[0].global_scale, any(p.specials for p in parts),
                         *(mo if mo is not None else (None, None, None)))


@torch.compiler.disable
def cached_prepare_experts(q: QTensor | PackedExperts) -> PackedExperts:
    """:func:`prepare_experts` once per weight version, kept in the weight's state."""
    if isinstance(q, PackedExperts):
        return q
    check_experts(q)
    return state(q).fact(q, "moe_packed", lambda: prepare_experts(q))
