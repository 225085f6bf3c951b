"""Per-weight facts of the linear op, computed once and kept in one declared object.

A :class:`WeightState` holds what the routes derive from a QTensor weight: the views its
kernels take, the scans that decide eligibility and decode variants (NaN/Inf codes, the
E8M0 scale window, ...), the packed weight of the split-K kernel, the TMA descriptors and
step-major scales of ``decode_tma``, the eager call plans and the cached routes of repeat calls
(:mod:`microscale.linear.route_cache`).

One invalidation rule: a state is valid while the address, version and device of each of the
weight's tensors (:func:`weight_key`) are those it was made for; any in-place change through
torch (or a new tensor) gives a fresh state. The state rides on the QTensor (one attribute), so
its holder owns it and it dies with the weight.

While a CUDA graph is being captured nothing is kept: what a captured call computes (a packed
weight, step-major scales) is only written when that graph replays, so a kept copy would be read
uninitialized by eager calls and by other graphs; and a scan (a host sync, which a capture
refuses) that no eager call made answers its conservative default instead.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats import Format, unpack_codes
from ..qtensor import QTensor

__all__ = ["WeightState", "WeightViews", "state", "kept", "kept_facts", "weight_key", "capturing", "views", "views_hit", "has_specials",
           "e8m0_window", "e8m0_range", "ue4m3_normal", "f16_scale_max", "zero_point_max", "INT_VIEW"]

_SLOT = "_ms_linear_state"  # the one attribute a QTensor carries for the linear op
_UNSET = object()
INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def capturing(t: torch.Tensor | None) -> bool:
    """Whether a CUDA graph is being captured on the current stream of ``t``'s device."""
    return t is not None and t.is_cuda and torch.cuda.is_current_stream_capturing()


def weight_key(q: QTensor) -> tuple:
    """Address and version of each of ``q``'s tensors and their device: what a state is valid for."""
    return (q.data.device,) + tuple((t.data_ptr(), t._version) if t is not None else None
                                    for t in (q.data, q.scales, q.zero_points, q.global_scale))


class WeightState:
    """The facts of one weight version (see the module docstring). ``facts`` maps a fact's name
    (a string, or a tuple for facts with parameters) to its value; ``plans`` the eager call plans
    (:mod:`microscale.linear.plans`) by call key; ``routes`` the recorded routes of repeat calls
    (:mod:`microscale.linear.route_cache`) by call key."""

    __slots__ = ("key", "facts", "plans", "routes")

    def __init__(self, key: tuple):
        self.key = key
        self.facts: dict = {}
        self.plans: dict = {}
        self.routes: dict = {}

    def fact(self, q: QTensor, name, make, while_capturing=_UNSET):
        """``make()`` once. While a CUDA graph is being captured a fact not yet known is
        ``while_capturing`` when given (a scan, which would sync the host), else made for the
        call and not kept."""
        v = self.facts.get(name, _UNSET)
        if v is not _UNSET:
            return v
        cap = capturing(q.data)
        if cap and while_capturing is not _UNSET:
            return while_capturing
        v = make()
        if not cap:
            self.facts[name] = v
        return v


def state(q: QTensor) -> WeightState:
    """``q``'s valid state: the kept one, or a fresh one (kept unless a CUDA graph is being captured)."""
    key = weight_key(q)
    st = q.__dict__.get(_SLOT)
    if st is not None and st.key == key:
        return st
    st = WeightState(key)
    if not capturing(q.data):
        q.__dict__[_SLOT] = st
    return st


def kept(q: QTensor) -> WeightState | None:
    """``q``'s kept state if it is valid (nothing is made)."""
    st = q.__dict__.get(_SLOT)
    return st if st is not None and st.key == weight_key(q) else None


def kept_facts(q: QTensor, name: str) -> list:
    """The parameters of the kept facts called ``name`` (facts with parameters are kept under
    ``(name, *parameters)``); empty when none is kept."""
    st = kept(q)
    if st is None:
        return []
    return [k[1:] for k in st.facts if isinstance(k, tuple) and k[0] == name] + ([()] if name in st.facts else [])


@dataclass(frozen=True)
class WeightViews:
    """The views of a QTensor's tensors that the decode kernels take."""

    words: torch.Tensor  # codes as int32 words
    scales_int: torch.Tensor  # scales as an integer view of their width
    scales_u8: torch.Tensor | None  # 1-byte scales as uint8
    zero_points: torch.Tensor | None
    global_scale: torch.Tensor | None  # float32 [1]


def _make_views(q: QTensor) -> WeightViews:
    sc = q.scales.contiguous()
    return WeightViews(q.data.contiguous().view(torch.int32), sc.view(INT_VIEW[sc.element_size()]),
                       sc.view(torch.uint8) if sc.element_size() == 1 else None,
                       None if q.zero_points is None else q.zero_points.contiguous(),
                       None if q.global_scale is None else q.global_scale.reshape(1).to(torch.float32).contiguous())


def views(q: QTensor, st: WeightState | None = None) -> WeightViews:
    """The views of ``q``'s tensors the decode kernels take (each view is a torch call: made once)."""
    st = st or state(q)
    return st.fact(q, "views", lambda: _make_views(q))


