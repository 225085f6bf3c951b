"""The split-K kernel's weight layout: :func:`prepare` repacks a canonical QTensor ``[N, K]``
into a :class:`PackedLinearWeight` (the QTensor itself is never modified).

* ``codes``: int32 ``[N, KP*CB/32]``, codes in containers of ``CB`` bits (4 for codes of <= 4
  bits, 8 otherwise), K zero-padded to ``KP`` (a multiple of 256, or of the block if larger) and
  permuted within tiles of 8 words: element ``j*16 + 2*w + h`` of a tile is in word ``w``, slot
  ``j + h*S/2`` (``S = 32/CB`` slots per word).
* ``scales``: the raw block scales, each row zero-padded to ``KP/block`` entries and whole int32
  words, viewed as int32; ``zero_points`` likewise; ``global_scale`` as in the QTensor.
* ``specials``: whether any code is a NaN/Inf encoding (scanned once); only then does the kernel
  spend selects on them.
"""
from __future__ import annotations

import functools

import json
from dataclasses import dataclass

import torch

from ..formats import Format, pack_codes, unpack_codes
from ..formats.kinds import scale_kind
from ..qtensor import QTensor
from .eligibility import OP
from .weight_state import has_specials, state


@dataclass
class PackedLinearWeight:
    """A QTensor ``[N, K]`` repacked for the linear kernels (see the module docstring)."""

    fmt: Format
    n: int
    k: int
    container_bits: int
    codes: torch.Tensor
    scales: torch.Tensor
    zero_points: torch.Tensor | None
    global_scale: torch.Tensor | None
    specials: bool

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def nbytes(self) -> int:
        t = [self.codes, self.scales, self.zero_points, self.global_scale]
        return sum(x.numel() * x.element_size() for x in t if x is not None)

    def constexprs(self) -> dict:
        """The format as kernel ``tl.constexpr`` parameters."""
        return format_constexprs(self.fmt, self.specials)

    def to_qtensor(self) -> QTensor:
        """Inverse of :func:`prepare` (the canonical QTensor)."""
        fmt = self.fmt
        codes = unpermute_codes(self.codes.contiguous().view(torch.uint8), self.container_bits, self.k)
        data = pack_codes(codes, fmt.element.bits)
        sb = torch.empty((), dtype=fmt.scale.storage).element_size()
        groups = self.k // fmt.block_size
        scales = self.scales.contiguous().view(torch.uint8)[:, : groups * sb].contiguous().view(fmt.scale.storage)
        zp = None if self.zero_points is None else \
            self.zero_points.contiguous().view(torch.uint8)[:, :groups].contiguous()
        return QTensor(data, scales, fmt, torch.Size((self.n, self.k)), torch.bfloat16,
                       self.global_scale, zp)


def format_constexprs(fmt: Format, specials: bool) -> dict:
    """The decoders' constexprs for ``fmt`` (a fresh dict; worked out once per format, ~15 µs a call)."""
    return dict(_format_constexprs(fmt, bool(specials)))


@functools.lru_cache(maxsize=None)
def _format_constexprs(fmt: Format, specials: bool) -> dict:
    el = fmt.element
    bits = el.bits
    if el.kind == "float":
        elem_c = 2.0 ** (127 - el.bias)
        nan_mag = min(el.nan_codes) if el.nan_codes else -1
        if el.nan_codes and set(el.nan_codes) != set(range(nan_mag, 1 << (bits - 1))):
            raise NotImplementedError(f"{OP}: element {el.name}: NaN codes {el.nan_codes} are not the top "
                                      "magnitudes; the kernel cannot decode them")
        inf_mag = el.inf_code if el.inf_code is not None else -1
    else:
        elem_c = 2.0 ** (-el.frac_bits)
        nan_mag = inf_mag = -1
    return dict(
        BITS=bits, CB=4 if bits <= 4 else 8, IS_FLOAT=el.kind == "float", MBITS=el.mbits, SIGNED=el.signed,
        ELEM_C=elem_c, SPECIALS=bool(specials), INF_MAG=inf_mag, NAN_MAG=nan_mag,
        SCALE_KIND=int(scale_kind(fmt)), SB=torch.empty((), dtype=fmt.scale.storage).element_size(),
        GROUP=fmt.block_size, GROUP_ROWS=fmt.block_rows,
        HAS_ZP=fmt.zero_point, HAS_GS=fmt.global_scale,
    )


def tile_k(cb: int) -> int:
    """Elements per layout tile: 8 int32 words."""
    return 8 * (32 // cb)


def k_align(fmt: Format) -> int:
    """K is padded (zero codes) to a multiple of this: 256 elements, or the block if larger."""
    return max(256, fmt.block_size)


def pad_words(t: torch.Tensor, entries: int) -> torch.Tensor:
    """Rows of ``entries`` entries (zero-padded), as raw bytes padded to whole int32 words."""
    t = t.contiguous()
    if t.shape[1] < entries:
        t = torch.nn.functional.pad(t.view(torch.uint8) if t.element_size() == 1 else t, (0, entries - t.shape[1]))
    raw = t.contiguous().view(torch.uint8)
    pad = (-raw.shape[1]) % 4
    if pad:
        raw = torch.nn.functional.pad(raw, (0, pad))
    return raw.contiguous().view(torch.int32)


def permute_codes(codes_u8: torch.Tensor, cb: int, kp: int) -> torch.Tensor:
    """Natural-order codes [N, K] -> kernel layout bytes [N, KP*cb/8] (K padded with zero
    codes to whole tiles). Within a tile of 8 words, element ``j*16 + 2*w + h`` goes to
    word ``w``, slot ``j + h*S/2`` (S = 32/cb slots per word): one shift of a word then
    yields the K-adjacent pair (2w, 2w+1) of chunk j as the two halves of a bf16x2."""
    n, k = codes_u8.shape
    s = 32 // cb
    tk = tile_k(cb)
    c = torch.nn.functional.pad(codes_u8, (0, kp - k)) if kp != k else codes_u8
    c = c.reshape(n, kp // tk, s // 2, 8, 2).permute(0, 1, 3, 4, 2).reshape(n, kp)
    return pack_codes(c.contiguous(), cb)


def unpermute_codes(raw: torch.Tensor, cb: int, k: int) -> torch.Tensor:
    """Inverse of :func:`permute_codes`: natural-order codes [N, K]."""
    n = raw.shape[0]
    s = 32 // cb
    tk = tile_k(cb)
    kp = raw.shape[1] * 8 // cb
    c = unpack_codes(raw, cb, kp).reshape(n, kp // tk, 8, 2, s // 2).permute(0, 1, 4, 2, 3).reshape(n, kp)
    return c[:, :k].contiguous()


def prepare(q: QTensor) -> PackedLinearWeight:
    """Repack a 2-D QTensor ``[N, K]`` into the kernel layout (once, at load time)."""
    if isinstance(q, PackedLinearWeight):
        return q
    if not isinstance(q, QTensor):
        raise TypeError(f"{OP}: qweight must be a QTensor or PackedLinearWeight, got {type(q).__name__}")
    fmt = q.fmt
    if len(q.shape) != 2:
        raise ValueError(f"{OP}: qweight must be 2-D [N, K], got shape {tuple(q.shape)}")
    if tuple(q.padded_shape) != tuple(q.shape):
        raise ValueError(f"{OP}: qweight of shape {tuple(q.shape)} was padded to {tuple(q.padded_shape)}; "
                         f"K and N must be multiples of the {fmt.name} block ({fmt.block_rows}x{fmt.block_size})")
    n, k = (int(s) for s in q.shape)
    bits = fmt.element.bits
    cb = 4 if bits <= 4 else 8
    codes_u8 = unpack_codes(q.data.contiguous(), bits, k)
    specials = has_specials(q, codes_u8)  # no host sync while a graph is captured
    kp = -(-k // k_align(fmt)) * k_align(fmt)
    codes = permute_codes(codes_u8, cb, kp).view(torch.int32)
    groups = kp // fmt.block_size
    scales = q.scales.contiguous()
    if scales.dtype == torch.float8_e4m3fn:
        scales = scales.view(torch.uint8)
    scales = pad_words(scales, groups)
    gs = None if q.global_scale is None else q.global_scale.reshape(1).to(torch.float32).contiguous()
    zp = None if q.zero_points is None else pad_words(q.zero_points, groups)
    fmt_json(fmt)  # cached now: json.dumps is not traceable by every torch.compile (2.11)
    return PackedLinearWeight(fmt, n, k, cb, codes, scales, zp, gs, specials)


@torch.compiler.disable
def cached_prepare(q: QTensor | PackedLinearWeight) -> PackedLinearWeight:
    """:func:`prepare` once per weight version: the packed weight is kept in the weight's state
    (:mod:`microscale.linear.weight_state`), so its holder owns it."""
    if isinstance(q, PackedLinearWeight):
        return q
    if not isinstance(q, QTensor):
        raise TypeError(f"{OP}: qweight must be a QTensor or PackedLinearWeight, got {type(q).__name__}")
    return state(q).fact(q, "packed", lambda: prepare(q))


FMT_JSON: dict = {}


def fmt_json(fmt: Format) -> str:
    s = FMT_JSON.get(fmt)
    if s is None:
        s = FMT_JSON[fmt] = json.dumps(fmt.to_dict(), sort_keys=True)
    return s