def views_hit(q: QTensor, st: WeightState | None = None) -> tuple[WeightViews, bool]:
    """:func:`views` and whether they were kept from an earlier call: False on a weight's first use
    and after any in-place change of its tensors (when kernels still in flight may be writing them,
    so the GEMV must not read them ahead of its programmatic-launch wait)."""
    st = st or state(q)
    hit = "views" in st.facts
    return views(q, st), hit


def codes_have_specials(codes_u8: torch.Tensor, fmt: Format) -> bool:
    """Whether codes (one per byte) hold a NaN/Inf encoding of ``fmt``'s element."""
    el = fmt.element
    if el.kind != "float" or not (el.nan_codes or el.inf_code is not None):
        return False
    mag = codes_u8 & ((1 << (el.bits - 1)) - 1)
    lo = min(list(el.nan_codes) + ([el.inf_code] if el.inf_code is not None else []))
    return bool((mag >= lo).any())


def has_specials(q: QTensor, codes_u8: torch.Tensor | None = None) -> bool:
    """Whether ``q``'s codes hold a NaN/Inf encoding (one host sync, once); assumed while a CUDA
    graph is captured unscanned (the kernels' NaN/Inf-aware decode is right for any codes).
    ``codes_u8``: ``q``'s codes already unpacked to one per byte."""
    el = q.fmt.element
    if el.kind != "float" or not (el.nan_codes or el.inf_code is not None):
        return False

    def scan() -> bool:
        u8 = codes_u8 if codes_u8 is not None else unpack_codes(q.data.contiguous().view(torch.uint8), el.bits,
                                                                int(q.shape[-1]))
        return codes_have_specials(u8, q.fmt)

    return state(q).fact(q, "specials", scan, True)


def e8m0_window(q: QTensor) -> int | None:
    """``D`` for E8M0 block scales (all scale exponents within ``[D + 2, D + 128]`` and none NaN),
    or None; None while a CUDA graph is captured unscanned."""
    def scan() -> int | None:
        s = q.scales
        if not s.numel():
            return None
        lo, hi = (int(v) for v in torch.aminmax(s.view(torch.uint8).reshape(-1)))
        return hi - 128 if hi < 255 and lo >= hi - 126 else None

    return state(q).fact(q, "e8m0_window", scan, None)


def live_blocks(q: QTensor, blocks: int) -> torch.Tensor:
    """bool ``[blocks]``: which of ``q``'s blocks (in the scales' row-major order) hold a nonzero code
    (for float elements, ``+-0`` count as zero)."""
    el = q.fmt.element
    codes = unpack_codes(q.data.contiguous().view(torch.uint8), el.bits, int(q.shape[-1]))
    if el.kind == "float":  # +-0 (sign bit alone)
        codes = codes & ((1 << (el.bits - 1)) - 1)
    return (codes.reshape(blocks, -1) != 0).any(dim=1)


def e8m0_range(q: QTensor) -> tuple[int, int] | None:
    """``(least, largest)`` E8M0 scale byte of ``q``'s blocks, the least over the blocks that hold a
    nonzero code (the quantizer gives all-zero blocks the byte 0; the f16 decode flushes scales below
    its window to zero, which leaves those blocks right); None with a NaN byte (255) or no scales, and
    while a CUDA graph is captured unscanned."""
    def scan() -> tuple[int, int] | None:
        b = q.scales.view(torch.uint8).reshape(-1)
        if not b.numel() or int(b.max()) == 255:
            return None
        live = live_blocks(q, b.numel())
        lo = int(torch.where(live, b, 255).min())
        return (min(lo, int(b.max())), int(b.max()))

    return state(q).fact(q, "e8m0_range", scan, None)


def ue4m3_normal(q: QTensor) -> bool:
    """Whether ``q``'s UE4M3 block scales are all normal (bytes 8..126) but in blocks whose codes are all
    zero, where bytes 0..7 may stand too (none with the sign bit or NaN: the multiply-add makes Inf of
    0x80..0x87, and zero times Inf is NaN): then the bf16 decodes make the scale by one multiply-add
    (``_prefill_gluon.UE4M3_MUL``). False while a CUDA graph is captured unscanned."""
    def scan() -> bool:
        b = q.scales.view(torch.uint8).reshape(-1)
        if not b.numel():
            return True
        if bool(((b == 127) | (b >= 0x80)).any()):  # NaN, or a sign bit: the asm conversion for those
            return False
        low = b < 8
        if not bool(low.any()):
            return True
        live = live_blocks(q, b.numel())
        return not bool((live & low).any())

    return state(q).fact(q, "ue4m3_normal", scan, False)


def f16_scale_max(q: QTensor) -> float | None:
    """The largest ``|s|`` of ``q``'s fp16 block scales (inf where one is not finite); None while a
    CUDA graph is captured unscanned."""
    def scan() -> float:
        s = q.scales
        return float(s.float().abs().max()) if s.numel() else 0.0

    return state(q).fact(q, "f16_scale_max", scan, None)


def zero_point_max(q: QTensor) -> int | None:
    """The largest zero point of an affine weight; None while a CUDA graph is captured unscanned."""
    def scan() -> int:
        z = q.zero_points
        return int(z.max()) if z.numel() else 0

    return state(q).fact(q, "zero_point_max", scan, None)
