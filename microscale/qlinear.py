"""Fused weight-only linear: ``out = x @ dequant(W)^T (+ bias)``.

``W`` is a :class:`~microscale.QTensor` ``[N, K]`` in any registered format; ``x`` is
bfloat16 or float16 ``[..., K]``; the output has x's dtype and shape ``[..., N]``.

Use::

    import microscale as ms
    from microscale.qlinear import linear, prepare
    pw = prepare(q)              # once, at load time; the holder of the weight keeps it
    y = linear(x, pw, bias)      # or linear(x, q): prepares (and caches on q) itself

:func:`prepare` repacks the canonical QTensor into the kernel layout
(:class:`PackedLinearWeight`); the QTensor itself is never modified. Kernel layout:

* ``codes`` — int32 ``[N, KP*CB/32]``: codes in containers of ``CB`` bits (4 for codes of
  <= 4 bits, 8 otherwise; 2/3-bit codes widen to nibbles, 5/6/7-bit codes to bytes), K
  zero-padded to ``KP`` (a multiple of 256, or of the block if larger), K permuted
  within tiles of 8 words: element ``j*16 + 2*w + h`` of a tile is in word ``w``, slot
  ``j + h*S/2`` (``S = 32/CB`` slots per word, slot ``i`` = bits ``[i*CB, i*CB + bits)``).
* ``scales`` — the raw block scales (E8M0/UE4M3 bytes, fp16/bf16/fp32 bits), each row
  zero-padded to ``KP/block`` entries and to whole int32 words, viewed as int32;
  ``[N/128, ...]`` rows for 2-D blocks.
* ``zero_points`` (affine) — likewise (bytes); ``global_scale`` (two-level) — as in the
  QTensor.
* ``specials`` — whether any code is a NaN/Inf encoding (decided by scanning the
  weight once); only then does the kernel spend selects on them.

On CUDA the op runs one Triton kernel (``microscale.kernels._linear_kernels``): weight
rows on the MMA's M side and tokens on its N side, split-K with 16 (up to 64) tokens per
tile for small M (decode), 128 or 256 tokens per tile and no split for large M (prefill). Elsewhere it runs the reference
(``x @ reference.dequantize(W)^T`` in float64). It is registered as the custom op
``torch.ops.microscale.linear`` so ``torch.compile`` and CUDA-graph capture see one
opaque node.

Decode path: :func:`linear` on a QTensor with at most ``GEMV_MAX_M`` tokens and a weight
of 4/8-bit minifloats (E2M1, E4M3, E5M2), symmetric int4/int8 or affine uint4/uint8
runs :func:`gemv` instead (``microscale.kernels._gemv_kernels``): no repack, the codes
are read in the checkpoint layout and decoded into f16x2 pairs in PTX, tokens share one
decode, activations are prepared per call (f16, one power of two per chunk).

Prefill path: :func:`linear` on a QTensor with at least ``PREFILL_MIN_M`` tokens and 4- or
8-bit codes runs :func:`prefill` (``_linear_kernels._linear_prefill_kernel``): the x tile
a plain pipelined load, the weight tile decoded from the checkpoint layout once per K
step for all tokens of the tile (minifloats with E8M0/UE4M3 scales as bf16x2 pairs); for
few tokens the weights are the MMA's register operand (tokens on its N side) and K is
split across programs. A :class:`PackedLinearWeight` (the ``torch.compile`` route)
always takes the split-K kernel.

Note: the split-K kernels keep per-split fp32 partial tiles and per-tile counters in a
workspace per (device, stream) (the counters are left zero after each call; the partials
are summed in split order, so results do not depend on scheduling); two calls racing on
one stream cannot happen, calls on different streams use different workspaces. The GEMV's
own K split (small N only) adds with float32 atomics.
"""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, replace

import torch

from . import reference
from .formats import Format, pack_codes, unpack_codes
from .runtime import launch as _kl
from .runtime.launch import cdiv, launch, next_pow2, pdl_capable
from .qtensor import QTensor

__all__ = ["linear", "prepare", "PackedLinearWeight", "LinearConfig", "choose_config", "gemv", "gemv_supported",
           "gemv_mma", "gemv_mma_supported", "GemvMmaConfig", "choose_gemv_mma_config", "with_gemv_mma_split",
           "GemvConfig", "choose_gemv_config", "GEMV_MAX_M", "prefill", "prefill_supported", "PrefillConfig",
           "choose_prefill_config", "PREFILL_MIN_M", "prefill_ws",
           "choose_prefill_ws_tile", "PREFILL_WS_MIN_M", "PREFILL_WS_MIN_M_8BIT", "PREFILL_WS_SMALL_MIN_M",
           "PREFILL_WS_SMALL_MAX_NK", "PREFILL_WS_SMALL_MAX_NK_BF16", "decode_tma", "choose_decode_tma_programs",
           "DECODE_TMA_MIN_M", "DECODE_TMA_SMALL_MIN_M", "DECODE_TMA_MAX_M", "DECODE_TMA_EAGER_MIN_NK",
           "DECODE_TMA_EAGER_MIN_M", "DECODE_TMA_MIN_M_INT4", "DECODE_TMA_MIN_M_INT4_SYM"]

_OP = "linear"
_SCALE_KIND = {"e8m0": 1, "ue4m3": 2, "fp16": 3, "bf16": 4, "fp32": 5}


# ----------------------------------------------------------------------------------
# repacked weight
# ----------------------------------------------------------------------------------
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
        return _format_constexprs(self.fmt, self.specials)

    def to_qtensor(self) -> QTensor:
        """Inverse of :func:`prepare` (the canonical QTensor)."""
        fmt = self.fmt
        codes = _unpermute_codes(self.codes.contiguous().view(torch.uint8), self.container_bits, self.k)
        data = pack_codes(codes, fmt.element.bits)
        sb = torch.empty((), dtype=fmt.scale.storage).element_size()
        groups = self.k // fmt.block_size
        scales = self.scales.contiguous().view(torch.uint8)[:, : groups * sb].contiguous().view(fmt.scale.storage)
        zp = None if self.zero_points is None else \
            self.zero_points.contiguous().view(torch.uint8)[:, :groups].contiguous()
        return QTensor(data, scales, fmt, torch.Size((self.n, self.k)), torch.bfloat16,
                       self.global_scale, zp)


def _format_constexprs(fmt: Format, specials: bool) -> dict:
    el = fmt.element
    bits = el.bits
    if el.kind == "float":
        elem_c = 2.0 ** (127 - el.bias)
        nan_mag = min(el.nan_codes) if el.nan_codes else -1
        if el.nan_codes and set(el.nan_codes) != set(range(nan_mag, 1 << (bits - 1))):
            raise NotImplementedError(f"{_OP}: element {el.name}: NaN codes {el.nan_codes} are not the top "
                                      "magnitudes; the kernel cannot decode them")
        inf_mag = el.inf_code if el.inf_code is not None else -1
    else:
        elem_c = 2.0 ** (-el.frac_bits)
        nan_mag = inf_mag = -1
    return dict(
        BITS=bits, CB=4 if bits <= 4 else 8, IS_FLOAT=el.kind == "float", MBITS=el.mbits, SIGNED=el.signed,
        ELEM_C=elem_c, SPECIALS=bool(specials), INF_MAG=inf_mag, NAN_MAG=nan_mag,
        SCALE_KIND=_SCALE_KIND[fmt.scale.name], SB=torch.empty((), dtype=fmt.scale.storage).element_size(),
        GROUP=fmt.block_size, GROUP_ROWS=fmt.block_rows,
        HAS_ZP=fmt.zero_point, HAS_GS=fmt.global_scale,
    )


def _tile_k(cb: int) -> int:
    """Elements per layout tile: 8 int32 words."""
    return 8 * (32 // cb)


def _k_align(fmt: Format) -> int:
    """K is padded (zero codes) to a multiple of this: 256 elements, or the block if larger."""
    return max(256, fmt.block_size)


def _pad_words(t: torch.Tensor, entries: int) -> torch.Tensor:
    """Rows of ``entries`` entries (zero-padded), as raw bytes padded to whole int32 words."""
    t = t.contiguous()
    if t.shape[1] < entries:
        t = torch.nn.functional.pad(t.view(torch.uint8) if t.element_size() == 1 else t, (0, entries - t.shape[1]))
    raw = t.contiguous().view(torch.uint8)
    pad = (-raw.shape[1]) % 4
    if pad:
        raw = torch.nn.functional.pad(raw, (0, pad))
    return raw.contiguous().view(torch.int32)


def _permute_codes(codes_u8: torch.Tensor, cb: int, kp: int) -> torch.Tensor:
    """Natural-order codes [N, K] -> kernel layout bytes [N, KP*cb/8] (K padded with zero
    codes to whole tiles). Within a tile of 8 words, element ``j*16 + 2*w + h`` goes to
    word ``w``, slot ``j + h*S/2`` (S = 32/cb slots per word): one shift of a word then
    yields the K-adjacent pair (2w, 2w+1) of chunk j as the two halves of a bf16x2."""
    n, k = codes_u8.shape
    s = 32 // cb
    tk = _tile_k(cb)
    c = torch.nn.functional.pad(codes_u8, (0, kp - k)) if kp != k else codes_u8
    c = c.reshape(n, kp // tk, s // 2, 8, 2).permute(0, 1, 3, 4, 2).reshape(n, kp)
    return pack_codes(c.contiguous(), cb)


def _unpermute_codes(raw: torch.Tensor, cb: int, k: int) -> torch.Tensor:
    """Inverse of :func:`_permute_codes`: natural-order codes [N, K]."""
    n = raw.shape[0]
    s = 32 // cb
    tk = _tile_k(cb)
    kp = raw.shape[1] * 8 // cb
    c = unpack_codes(raw, cb, kp).reshape(n, kp // tk, 8, 2, s // 2).permute(0, 1, 4, 2, 3).reshape(n, kp)
    return c[:, :k].contiguous()


def _has_specials(codes_u8: torch.Tensor, fmt: Format) -> bool:
    el = fmt.element
    if el.kind != "float" or not (el.nan_codes or el.inf_code is not None):
        return False
    mag = codes_u8 & ((1 << (el.bits - 1)) - 1)
    lo = min(list(el.nan_codes) + ([el.inf_code] if el.inf_code is not None else []))
    return bool((mag >= lo).any())


def _weight_has_specials(q: QTensor, codes_u8: torch.Tensor | None = None) -> bool:
    """Whether q's codes hold a NaN/Inf encoding, scanned once per codes tensor and
    version (one host sync; the answer rides on the tensor as an attribute); assumed
    while a CUDA graph is being captured and unscanned (the kernels' NaN/Inf-aware decode
    is right for any codes). ``codes_u8``: q's codes already unpacked to one per byte."""
    el = q.fmt.element
    if el.kind != "float" or not (el.nan_codes or el.inf_code is not None):
        return False

    def scan(t: torch.Tensor) -> bool:
        u8 = codes_u8 if codes_u8 is not None else unpack_codes(t.contiguous().view(torch.uint8), el.bits,
                                                                int(q.shape[-1]))
        return _has_specials(u8, q.fmt)

    return _scan_once(q.data, "_microscale_specials", scan, True)


def _capturing(t: torch.Tensor | None) -> bool:
    """Whether a CUDA graph is being captured on the current stream of ``t``'s device. While
    one is, the per-weight caches below are not filled: what a captured call computes (a
    packed weight, step-major scales) is only written when that graph replays, so a cached
    copy would be read uninitialized by eager calls and by other graphs."""
    return t is not None and t.is_cuda and torch.cuda.is_current_stream_capturing()


def _scan_once(t: torch.Tensor, attr: str, scan, capturing, also: tuple = ()):
    """``scan(t)`` once per tensor and version (a host sync on CUDA; and per version of the
    tensors ``also`` the scan reads besides ``t``), the answer kept on ``t`` as attribute
    ``attr``; ``capturing`` while a CUDA graph is captured unscanned."""
    ver = (t._version, *(a._version for a in also))
    seen = getattr(t, attr, None)
    if seen is not None and seen[0] == ver:
        return seen[1]
    if _capturing(t):
        return capturing
    ans = scan(t)
    setattr(t, attr, (ver, ans))
    return ans


def prepare(q: QTensor) -> PackedLinearWeight:
    """Repack a 2-D QTensor ``[N, K]`` into the kernel layout (once, at load time)."""
    if isinstance(q, PackedLinearWeight):
        return q
    if not isinstance(q, QTensor):
        raise TypeError(f"{_OP}: qweight must be a QTensor or PackedLinearWeight, got {type(q).__name__}")
    fmt = q.fmt
    if len(q.shape) != 2:
        raise ValueError(f"{_OP}: qweight must be 2-D [N, K], got shape {tuple(q.shape)}")
    if tuple(q.padded_shape) != tuple(q.shape):
        raise ValueError(f"{_OP}: qweight of shape {tuple(q.shape)} was padded to {tuple(q.padded_shape)}; "
                         f"K and N must be multiples of the {fmt.name} block ({fmt.block_rows}x{fmt.block_size})")
    n, k = (int(s) for s in q.shape)
    bits = fmt.element.bits
    cb = 4 if bits <= 4 else 8
    codes_u8 = unpack_codes(q.data.contiguous(), bits, k)
    specials = _weight_has_specials(q, codes_u8)  # no host sync while a graph is captured
    kp = -(-k // _k_align(fmt)) * _k_align(fmt)
    codes = _permute_codes(codes_u8, cb, kp).view(torch.int32)
    groups = kp // fmt.block_size
    scales = q.scales.contiguous()
    if scales.dtype == torch.float8_e4m3fn:
        scales = scales.view(torch.uint8)
    scales = _pad_words(scales, groups)
    gs = None if q.global_scale is None else q.global_scale.reshape(1).to(torch.float32).contiguous()
    zp = None if q.zero_points is None else _pad_words(q.zero_points, groups)
    _fmt_json(fmt)  # cached now: json.dumps is not traceable by every torch.compile (2.11)
    return PackedLinearWeight(fmt, n, k, cb, codes, scales, zp, gs, specials)


@torch.compiler.disable
def _cached_prepare(q: QTensor | PackedLinearWeight) -> PackedLinearWeight:
    """Prepare once per QTensor object: the packed weight is cached on the QTensor itself
    (keyed by the identity and version of its data), so its holder owns it."""
    if isinstance(q, PackedLinearWeight):
        return q
    if not isinstance(q, QTensor):
        raise TypeError(f"{_OP}: qweight must be a QTensor or PackedLinearWeight, got {type(q).__name__}")
    key = (_weight_key(q), q.data.device)
    hit = q.__dict__.get("_ms_linear_packed")
    if hit is not None and hit[0] == key:
        return hit[1]
    pw = prepare(q)
    if not _capturing(q.data):
        q.__dict__["_ms_linear_packed"] = (key, pw)
    return pw


# ----------------------------------------------------------------------------------
# configs
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LinearConfig:
    """Kernel config: an out^T tile of ``block_n`` weight rows x ``block_m`` tokens (the MMA's
    N side, padded to 16), ``block_kw`` int32 words of codes per row per step, K split
    ``split_k`` ways across programs."""

    block_n: int = 128
    block_m: int = 16
    block_kw: int = 32
    split_k: int = 1
    pair: bool = False  # two-elements-per-operation decode (4-bit containers, bf16 x)
    num_warps: int = 4
    num_stages: int = 4


SplitKConfig = LinearConfig  # older name


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8


def choose_config(m: int, pw: PackedLinearWeight, x_dtype: torch.dtype, device: torch.device) -> LinearConfig:
    """The heuristic, per M bucket. Decode (m <= 64): 16..64 tokens on the N side, K split
    so about four programs per SM stream the weight. Prefill: 128 or 256 tokens per tile,
    each weight tile decoded once per K-strip for all of them, no split."""
    n = pw.n
    cb = pw.container_bits
    kw = pw.codes.shape[1]
    pair = cb == 4 and x_dtype == torch.bfloat16
    bn = 128 if n >= 128 else 64
    if m <= 64:
        bm = max(16, next_pow2(m))
        bkw = 32 if cb == 4 else 64
        tiles = math.ceil(n / bn) * math.ceil(m / bm)
        want = 4 * _num_sms(device)
        split = max(1, min(math.ceil(want / tiles), kw // bkw))
        # (8-bit containers with 64 tokens need 237 KB of shared memory at 4 stages: 3)
        return LinearConfig(block_n=bn, block_m=bm, block_kw=bkw, split_k=split, pair=pair, num_warps=4,
                            num_stages=3 if cb == 8 and bm >= 64 else 4)
    bm = 128 if m <= 256 else 256
    return LinearConfig(block_n=bn, block_m=bm, block_kw=16 if cb == 4 else 32, split_k=1, pair=pair,
                        num_warps=8, num_stages=3)


# ----------------------------------------------------------------------------------
# launch
# ----------------------------------------------------------------------------------
_WS: dict = {}


def _workspace(device: torch.device, floats: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partials (``floats``) and zeroed int32 tile counters (``tiles``) of a split-K
    launch. The kernels leave the counters zero, so one pair per (device, stream) is
    reused; a fresh pair while a CUDA graph is being captured (the graph then owns it)."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return (torch.empty(max(floats, 1), dtype=torch.float32, device=device),
                torch.zeros(max(tiles, 1), dtype=torch.int32, device=device))
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device, stream)
    ws, cnt = _WS.get(key, (None, None))
    if ws is None or ws.numel() < floats or cnt.numel() < tiles:
        ws = torch.zeros(max(floats, 1 << 16), dtype=torch.float32, device=device)
        cnt = torch.zeros(max(tiles, 4096), dtype=torch.int32, device=device)
        _WS[key] = (ws, cnt)
    return ws, cnt


_SCRATCH: dict = {}


def _scratch(shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An intermediate buffer that only kernels of one call write and read (prepared
    activations): one per (device, stream, shape, dtype), reused by later calls on the stream
    (in stream order: each writer starts after the previous call's readers have finished,
    see the prep kernels' programmatic-launch waits); a fresh one while a CUDA graph is being
    captured."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return torch.empty(shape, dtype=dtype, device=device)
    key = (device, torch.cuda.current_stream(device).cuda_stream, shape, dtype)
    t = _SCRATCH.get(key)
    if t is None:
        t = _SCRATCH[key] = torch.empty(shape, dtype=dtype, device=device)
    return t


def _check(x: torch.Tensor, n: int, k: int, device: torch.device, bias: torch.Tensor | None) -> None:
    """Clear errors for what every route of :func:`linear` assumes (weight ``[n, k]`` on
    ``device``)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{_OP}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"{_OP}: x has dtype {x.dtype}; expected bfloat16 or float16")
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"{_OP}: x has shape {tuple(x.shape)}; its last dim must be K={k} of the weight")
    if x.device != device:
        raise ValueError(f"{_OP}: x is on {x.device} but the weight is on {device}")
    if bias is not None:
        if bias.shape != (n,):
            raise ValueError(f"{_OP}: bias has shape {tuple(bias.shape)}; expected ({n},)")
        if bias.device != x.device:
            raise ValueError(f"{_OP}: bias is on {bias.device} but x is on {x.device}")


def _launch(x2: torch.Tensor, pw: PackedLinearWeight, bias: torch.Tensor | None,
            config: LinearConfig | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Run the kernel on 2-D x ``[M, K]`` (contiguous last dim). ``out`` may be passed (tests poison it)."""
    from .kernels import _linear_kernels as kern

    m, k = x2.shape
    n = pw.n
    if out is None:
        out = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    if m == 0:
        return out
    c = config if config is not None else choose_config(m, pw, x2.dtype, x2.device)
    if c.pair and pw.container_bits != 4:
        raise ValueError(f"{_OP}: pair decode needs 4-bit containers, not {pw.container_bits}")
    kw = pw.codes.shape[1]
    if kw % c.block_kw or c.block_kw % 8:
        raise ValueError(f"{_OP}: block_kw={c.block_kw} must be a multiple of 8 dividing {kw} words per row")
    ce = pw.constexprs()
    dummy = pw.scales
    zp = pw.zero_points if pw.zero_points is not None else dummy
    gs = pw.global_scale if pw.global_scale is not None else dummy
    b = bias if bias is not None else dummy
    stride_z = zp.stride(0) if pw.zero_points is not None else 0
    grid_n, grid_m = cdiv(n, c.block_n), cdiv(m, c.block_m)
    if c.split_k > 1:
        ws, cnt = _workspace(x2.device, c.split_k * grid_n * grid_m * c.block_n * c.block_m, grid_n * grid_m)
    else:
        ws, cnt = dummy, dummy
    s = 32 // pw.container_bits
    launch(kern._linear_splitk_kernel, (grid_n, c.split_k, grid_m),
        x2, pw.codes, pw.scales, zp, gs, b, out, ws, cnt, m, n, k, kw, x2.stride(0), out.stride(0),
        pw.codes.stride(0), pw.scales.stride(0), stride_z, **ce, HAS_BIAS=bias is not None,
        BLOCK_N=c.block_n, BLOCK_M=c.block_m, BLOCK_KW=c.block_kw, SPLIT_K=c.split_k, PAIR=c.pair,
        INTERP=_interpreting(), ITERS=cdiv(cdiv(kw, c.split_k), c.block_kw),
        EVEN_K=k == kw * s, num_warps=c.num_warps, num_stages=c.num_stages)
    return out


def _reference(x: torch.Tensor, pw: PackedLinearWeight, bias: torch.Tensor | None) -> torch.Tensor:
    w = reference.dequantize(pw.to_qtensor(), torch.float64)
    y = x.to(torch.float64) @ w.to(x.device).T
    if bias is not None:
        y = y + bias.to(torch.float64)
    return y.to(x.dtype)


# ----------------------------------------------------------------------------------
# custom op
# ----------------------------------------------------------------------------------
def _unpack_args(codes, scales, zero_points, global_scale, fmt_json, n, k, specials) -> PackedLinearWeight:
    fmt = Format.from_dict(json.loads(fmt_json))
    cb = 4 if fmt.element.bits <= 4 else 8
    return PackedLinearWeight(fmt, n, k, cb, codes, scales, zero_points, global_scale, specials)


@torch.library.custom_op("microscale::linear", mutates_args=())
def _linear_op(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
               global_scale: torch.Tensor | None, bias: torch.Tensor | None, fmt_json: str, n: int, k: int,
               specials: bool) -> torch.Tensor:
    pw = _unpack_args(codes, scales, zero_points, global_scale, fmt_json, n, k, specials)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x.device.type == "cuda":
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        y = _launch(x2, pw, bias)
    else:
        y = _reference(x2, pw, bias)
    return y.reshape(*lead, n)


@_linear_op.register_fake
def _(x, codes, scales, zero_points, global_scale, bias, fmt_json, n, k, specials):
    return x.new_empty((*x.shape[:-1], n))


def linear(x: torch.Tensor, qweight: QTensor | PackedLinearWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ dequant(qweight)^T + bias``.

    On CUDA a QTensor weight takes, in this order (README.md has the table per format,
    docs/linear.md the details): on
    Hopper, while a CUDA graph is being captured or in eager calls from ``DECODE_TMA_EAGER_MIN_M``
    (2) tokens on weights of at least ``DECODE_TMA_EAGER_MIN_NK`` elements (any weight from 17
    tokens; the format's own start, :func:`_dt_min_m`, applies in both), the TMA-fed
    tensor-core decode kernel (:func:`decode_tma`) for ``DECODE_TMA_MIN_M..DECODE_TMA_MAX_M``
    (2-64) tokens on weights of at least ``DECODE_TMA_EAGER_MIN_NK`` elements,
    ``DECODE_TMA_SMALL_MIN_M..DECODE_TMA_MAX_M`` (4-64) on smaller ones, of bf16 activations
    and NVFP4 / MXFP4 weights whose K is a multiple of 256 (faster on the GPU, slower on the host;
    ``MICROSCALE_DECODE_TMA``: ``graph`` only while capturing, ``1`` always, ``0`` never);
    the tensor-core decode path (:func:`gemv_mma`) for ``GEMV_MMA_MIN_M..GEMV_MMA_MAX_M`` tokens of bf16 activations
    and E2M1 weights with UE4M3/E8M0 scales (NVFP4, MXFP4); the f16x2 GEMV for at most
    ``GEMV_MAX_M`` tokens (4/8-bit codes); the prefill kernel from ``PREFILL_MIN_M`` tokens
    (4/8-bit codes); the split-K tensor-core kernel otherwise (any format). On the CPU the
    float64 reference. The weights the warp-specialized kernel (:func:`prefill_ws`) takes
    (NVFP4 / MXFP4, 4/8-bit integers with fp16 or E8M0 scales, MXFP8 E4M3 / E5M2) with bf16 activations go to it
    instead of the prefill kernel on Hopper from ``PREFILL_WS_MIN_M`` (65) tokens, 8-bit codes from
    ``PREFILL_WS_MIN_M_8BIT`` (33; 8-bit integers with fp16 scales in blocks of 32 from 65)
    (``MICROSCALE_PREFILL_WS=0``: the prefill kernel), and so do
    ``PREFILL_WS_SMALL_MIN_M..DECODE_TMA_MAX_M`` (33-64) tokens on E2M1 weights of at most
    ``PREFILL_WS_SMALL_MAX_NK`` elements (bf16 activations: ``PREFILL_WS_SMALL_MAX_NK_BF16``) while a
    CUDA graph is being captured, ahead of
    :func:`decode_tma` (which also serves the 4-bit integers, from ``DECODE_TMA_MIN_M_INT4`` (3;
    signed codes ``DECODE_TMA_MIN_M_INT4_SYM``, 4) tokens on large weights, and MXFP8 and the 8-bit
    integers from ``DECODE_TMA_MIN_M_8BIT`` (4; 8-bit integers on small weights
    ``DECODE_TMA_SMALL_MIN_M_INT8``, 5) to ``DECODE_TMA_MAX_M_8BIT`` (32)). fp16 activations take the
    same routes but :func:`gemv_mma` (bf16 only: :func:`decode_tma` serves small E2M1 weights from 5
    eager tokens instead); the Gluon kernels then decode into f16 and run fp16 MMAs, for the weights
    whose decode stays exact in f16 (:func:`_f16_weight_reason`; others take the GEMV or the prefill
    kernel).

    On Hopper the f16x2 GEMV runs as a programmatic dependent launch chain: once a weight
    has been used and its tensors are unchanged (torch's version counters), the GEMV may
    start reading it while earlier kernels that let their dependents launch early are still
    running (microscale's GEMV and dequantize do; its quantize does not). A QTensor's first
    use, and its first use after an in-place change through torch, read it only after
    those kernels complete. A weight rewritten by other means (a custom kernel writing its
    memory) must not be rewritten by such kernels right before the call; or set
    ``MICROSCALE_GEMV_PDL_CHAIN=0``.

    Eager calls on the decode routes (up to 16 tokens, 64 on ``decode_tma``; CUDA, contiguous x
    and bias) replay a plan from the third call with the same shapes, dtypes, alignment, weight tensors and
    stream: the launches recorded on the second call, with the new x, bias and a new output
    put in (host time per call on the H200 machine ~20-35 µs instead of 80-135). Plans live
    on the QTensor and follow in-place changes through torch's version counters; none is
    used while a CUDA graph is being captured, under launch hooks or while tracing
    (``MICROSCALE_PLANS=0``: never).

    While a CUDA graph is being captured, per-weight tables not yet kept on the weight are made
    for the call and not kept: :func:`decode_tma`'s step-major copy of the block scales is then
    rebuilt by the graph at every replay, so an eager call in :func:`decode_tma`'s token range
    that takes another kernel makes it ahead (one byte per 16 weight elements). The split-K
    kernel's packed weight is not kept either: the graph then repacks the weight at every
    replay, so call once eagerly (or pass :func:`prepare`'s result) before capturing. A weight
    of a format with NaN/Inf codes that no eager call has scanned takes the NaN/Inf-aware
    decode inside a capture (the scan is a host sync, which a capture refuses). A graph replays
    what it captured of a weight (its tables, the scale window and path its scans chose): after
    changing a weight in place, capture again.

    Args:
        x: bfloat16 or float16 ``[..., K]``.
        qweight: a QTensor ``[N, K]`` (prepared once and cached on it) or the result of
            :func:`prepare` (pass the latter inside ``torch.compile(fullgraph=True)``).
        bias: optional ``[N]`` (any float dtype; added in fp32).

    Returns:
        ``[..., N]`` in x's dtype.
    """
    if isinstance(qweight, QTensor):
        plans = key = plan = None
        if _PLANS:
            key = _plan_key(x, qweight, bias)
            if key is not None:
                plans = qweight.__dict__.get("_ms_plans")
                if plans is None:
                    plans = qweight.__dict__["_ms_plans"] = {}
                plan = plans.get(key)
                if type(plan) is _Plan:
                    return plan(x, bias)
        if len(qweight.shape) == 2:  # (prepare() below explains other shapes)
            _check(x, qweight.shape[0], qweight.shape[1], qweight.device, bias)
        if plan is not _SEEN:  # no plans, refused, or a key's first call (a weight's first use is
            y, _ = _route(x, qweight, bias)  # not its steady state: its views are made then)
            if plans is not None and plan is None:
                if len(plans) >= _PLANS_PER_WEIGHT:
                    plans.clear()
                plans[key] = _SEEN
        else:  # the second call: recorded
            rec: list = []
            _kl.record(rec)
            try:
                y, plannable = _route(x, qweight, bias)
            finally:
                _kl.record(None)
            plans[key] = (_Plan.build(rec, x, bias, y) if plannable else None) or _REFUSED
        if y is not None:
            return y
    pw = qweight if isinstance(qweight, PackedLinearWeight) else _cached_prepare(qweight)
    _check(x, pw.n, pw.k, pw.device, bias)
    return torch.ops.microscale.linear(x, pw.codes, pw.scales, pw.zero_points, pw.global_scale, bias,
                                       _fmt_json(pw.fmt), pw.n, pw.k, pw.specials)


def _route(x: torch.Tensor, q: QTensor, bias: torch.Tensor | None) -> tuple[torch.Tensor | None, bool]:
    """:func:`linear`'s choice of kernel for a QTensor weight: ``(out, plannable)``, or
    ``(None, False)`` for the custom op's split-K kernel / reference. ``plannable``: the route
    makes its output with ``torch.empty`` and fills it with its launches alone, and takes x
    and bias as given (what :class:`_Plan` replays)."""
    lead = x.shape[:-1]
    n = q.shape[0]
    if _prefill_ws_small_wanted(x, q):
        x2 = x.reshape(-1, x.shape[-1])
        if _prefill_ws_reason(q, x2) is None:
            return prefill_ws(x2, q, bias).reshape(*lead, n), False
    if _dt_min_m(q) * x.shape[-1] <= x.numel() <= DECODE_TMA_MAX_M * x.shape[-1]:
        x2 = x.reshape(-1, x.shape[-1])
        if _decode_tma_wanted(x, q):
            if _decode_tma_reason(q, x2) is None:
                return decode_tma(x2, q, bias).reshape(*lead, n), True
        elif _decode_tma_ahead(x2, q):
            # an eager call that a CUDA graph captured later would send to decode_tma: its
            # weight tables now, not inside the graph (where they would be rebuilt at every replay)
            _dt_weight_descs(q, _weight_views(q), _dt_tile(q, x2)[0])
    if x.numel() >= GEMV_MMA_MIN_M * x.shape[-1]:
        c = _gemv_mma_config(q, x)
        if c is not None and _gemv_mma_reason(q, x, c) is None:
            return _gemv_mma_launch(x.reshape(-1, x.shape[-1]), q, bias, c).reshape(*lead, n), True
    if gemv_supported(q, x):
        return gemv(x.reshape(-1, x.shape[-1]), q, bias).reshape(*lead, n), True
    if _PREFILL_WS and x.numel() >= _ws_min_m(q) * x.shape[-1]:
        x2 = x.reshape(-1, x.shape[-1])
        if _prefill_ws_reason(q, x2) is None:
            return prefill_ws(x2, q, bias).reshape(*lead, n), False
    if prefill_supported(q, x):
        return prefill(x.reshape(-1, x.shape[-1]), q, bias).reshape(*lead, n), False
    if gemv_supported(q, x, _GEMV_FALLBACK_M):  # shapes the tensor-core kernel does not tile
        return gemv(x.reshape(-1, x.shape[-1]), q, bias).reshape(*lead, n), True
    return None, False


# ----------------------------------------------------------------------------------
# eager call plans
# ----------------------------------------------------------------------------------
#: Eager calls of the decode routes replay a plan (``MICROSCALE_PLANS``, read at import;
#: ``0``: off). The wrappers' Python and torch calls cost 60-70 µs per call on the H200
#: machine's host and each cached launch 40-55 µs (``benchmarks/host_breakdown.py``), for
#: kernels of 10-50 µs; a plan is the call's recorded launches (compiled kernels, grids,
#: argument values) with x, bias and the output substituted, made on the second call with
#: the same key and kept on the weight. Not used while a CUDA graph is being captured or
#: when a launch hook is installed.
_PLANS = os.environ.get("MICROSCALE_PLANS", "1") == "1"
_PLANS_PER_WEIGHT = 64
_SEEN, _REFUSED = object(), object()  # a key's first call (recorded on its second); no plan


def _plan_key(x: torch.Tensor, q: QTensor, bias: torch.Tensor | None) -> tuple | None:
    """What a plan of ``linear(x, q, bias)`` depends on, or None when no plan may serve it
    (CPU, non-contiguous x or bias, graph capture, launch hooks, tracing): x's and bias's shape,
    dtype, device and 16-byte alignment, the weight's tensors (address and version), the
    current stream."""
    if (not x.is_cuda or not x.is_contiguous() or torch.cuda.is_current_stream_capturing() or _kl.hooked()
            or torch.compiler.is_compiling()):
        return None
    if bias is None:
        bk = None
    elif bias.is_contiguous():
        bk = (bias.shape, bias.dtype, bias.device, bias.data_ptr() % 16)
    else:
        return None
    wk = _weight_key(q)
    routes = (_DECODE_TMA, _PREFILL_WS, DECODE_TMA_MIN_M, DECODE_TMA_SMALL_MIN_M, DECODE_TMA_MIN_M_INT4,
              DECODE_TMA_MIN_M_INT4_SYM, DECODE_TMA_SMALL_MIN_M_INT8, _DT_POST_SCALE, DECODE_TMA_MAX_M,
              DECODE_TMA_EAGER_MIN_NK, DECODE_TMA_EAGER_MIN_M, GEMV_MMA_MIN_M, GEMV_MAX_M)  # (switches tests set)
    return (x.shape, x.dtype, x.device, x.data_ptr() % 16, bk, wk, _kl.current_stream(), routes)


class _Plan:
    """The launches of one :func:`linear` call, replayed with a new x, bias and output; bound
    once (:func:`microscale.runtime.launch.bind`: TMA descriptors encoded, tensors as addresses)."""

    __slots__ = ("launches", "shape", "dtype", "device")

    def __init__(self, launches: list, shape: torch.Size, dtype: torch.dtype, device: torch.device):
        self.launches, self.shape, self.dtype, self.device = launches, shape, dtype, device

    @staticmethod
    def build(rec: list, x: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor) -> "_Plan | None":
        """The plan of a recorded call, or None: every launch took the cached path; a tensor
        argument at x's, bias's or the output's address is that tensor (or a same-sized view
        of it), every other one is the call's own (the weight's views, workspaces, scratch);
        x and bias are each read by some launch (not a converted copy); no TMA descriptor
        covers x, bias or the output."""
        if not rec or any(r is None for r in rec) or not y.is_contiguous():
            return None
        subs = [(x.data_ptr(), x), (y.data_ptr(), y)] + ([(bias.data_ptr(), bias)] if bias is not None else [])
        seen = set()
        launches = []
        for compiled, grid, vals in rec:
            slots = []
            for i, v in enumerate(vals):
                if isinstance(v, torch.Tensor):
                    for j, (ptr, t) in enumerate(subs):
                        if v.data_ptr() == ptr:
                            if v.dtype.itemsize * v.numel() != t.dtype.itemsize * t.numel():
                                return None
                            slots.append((i, j, None if v.dtype == t.dtype else v.dtype))
                            seen.add(j)
                            break
                elif hasattr(v, "block_shape") and hasattr(v, "base"):  # a TMA descriptor: kept as recorded
                    if any(v.base.data_ptr() == ptr for ptr, _ in subs):
                        return None
            # the recorded call's x, bias and output are not kept alive by the plan
            kept = [None if any(i == sl[0] for sl in slots) else v for i, v in enumerate(vals)]
            fn, args, pos, ptrs = _kl.bind(compiled, tuple(grid), kept)  # (descriptors encoded once)
            slots = tuple((pos[i], j, None if ptrs else dt) for i, j, dt in slots)  # (an address needs no view)
            launches.append((fn, args, slots, ptrs, kept))  # (kept: what args address stays alive)
        if 0 not in seen or (bias is not None and 2 not in seen):
            return None
        return _Plan(launches, y.shape, y.dtype, y.device)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        subs = (x, out, bias)
        addrs = None
        stream = _kl.current_stream()  # (part of the plan's key)
        for fn, args, slots, ptrs, _ in self.launches:
            args = args.copy()
            if ptrs:  # a bound launch takes addresses (x, bias: CUDA tensors of the key's device)
                if addrs is None:
                    addrs = tuple(t.data_ptr() if t is not None else None for t in subs)
                for i, j, _ in slots:
                    args[i] = addrs[j]
            else:
                for i, j, dt in slots:
                    args[i] = subs[j] if dt is None else subs[j].view(dt)
            fn(stream, args)
        return out


_FMT_JSON: dict = {}


def _fmt_json(fmt: Format) -> str:
    s = _FMT_JSON.get(fmt)
    if s is None:
        s = _FMT_JSON[fmt] = json.dumps(fmt.to_dict(), sort_keys=True)
    return s


@dataclass(frozen=True)
class _WeightViews:
    words: torch.Tensor  # codes as int32 words
    scales_int: torch.Tensor  # scales as an integer view of their width
    scales_u8: torch.Tensor | None  # 1-byte scales as uint8
    zero_points: torch.Tensor | None
    global_scale: torch.Tensor | None  # float32 [1]


def _weight_views(q: QTensor) -> _WeightViews:
    """The views of q's tensors the decode kernels take, made once per QTensor and version
    of its tensors and kept on it (each view is a torch call: ~6 µs of host time on the
    H200 machine's CPU, per launch)."""
    return _weight_views_hit(q)[0]


def _weight_key(q: QTensor) -> tuple:
    """Address and version of each of ``q``'s tensors: what the per-weight caches (views,
    packed weight, TMA descriptors, call plans) are valid for."""
    return tuple((t.data_ptr(), t._version) if t is not None else None
                 for t in (q.data, q.scales, q.zero_points, q.global_scale))


def _weight_views_hit(q: QTensor) -> tuple[_WeightViews, bool]:
    """:func:`_weight_views` and whether they came from the cache: False on a QTensor's first
    use and after any in-place change of its tensors (when kernels still in flight may be
    writing them, so the GEMV must not read them ahead of its wait)."""
    key = _weight_key(q)
    hit = q.__dict__.get("_ms_weight_views")
    if hit is not None and hit[0] == key:
        return hit[1], True
    sc = q.scales.contiguous()
    wv = _WeightViews(q.data.contiguous().view(torch.int32), sc.view(_INT_VIEW[sc.element_size()]),
                      sc.view(torch.uint8) if sc.element_size() == 1 else None,
                      None if q.zero_points is None else q.zero_points.contiguous(),
                      None if q.global_scale is None else q.global_scale.reshape(1).to(torch.float32).contiguous())
    if not _capturing(q.data):
        q.__dict__["_ms_weight_views"] = (key, wv)
    return wv, False


# ----------------------------------------------------------------------------------
# decode-path GEMV on the canonical layout (4/8-bit float or int weights, few tokens)
# ----------------------------------------------------------------------------------
#: Programmatic dependent launches of the decode GEMV (Hopper+, ``GemvConfig.pdl``): its
#: first weight loads go out before it waits for the activation prep (``EARLY_W``), and
#: with ``_PDL_CHAIN`` it lets the next kernel launch once all its programs run while the
#: prep is launched as a dependent of the kernel before it (waiting for it before reading x),
#: so one call's weight loads overlap the previous call's tail (the same for the
#: tensor-core decode kernel measured no gain: ``benchmarks/NOTES_linear.md``). Environment
#: switches for measurement: ``MICROSCALE_GEMV_EARLY_W=0`` / ``MICROSCALE_GEMV_PDL_CHAIN=0``.
_EARLY_W = os.environ.get("MICROSCALE_GEMV_EARLY_W", "1") == "1"
_PDL_CHAIN = os.environ.get("MICROSCALE_GEMV_PDL_CHAIN", "1") == "1"
_pdl_capable = pdl_capable  # (module attribute: tools/gemv_ptx.py stands in a Hopper)


#: Largest token count routed to :func:`gemv` (tokens share one decode in groups of up to 4;
#: from 5 tokens the split-K tensor-core kernel wins on the H200: NVFP4 M=6 87 us against
#: 122 us, MXFP8 M=8 102 against 155; at M=4 the GEMV: MXFP8 80 against 102 us).
GEMV_MAX_M = 4
_GEMV_FALLBACK_M = 8  # up to here the GEMV still serves what the tensor-core kernel cannot
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


@dataclass(frozen=True)
class GemvConfig:
    """Tiles of the GEMV: ``block_n`` weight rows x ``block_kw`` int32 words of codes per
    step, K split ``split_k`` ways (fp32 atomics when > 1); ``chain``: words whose products
    accumulate in f16 before one conversion to f32 (0: as many as a scale block holds,
    at most 4); ``tokens``: tokens sharing one decode (0: all, at most 4); ``pdl``: launch
    the GEMV as a programmatic dependent of the activation prep (Hopper+), which also
    brings the launch chain with the previous call and, once the weight's views are cached,
    its first weight loads ahead of the wait (``_PDL_CHAIN`` / ``_EARLY_W``); ``prefetch``:
    load the next K step's operands before the current step's arithmetic; ``f4_select``:
    4-bit float codes decoded by the select variant (``_gemv_kernels._decode_word_ptx``:
    11% fewer SASS per word); ``scale_pairs``: UE4M3 scales applied in the PTX loaded as
    16-bit pairs of neighbouring chains (half the loads, a smaller layout conversion). Both
    are on by default (H200, 28672x8192 at 1 token: NVFP4 40.8 -> 37.4 us with both, MXFP4
    37.9 -> 36.2 us with the select decode; ``benchmarks/NOTES_linear.md``) and are ignored
    where they do not apply (other element kinds, other scales, odd scale strides).
    ``scale_direct``: block scales loaded by PTX straight into the layout of their use
    (no shared-memory layout conversion and barriers per K step; PTX path, unmasked tiles;
    zero points likewise, one byte load per chain), on by default (H200, 28672x8192 at 1 token: NVFP4 35.6
    -> 34.1 us, MXFP4 35.4 -> 32.8 us, MXFP8 57.5 -> 56.4 us; bit-identical outputs)."""

    block_n: int = 8
    block_kw: int = 256
    split_k: int = 1
    num_warps: int = 2
    num_stages: int = 4
    chain: int = 0
    tokens: int = 0
    pdl: bool = False
    prefetch: bool = False
    f4_select: bool = True
    scale_pairs: bool = True
    scale_direct: bool = True


@functools.lru_cache(maxsize=256)
def _gemv_kind(fmt: Format) -> int | None:
    """The GEMV's element kind for a format, or None when it has no decode for it."""
    from .kernels import _gemv_kernels as kern

    el = fmt.element
    if el.kind == "int" and el.bits in (4, 8):
        if fmt.zero_point and not el.signed and el.frac_bits == 0:  # affine: (code - z) * s
            return kern.U8Z if el.bits == 8 else kern.U4Z
        if el.signed and not fmt.zero_point:
            return kern.I8 if el.bits == 8 else kern.I4
        return None
    if fmt.zero_point or el.kind != "float":
        return None
    if el.bits == 4 and not el.has_nan and not el.has_inf:
        return kern.F4
    if el.bits == 8 and (el.ebits, el.mbits, el.bias) == (4, 3, 7) and list(el.nan_codes) == [0x7F] \
            and not el.has_inf:
        return kern.E4M3
    if el.bits == 8 and (el.ebits, el.mbits, el.bias) == (5, 2, 15) and el.has_inf:
        return kern.E5M2
    return None


def gemv_supported(q: QTensor, x: torch.Tensor, max_m: int = GEMV_MAX_M) -> bool:
    """Whether :func:`gemv` serves ``x @ dequant(q)^T``: a CUDA weight of 4/8-bit
    minifloats (E2M1, E4M3, E5M2), signed 4/8-bit integers, or unsigned 4/8-bit integers
    with a zero point (affine), with 1-D blocks of whole words, unpadded, at most
    ``max_m`` tokens."""
    f = q.fmt
    return (x.is_cuda and q.data.is_cuda and len(q.shape) == 2 and x.dim() >= 1
            and x.shape[-1] == q.shape[-1] and x.numel() // max(x.shape[-1], 1) <= max_m
            and x.dtype in (torch.bfloat16, torch.float16) and _gemv_kind(f) is not None
            and f.block_rows == 1 and (f.block_size * f.element.bits) % 32 == 0
            and tuple(q.padded_shape) == tuple(q.shape))


#: one-token GEMV programs per SM below which :func:`choose_gemv_config` halves the rows per program
_GEMV_PROGRAMS_PER_SM = 32


@functools.lru_cache(maxsize=1024)  # a pure function of its arguments, asked on every call
def choose_gemv_config(n: int, k: int, device: torch.device, m: int = 1, bits: int = 4) -> GemvConfig:
    """Few rows and long K strips per program, the next step's loads issued early, and a
    programmatic dependent launch on Hopper (best of the H200 sweeps,
    benchmarks/NOTES_linear.md); K split only when rows give fewer than about 4 programs
    per SM. One token: 4 rows per program on weights of at least ``32 * SMs * 4`` rows,
    else 2 (twice the programs in flight: on 8192-row weights 8-bit codes 21.5 -> 19.1 us,
    NVFP4 14.0 -> 13.2 us at K 8192; on 28672 rows 2 rows are ~1% slower). Two tokens of
    4-bit weights likewise (8192x28672 NVFP4 55.3 -> 45.6 us); 8-bit ones keep 4 rows and no
    early loads there (MXFP8 21.2 us against 22.8 with them on 8192x8192). 8-bit codes at one
    token on the short weights run one warp per program, with 512-word steps on rows of at
    least 4096 words (H200: 8192x8192 MXFP8 18.9 -> 18.65 us, int8_fp16 19.4 -> 19.2;
    8192x28672 MXFP8 57.3 -> 56.1, int8_fp16 59.3 -> 58.2)."""
    pdl = _pdl_capable(device)
    rows = 4 if n >= 4 * _GEMV_PROGRAMS_PER_SM * _num_sms(device) else 2
    kw = k * bits // 32
    if m == 1 and bits == 8 and rows == 2:  # one warp per program; 512-word steps on long rows
        d = GemvConfig(block_n=2, block_kw=512 if kw >= 8 * 512 else 256, num_warps=1, num_stages=4, pdl=pdl,
                       prefetch=True)
    elif m == 1 or (m == 2 and bits == 4):
        d = GemvConfig(block_n=rows, block_kw=256, num_warps=2, num_stages=4, pdl=pdl, prefetch=True)
    elif m == 2:
        d = GemvConfig(block_n=4, block_kw=256, num_warps=2, num_stages=4, pdl=pdl)
    else:
        d = GemvConfig(block_n=4, block_kw=128, num_warps=1, num_stages=4, pdl=pdl, prefetch=True)
    bn, bkw = d.block_n, d.block_kw
    while bkw > 8 and kw % bkw:
        bkw //= 2
    tiles = -(-n // bn)
    want = 4 * _num_sms(device)
    split = 1
    while tiles * split < want and kw // (bkw * split * 2) >= 4:
        split *= 2
    return replace(d, block_kw=bkw, split_k=split)


def gemv(x2: torch.Tensor, q: QTensor, bias: torch.Tensor | None = None, config: GemvConfig | None = None,
         use_asm: bool | None = None) -> torch.Tensor:
    """``x2 [M, K] @ dequant(q)^T (+ bias)`` for few tokens, reading q's canonical layout
    (see :mod:`microscale.kernels._gemv_kernels`). ``use_asm=False`` runs the plain-Triton
    twin of the PTX decode (what the interpreter runs)."""
    from .kernels import _gemv_kernels as kern

    m, k = x2.shape
    n = q.shape[0]
    if k != q.shape[1]:
        raise ValueError(f"{_OP}: x has K={k} but the weight has K={q.shape[1]}")
    kind = _gemv_kind(q.fmt)
    if kind is None:
        raise ValueError(f"{_OP}: the GEMV has no decode for element {q.fmt.element.name}")
    f = q.fmt
    bits = f.element.bits
    kw = k * bits // 32
    wpg = f.block_size * bits // 32
    if k % (32 // bits) or f.block_size * bits % 32:
        raise ValueError(f"{_OP}: K={k} and block {f.block_size} must be whole int32 words of codes")
    c = config or choose_gemv_config(n, k, x2.device, m, bits)
    chain = c.chain or min(wpg, 4)
    tokens = min(c.tokens or m, 4, m)
    if kw % c.block_kw or c.block_kw % wpg or wpg % chain or c.block_kw % chain:
        raise ValueError(f"{_OP}: block_kw={c.block_kw} must divide {kw} words and hold whole blocks "
                         f"({wpg} words) of whole chains ({chain})")
    asm = (not _interpreting()) if use_asm is None else use_asm
    # UE4M3 block scales (<= 448) are applied in f16 inside the PTX when a chain is a block
    s_in = f.scale.name == "ue4m3" and chain == wpg and c.block_kw % (2 * chain) == 0
    xe = kern.x_exponent(kind, chain, 2 * 448.0 if s_in else 1.0)  # two scaled chains summed in f16
    x2 = x2.contiguous()
    mp = -(-m // tokens) * tokens
    nch = kw // c.block_kw  # activation chunks, one power of two each
    xp = _scratch((mp, k), torch.float16, x2.device)
    xs = _scratch((mp, nch), torch.float32, x2.device)
    if mp > m:
        xp[m:].zero_()
        xs[m:].zero_()
    # everything the GEMV launch needs is made before the prep, so that the GEMV directly
    # follows it (its programmatic-launch primary): views (copies on a first use), output
    wv, settled = _weight_views_hit(q)
    scales = wv.scales_int
    spair = (c.scale_pairs and s_in and scales.element_size() == 1 and scales.stride(0) % 2 == 0
             and scales.data_ptr() % 2 == 0)
    split = c.split_k
    out = (torch.zeros if split > 1 else torch.empty)((m, n), dtype=torch.float32 if split > 1 else x2.dtype,
                                                      device=x2.device)
    pdl = asm and c.pdl
    chain_pdl = pdl and _PDL_CHAIN
    launch(kern._prep_x_kernel, (m, nch), x2, xp, xs, x2.stride(0), K=k, XE=xe, KIND=kind, CW=c.block_kw,
           USE_PDL=pdl, WAIT_PDL=chain_pdl, num_warps=4, **({"launch_pdl": True} if chain_pdl else {}))
    gs = q.global_scale if q.global_scale is not None else xs
    b = bias if bias is not None else xs
    zp = wv.zero_points if f.zero_point else scales
    kw_per = -(-kw // split)
    kw_per = -(-kw_per // c.block_kw) * c.block_kw
    even_n, even_k = n % c.block_n == 0, kw_per * split == kw
    sdirect = kern.scale_load_asm(2 if spair else scales.element_size()) \
        if c.scale_direct and asm and even_n and even_k else ""
    el = f.element
    elem_c = 2.0 ** (15 - el.bias) if kind == kern.F4 else 2.0 ** (-el.frac_bits) if el.kind == "int" else 1.0
    launch(kern._gemv_kernel, (-(-n // c.block_n), split),
        xp.view(torch.int32), xs, wv.words, scales, zp, gs, b, out,
        n, kw, scales.stride(0), zp.stride(0), out.stride(0), M=m, KW=kw, KIND=kind, MBITS=el.mbits, ELEM_C=elem_c,
        SCALE_KIND=_SCALE_KIND[f.scale.name], WPG=wpg, HAS_GS=f.global_scale, HAS_BIAS=bias is not None,
        BLOCK_N=c.block_n, BLOCK_KW=c.block_kw, KW_PER_SPLIT=kw_per, SPLIT_K=split, CHAIN=chain, T=tokens,
        USE_ASM=asm, ASM=kern.word_asm(kind, el.mbits, tokens, c.f4_select, _GEMV_F4_ROTATE) if asm else "",
        CONS=kern.word_constraints(kind, tokens), SCALE_IN_ASM=s_in,
        USE_PDL=pdl, PREFETCH=c.prefetch, HAS_ZP=f.zero_point, SPAIR=spair, EARLY_W=_EARLY_W and settled,
        PDL_CHAIN=chain_pdl, SDIRECT=sdirect, **({"launch_pdl": True} if pdl else {}),
        EVEN_N=even_n, EVEN_K=even_k, num_warps=c.num_warps, num_stages=c.num_stages)
    return out.to(x2.dtype) if split > 1 else out


# ----------------------------------------------------------------------------------
# decode path on tensor cores (E2M1 weights, bf16 activations, up to 16 tokens)
# ----------------------------------------------------------------------------------
#: Token counts :func:`linear` routes to :func:`gemv_mma` (two token groups of 8 at most;
#: below 3 tokens the f16x2 GEMV wins on the H200: 28672x8192 NVFP4 M=1 41.9 us against
#: 51.9, M=2 51.0 against 56.8; M=4 68.8 against 59.5).
GEMV_MMA_MIN_M = 3
GEMV_MMA_MAX_M = 16


@dataclass(frozen=True)
class GemvMmaConfig:
    """Tiles of :func:`gemv_mma`: each warp takes ``16 * row_groups`` weight rows and
    ``4 * words_per_lane`` int32 words of codes (``32 * words_per_lane`` elements) per row
    per K step; ``num_warps`` warps per program; K split ``split_k`` ways (fp32 partials in
    a workspace, summed in split order by the tile's last split). ``xfrag``: a small prep
    kernel first writes the activations in the order the lanes load them (each load of a
    warp then reads 512 contiguous bytes, and no ``prmt`` pairs them); on Hopper+ the two
    launch as a programmatic pair. ``select``: codes decoded with two ``lop3`` selects (12
    integer ops per word of 8 instead of 15; same bits)."""

    row_groups: int = 2
    words_per_lane: int = 8
    num_warps: int = 2
    split_k: int = 1
    xfrag: bool = False
    select: bool = False


def _e8m0_window(q: QTensor) -> int | None:
    """``D`` for E8M0 block scales (all scale exponents within ``[D + 2, D + 128]`` and
    none NaN), or None. Scanned once per scales tensor version (:func:`_scan_once`); None
    while a CUDA graph is captured unscanned."""
    def scan(s: torch.Tensor) -> int | None:
        if not s.numel():
            return None
        lo, hi = (int(v) for v in torch.aminmax(s.view(torch.uint8).reshape(-1)))
        return hi - 128 if hi < 255 and lo >= hi - 126 else None

    return _scan_once(q.scales, "_microscale_e8m0_window", scan, None)


def _live_blocks(q: QTensor, blocks: int) -> torch.Tensor:
    """bool ``[blocks]``: which of ``q``'s blocks (in the scales' row-major order) hold a nonzero code
    (for float elements, ``+-0`` count as zero)."""
    el = q.fmt.element
    codes = unpack_codes(q.data.contiguous().view(torch.uint8), el.bits, int(q.shape[-1]))
    if el.kind == "float":  # +-0 (sign bit alone)
        codes = codes & ((1 << (el.bits - 1)) - 1)
    return (codes.reshape(blocks, -1) != 0).any(dim=1)


def _e8m0_range(q: QTensor) -> tuple[int, int] | None:
    """``(least, largest)`` E8M0 scale byte of ``q``'s blocks, the least over the blocks that hold a
    nonzero code (the quantizer gives all-zero blocks the byte 0; the f16 decode flushes scales below
    its window to zero, which leaves those blocks right); None with a NaN byte (255) or no scales.
    Scanned once per version of the codes and scales (:func:`_scan_once`); None while a CUDA graph is
    captured unscanned."""

    def scan(s: torch.Tensor) -> tuple[int, int] | None:
        b = s.view(torch.uint8).reshape(-1)
        if not b.numel() or int(b.max()) == 255:
            return None
        live = _live_blocks(q, b.numel())
        lo = int(torch.where(live, b, 255).min())
        return (min(lo, int(b.max())), int(b.max()))

    return _scan_once(q.scales, "_microscale_e8m0_range", scan, None, (q.data,))


def _ue4m3_normal(q: QTensor) -> bool:
    """Whether ``q``'s UE4M3 block scales are all normal (bytes 8..126) but in blocks whose codes are all
    zero, where bytes 0..7 may stand too (none with the sign bit or NaN: the multiply-add makes Inf of
    0x80..0x87, and zero times Inf is NaN): then the Gluon kernels' bf16 decode makes the scale by one
    multiply-add (:data:`microscale.kernels._prefill_gluon.UE4M3_MUL`). Scanned once per version of
    the codes and scales (:func:`_scan_once`); False while a CUDA graph is captured unscanned."""

    def scan(s: torch.Tensor) -> bool:
        b = s.view(torch.uint8).reshape(-1)
        if not b.numel():
            return True
        if bool(((b == 127) | (b >= 0x80)).any()):  # NaN, or a sign bit: the asm conversion for those
            return False
        low = b < 8
        if not bool(low.any()):
            return True
        live = _live_blocks(q, b.numel())
        return not bool((live & low).any())

    return _scan_once(q.scales, "_microscale_ue4m3_normal", scan, False, (q.data,))


def _f16_scale_max(q: QTensor) -> float | None:
    """The largest ``|s|`` of ``q``'s fp16 block scales (inf where one is not finite), scanned once
    (:func:`_scan_once`); None while a CUDA graph is captured unscanned."""
    def scan(s: torch.Tensor) -> float:
        return float(s.float().abs().max()) if s.numel() else 0.0

    return _scan_once(q.scales, "_microscale_f16_smax", scan, None)


def _e2m1_weight_reason(q: QTensor) -> str | None:
    """Why ``q`` is not a weight the E2M1 tensor-core kernels (:func:`gemv_mma`,
    :func:`prefill_ws`) take, or None: E2M1 codes with UE4M3 (16) or E8M0 (32) block scales,
    an unpadded 2-D weight with row-major scales."""
    f = q.fmt
    el = f.element
    if not (el.kind == "float" and (el.bits, el.mbits, el.bias) == (4, 1, 1) and not f.zero_point
            and f.block_rows == 1 and (f.scale.name, f.block_size) in (("ue4m3", 16), ("e8m0", 32))):
        return f"serves E2M1 weights with UE4M3 (16) or E8M0 (32) block scales, not {f.name}"
    if len(q.shape) != 2 or tuple(q.padded_shape) != tuple(q.shape) or \
            tuple(q.scales.shape) != (q.shape[0], q.shape[1] // f.block_size):
        return "needs an unpadded 2-D weight with row-major scales"
    return None


def _gemv_mma_reason(q: QTensor, x: torch.Tensor, c: GemvMmaConfig) -> str | None:
    """Why :func:`gemv_mma` cannot serve ``x @ dequant(q)^T`` with config ``c``, or None
    (device-independent reasons first)."""
    why = _e2m1_weight_reason(q)
    if why is not None:
        return why
    f = q.fmt
    k = q.shape[1]
    if x.shape[-1] != k or not 0 < x.numel() // k <= GEMV_MMA_MAX_M:
        return f"needs 1..{GEMV_MMA_MAX_M} tokens of K={k}"
    if x.dtype != torch.bfloat16:
        return f"needs bfloat16 activations, got {x.dtype}"
    if c.words_per_lane % 4 or k % (32 * c.words_per_lane):
        return f"needs K a multiple of its K step ({32 * c.words_per_lane} elements), got K={k}"
    if not (x.is_cuda and q.data.is_cuda):
        return "needs CUDA tensors"
    if torch.cuda.get_device_capability(x.device) < (9, 0):
        return "needs Hopper (sm_90) or newer"
    if not (q.data.is_contiguous() and q.scales.is_contiguous() and x.is_contiguous()
            and q.data.data_ptr() % 16 == 0 and q.scales.data_ptr() % 4 == 0 and x.data_ptr() % 16 == 0):
        return "needs contiguous, 16-byte aligned codes and activations (4-byte aligned scales)"
    if f.scale.name == "e8m0" and _e8m0_window(q) is None:
        return "E8M0 scales span more than 126 binades, hold NaN, or are unscanned during a CUDA graph capture"
    return None


def _gemv_mma_config(q: QTensor, x: torch.Tensor) -> GemvMmaConfig | None:
    if len(q.shape) != 2 or x.shape[-1] == 0:
        return None
    n, k = (int(v) for v in q.shape)
    return choose_gemv_mma_config(n, k, x.device, x.numel() // k)


def gemv_mma_supported(q: QTensor, x: torch.Tensor, config: GemvMmaConfig | None = None) -> bool:
    """Whether :func:`gemv_mma` serves ``x @ dequant(q)^T``: CUDA (Hopper or newer), bf16
    ``x`` of at most ``GEMV_MMA_MAX_M`` tokens, an unpadded 2-D weight of E2M1 codes with
    UE4M3 (16) or E8M0 (32) block scales in row-major order, K a multiple of the K step
    (``32 * words_per_lane`` elements), 16-byte aligned codes and activations; E8M0 scales
    within a 126-binade window (see :func:`_e8m0_window`)."""
    c = config or _gemv_mma_config(q, x)
    return c is not None and _gemv_mma_reason(q, x, c) is None


#: ``MICROSCALE_GEMV_F4_ROTATE=1`` (read at import): :func:`gemv`'s select decode of 4-bit floats takes
#: pair (3, 7) from its odd select by one rotation (11 PTX integer ops a code word instead of 13; exact, see
#: ``_gemv_kernels._decode_word_ptx``); off until timed on the H200
_GEMV_F4_ROTATE = os.environ.get("MICROSCALE_GEMV_F4_ROTATE", "0") == "1"
#: ``MICROSCALE_GEMV_MMA_XFRAG=1`` (read at import): :func:`gemv_mma`'s default configs use
#: fragment-ordered activations (``GemvMmaConfig.xfrag``; off until timed on the H200)
_MMA_XFRAG = os.environ.get("MICROSCALE_GEMV_MMA_XFRAG", "0") == "1"
#: ``MICROSCALE_GEMV_MMA_SELECT=1``: the same for the select decode (``GemvMmaConfig.select``)
_MMA_SELECT = os.environ.get("MICROSCALE_GEMV_MMA_SELECT", "0") == "1"


@functools.lru_cache(maxsize=1024)
def choose_gemv_mma_config(n: int, k: int, device: torch.device, m: int = 1) -> GemvMmaConfig:
    """Two row groups per warp; up to 8 tokens 8 words per lane per step and 2 warps, from
    9 tokens 4 words and 4 warps (registers); K split by :func:`with_gemv_mma_split` (H200
    sweeps, benchmarks/NOTES_linear.md)."""
    d = GemvMmaConfig() if m <= 8 else GemvMmaConfig(words_per_lane=4, num_warps=4)
    d = replace(d, xfrag=_MMA_XFRAG, select=_MMA_SELECT)
    while k % (32 * d.words_per_lane) and d.words_per_lane > 4:
        d = replace(d, words_per_lane=d.words_per_lane // 2)
    return with_gemv_mma_split(d, n, k, device)


def with_gemv_mma_split(c: GemvMmaConfig, n: int, k: int, device: torch.device) -> GemvMmaConfig:
    """``c`` with K split (by powers of two, each slice at least 4 steps) until about 12
    warps per SM stream the weight."""
    step = 4 * c.words_per_lane
    kw = k // 8
    warps = -(-n // (16 * c.row_groups))
    want = 12 * _num_sms(device)
    split = 1
    while warps * split < want and kw % (step * split * 2) == 0 and kw // (step * split * 2) >= 4:
        split *= 2
    return replace(c, split_k=split)


#: :func:`gemv_mma` makes UE4M3 block scales by one multiply-add for weights :func:`_ue4m3_normal` passes
#: (``SK_UE4M3N``: 774 SASS per step at 8 tokens against 806; bit-identical). H200, graphs, two rounds
#: (``h200_2026-12-04/s31/a/ab_gemv_mma.log``), NVFP4 8192x8192: 4 tokens 18.9 against 19.2 µs, 8 tokens
#: 20.8 both. A/B switch.
_GEMV_MMA_SCALE_IMAD = True


def _gemv_mma_scale_args(q: QTensor) -> tuple[int, int, float]:
    """``(SK, ke, post)`` of :func:`gemv_mma` for E2M1 weight ``q``: the scale kind (:mod:`._gemv_mma`), its
    E8M0 input ``(126 - D) * 0x10001`` and the power of two the epilogue multiplies by."""
    from .kernels import _gemv_mma as kern

    if q.fmt.scale.name == "ue4m3":
        return (kern.SK_UE4M3N if _GEMV_MMA_SCALE_IMAD and _ue4m3_normal(q) else kern.SK_UE4M3), 0, 2.0 ** 7
    d = _e8m0_window(q)
    return kern.SK_E8M0, (126 - d) * 0x10001, 2.0 ** d


def gemv_mma(x2: torch.Tensor, q: QTensor, bias: torch.Tensor | None = None,
             config: GemvMmaConfig | None = None) -> torch.Tensor:
    """``x2 [M, K] @ dequant(q)^T (+ bias)`` for up to 16 tokens on tensor cores (see
    :mod:`microscale.kernels._gemv_mma`). Raises ValueError saying why when it cannot
    serve the call (:func:`gemv_mma_supported`)."""
    _check(x2, q.shape[0], q.shape[-1], q.device, bias)
    c = config or _gemv_mma_config(q, x2)
    why = _gemv_mma_reason(q, x2, c)
    if why is not None:
        raise ValueError(f"{_OP}: gemv_mma {why}")
    return _gemv_mma_launch(x2, q, bias, c)


def _gemv_mma_launch(x2: torch.Tensor, q: QTensor, bias: torch.Tensor | None, c: GemvMmaConfig) -> torch.Tensor:
    from .kernels import _gemv_mma as kern

    m, k = x2.shape
    n = q.shape[0]
    f = q.fmt
    kw = k // 8
    wpg = f.block_size // 8
    step = 4 * c.words_per_lane
    if kw % (step * c.split_k):
        raise ValueError(f"{_OP}: K={k} must split into {c.split_k} slices of whole {8 * step}-element steps")
    tg = -(-m // 8)
    sk, ke, post = _gemv_mma_scale_args(q)
    lasm, lcons, nout = kern.load_asm(c.row_groups, c.words_per_lane, 0, c.words_per_lane // wpg)
    xasm, xcons, nxout = kern.load_asm(0, c.words_per_lane, tg, 0, 512 if c.xfrag else 16)
    sasm, scons = kern.step_asm(c.row_groups, c.words_per_lane, tg, wpg, sk, c.xfrag, c.select)
    split = c.split_k
    out = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    wv = _weight_views(q)
    scales = wv.scales_u8
    gs = wv.global_scale if wv.global_scale is not None else out
    rows = 16 * c.row_groups * c.num_warps
    tiles = -(-n // rows)
    if split > 1:
        ws, cnt = _workspace(x2.device, split * tiles * 4 * c.row_groups * tg * 32 * c.num_warps, tiles)
    else:
        ws = cnt = out
    xk, stride_xk, pdl = x2, x2.stride(0), False
    if c.xfrag:
        pdl = _pdl_capable(x2.device)
        xk = torch.empty((tg, 8 * k), dtype=x2.dtype, device=x2.device)
        stride_xk = 8 * k
        launch(kern._xfrag_kernel, (tg, kw // step), x2, xk, m, x2.stride(0), K=k, WPL=c.words_per_lane, PDL=pdl,
               num_warps=4, **({"launch_pdl": True} if pdl else {}))
    launch(kern._gemv_mma_kernel, (tiles, split),
           xk, wv.words, scales, gs, bias if bias is not None else out, out, ws, cnt, ke,
           n, m, stride_xk, kw, scales.stride(0), out.stride(0), post,
           KW_PER_SPLIT=kw // split, RG=c.row_groups, WPL=c.words_per_lane, TG=tg, WPG=wpg, SK=sk, SPLIT_K=split,
           HAS_GS=q.global_scale is not None, HAS_BIAS=bias is not None, LASM=lasm, LCONS=lcons, NOUT=nout,
           XASM=xasm, XCONS=xcons, NXOUT=nxout, SASM=sasm, SCONS=scons, NW=c.num_warps, XF=c.xfrag, PDL_WAIT=pdl,
           num_warps=c.num_warps, num_stages=1, **({"launch_pdl": True} if pdl else {}))
    return out


# ----------------------------------------------------------------------------------
# prefill path on the canonical layout (4/8-bit codes, many tokens)
# ----------------------------------------------------------------------------------
#: Smallest token count routed to :func:`prefill` (below it the GEMV).
PREFILL_MIN_M = GEMV_MAX_M + 1


@dataclass(frozen=True)
class PrefillConfig:
    """Tiles of :func:`prefill`: ``block_m`` tokens x ``block_n`` weight rows per program,
    ``block_k`` elements per K step; ``group_m`` row tiles per L2-sharing group;
    ``split_k``: K cut into that many equal ranges, one program each, partial sums
    reduced in a fixed order by the last of them (for few tokens, so all SMs stream)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3
    swap: bool = False  # weights as the MMA's A operand (out^T tiles)
    pair: bool = False  # E2M1 codes with E8M0/UE4M3 scales and bf16 x: bf16x2 pair decode
    split_k: int = 1


def choose_prefill_config(m: int, fmt: Format, k: int | None = None) -> PrefillConfig:
    """Best of the H200 sweeps (benchmarks/h200_2026-12-01/prefill*.log, h200_2026-12-01b/small_m2.log;
    28672x8192). Up to 32 tokens: 16/32 tokens x 64 weight rows, 128-element K steps, K split
    in two (NVFP4 M=16: 88.6 us = 1.28x cuBLAS, was 0.97x unsplit with 64-element steps;
    MXFP8 1.11x, was 0.50x); affine formats 256-element steps split in four (1.04x).
    33-255 tokens: up to 64 tokens x 64 rows, 128-element steps (affine: 64). From 256
    tokens, 8 warps: minifloats with E8M0/UE4M3 scales decode by bf16x2 pairs into the
    register operand (256 x 128 tiles, 4 stages: NVFP4 0.71-0.76x cuBLAS at M=4096, MXFP8
    0.67x against 0.58x without); affine formats likewise without the pair decode; the
    rest 256 x 128 tiles from 2048 tokens on, else 128 x 128. ``pair`` is asked for every
    minifloat with E8M0/UE4M3 scales; :func:`prefill` uses it where it is exact. Given
    ``k``, the K step and split shrink until they tile K (``prefill_supported`` shapes)."""
    c = _prefill_tiles(m, fmt)
    if k is not None:
        while k % (c.split_k * c.block_k) and c.split_k > 1:
            c = replace(c, split_k=c.split_k // 2)
        while k % c.block_k and c.block_k > max(64, fmt.block_size):
            c = replace(c, block_k=c.block_k // 2)
    return c


def _prefill_tiles(m: int, fmt: Format) -> PrefillConfig:
    el = fmt.element
    pair = el.kind == "float" and el.bits in (4, 8) and fmt.scale.name in ("e8m0", "ue4m3")
    if m <= 32:  # few tokens on the MMA's N side; K split so that all SMs stream the weight
        bm = max(16, next_pow2(m))
        if fmt.zero_point:
            return PrefillConfig(block_m=bm, block_n=64, block_k=256, group_m=1, num_warps=4, num_stages=3,
                                 swap=True, split_k=4)
        return PrefillConfig(block_m=bm, block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=4, swap=True,
                             pair=pair, split_k=2)
    if m < 256:
        bm = min(64, next_pow2(m))
        if fmt.zero_point:
            return PrefillConfig(block_m=bm, block_n=64, block_k=64, group_m=1, num_warps=4, num_stages=4, swap=True)
        return PrefillConfig(block_m=bm, block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=3, swap=True,
                             pair=pair)
    if pair:  # minifloat pairs into the register operand
        return PrefillConfig(block_m=256, block_n=128, block_k=64, num_stages=4, swap=True, pair=True)
    if fmt.zero_point:
        return PrefillConfig(block_m=256, block_n=128, block_k=64, num_stages=4, swap=True)
    return PrefillConfig(block_m=256 if m >= 2048 else 128, block_n=128, block_k=64)


def prefill_supported(q: QTensor, x: torch.Tensor) -> bool:
    """Whether :func:`prefill` serves ``x @ dequant(q)^T``: a CUDA weight with 4- or 8-bit
    codes in 1-D blocks, unpadded, K a multiple of 64, at least ``PREFILL_MIN_M`` tokens."""
    f = q.fmt
    return (x.is_cuda and q.data.is_cuda and len(q.shape) == 2 and x.dim() >= 1
            and x.shape[-1] == q.shape[-1] and x.numel() // max(x.shape[-1], 1) >= PREFILL_MIN_M
            and x.dtype in (torch.bfloat16, torch.float16) and f.element.bits in (4, 8) and f.block_rows == 1
            and q.shape[1] % max(64, f.block_size) == 0 and f.block_size % 16 == 0
            and tuple(q.padded_shape) == tuple(q.shape))


def prefill(x2: torch.Tensor, q: QTensor, bias: torch.Tensor | None = None,
            config: PrefillConfig | None = None) -> torch.Tensor:
    """``x2 [M, K] @ dequant(q)^T (+ bias)`` for many tokens on tensor cores, reading q's
    canonical layout: each weight tile is decoded once per K step in registers and
    reused by all ``block_m`` tokens of the tile (``_linear_kernels._linear_prefill_kernel``)."""
    from .kernels import _linear_kernels as kern

    m, k = x2.shape
    n = q.shape[0]
    f = q.fmt
    if k != q.shape[1]:
        raise ValueError(f"{_OP}: x has K={k} but the weight has K={q.shape[1]}")
    if f.element.bits not in (4, 8) or f.block_rows != 1:
        raise ValueError(f"{_OP}: the prefill kernel takes 4/8-bit codes in 1-D blocks, not {f.name}")
    c = config or choose_prefill_config(m, f, k)
    if k % c.block_k or (c.block_k % f.block_size and f.block_size % c.block_k):
        raise ValueError(f"{_OP}: K={k} must be a multiple of block_k={c.block_k}, and block_k and the "
                         f"block ({f.block_size}) must divide one another")
    if c.split_k < 1 or k % (c.split_k * c.block_k):
        raise ValueError(f"{_OP}: K={k} must be a multiple of split_k*block_k={c.split_k}*{c.block_k}")
    el = f.element
    # the pair decode's bf16 products are exact: 2-bit E2M1 significands times power-of-two
    # or E4M3 scales (a float16/float32 scale would be rounded to bf16)
    # 8-bit minifloats likewise (<= 4-bit significands), unless the weight holds NaN/Inf codes
    pair = (c.pair and x2.dtype == torch.bfloat16 and el.kind == "float" and f.scale.name in ("e8m0", "ue4m3")
            and c.block_k % 8 == 0
            and ((el.bits == 4 and el.mbits == 1 and not el.has_nan and not el.has_inf)
                 or (el.bits == 8 and el.mbits <= 3 and not _weight_has_specials(q))))
    x2 = x2.contiguous()
    out = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    scales = q.scales.contiguous()
    sb = scales.element_size()
    scales, wide_s = _word_rows(scales.view(_INT_VIEW[sb]))
    zp, wide_z = _word_rows(q.zero_points.contiguous()) if f.zero_point else (scales, False)
    gs = q.global_scale if q.global_scale is not None else scales
    b = bias if bias is not None else scales
    cons = _format_constexprs(f, bool(f.element.has_nan or f.element.has_inf))
    tiles = cdiv(m, c.block_m) * cdiv(n, c.block_n)
    ws = cnt = None
    if c.split_k > 1:  # partials as [split_k, m, n]
        ws, cnt = _workspace(x2.device, c.split_k * m * n, tiles)
    launch(kern._linear_prefill_kernel, (tiles, c.split_k),
        x2, q.data.contiguous(), scales, zp, gs, b, out, m, n, x2.stride(0), q.data.stride(0), scales.stride(0),
        zp.stride(0), out.stride(0), K=k, BITS=cons["BITS"], IS_FLOAT=cons["IS_FLOAT"], MBITS=cons["MBITS"],
        SIGNED=cons["SIGNED"], ELEM_C=cons["ELEM_C"], SPECIALS=cons["SPECIALS"], INF_MAG=cons["INF_MAG"],
        NAN_MAG=cons["NAN_MAG"], SCALE_KIND=cons["SCALE_KIND"], GROUP=f.block_size, HAS_ZP=f.zero_point,
        HAS_GS=f.global_scale, HAS_BIAS=bias is not None, BLOCK_M=c.block_m, BLOCK_N=c.block_n,
        BLOCK_K=c.block_k, GROUP_M=c.group_m, INTERP=_interpreting(), SWAP=c.swap, PAIR=pair,
        SB=sb, WIDE_S=wide_s, WIDE_Z=wide_z, SPLIT_K=c.split_k, ws_ptr=ws, cnt_ptr=cnt,
        num_warps=c.num_warps, num_stages=c.num_stages)
    return out


def _zero_point_max(q: QTensor) -> int | None:
    """The largest zero point of an affine weight (scanned once per tensor version, see
    :func:`_scan_once`); None while a CUDA graph is captured unscanned."""
    return _scan_once(q.zero_points, "_microscale_zp_max", lambda z: int(z.max()) if z.numel() else 0, None)


def _int_weight_reason(q: QTensor) -> str | None:
    """Why ``q`` is not an integer weight the Gluon kernels (:func:`prefill_ws`,
    :func:`decode_tma`) take, or None: 4- or 8-bit codes with fp16 block scales of a multiple of
    16, unsigned with uint8 zero points (affine, ``int*_affine_g*``; 4-bit ones at most 15) or two's
    complement (``int4_fp16``, ``int8_fp16``), or two's complement with E8M0 scales of 32 (MXINT4,
    MXINT8); an unpadded 2-D weight with row-major scales."""
    from .kernels import _gemv_kernels as kern

    f = q.fmt
    el = f.element
    kind = _gemv_kind(f)
    f16 = kind in (kern.U4Z, kern.I4, kern.U8Z, kern.I8) and el.frac_bits == 0 and f.scale.name == "fp16" \
        and f.block_size % 16 == 0
    mx = kind in (kern.I8, kern.I4) and f.scale.name == "e8m0" and f.block_size == 32
    if not ((f16 or mx) and f.block_rows == 1):
        return (f"serves 4/8-bit integers with fp16 block scales (a multiple of 16) or E8M0 scales of 32, "
                f"not {f.name}")
    kb = q.shape[1] // f.block_size if len(q.shape) == 2 else -1
    if len(q.shape) != 2 or tuple(q.padded_shape) != tuple(q.shape) or tuple(q.scales.shape) != (q.shape[0], kb) \
            or (f.zero_point and tuple(q.zero_points.shape) != (q.shape[0], kb)):
        return "needs an unpadded 2-D weight with row-major scales"
    if f.zero_point and el.bits == 4:
        zmax = _zero_point_max(q)  # 128 + z and (code - z) * (the scale's low 3 bits) stay exact in bf16
        if zmax is None or zmax > 15:
            return "needs zero points of at most 15 (scanned once; unscanned during a CUDA graph capture)"
    return None


def _e4m3_weight_reason(q: QTensor) -> str | None:
    """Why ``q`` is not an 8-bit float weight :func:`prefill_ws` takes, or None: E4M3 or E5M2 codes
    with E8M0 block scales of 32 (``mxfp8_e4m3``, ``mxfp8_e5m2``) and no Inf / NaN code (scanned
    once; assumed present while a CUDA graph is captured unscanned), an unpadded 2-D weight with
    row-major scales."""
    from .kernels import _gemv_kernels as kern

    f = q.fmt
    if not (_gemv_kind(f) in (kern.E4M3, kern.E5M2) and f.scale.name == "e8m0" and f.block_size == 32
            and f.block_rows == 1):
        return f"serves E4M3 / E5M2 weights with E8M0 block scales of 32, not {f.name}"
    if len(q.shape) != 2 or tuple(q.padded_shape) != tuple(q.shape) or \
            tuple(q.scales.shape) != (q.shape[0], q.shape[1] // 32):
        return "needs an unpadded 2-D weight with row-major scales"
    if _weight_has_specials(q):
        return "needs 8-bit float codes without Inf / NaN (scanned once; unscanned during a CUDA graph capture)"
    return None


def _ws_weight_reason(q: QTensor) -> str | None:
    """Why :func:`prefill_ws` has no decode for weight ``q``, or None: E2M1 codes
    (:func:`_e2m1_weight_reason`), 4/8-bit integers (:func:`_int_weight_reason`) or E4M3 / E5M2
    codes with E8M0 scales (:func:`_e4m3_weight_reason`)."""
    whys = [r(q) for r in (_e2m1_weight_reason, _int_weight_reason, _e4m3_weight_reason)]
    if None in whys:
        return None
    if all(w.startswith("serves") for w in whys):
        return ("serves E2M1 weights with UE4M3 (16) or E8M0 (32) block scales, 4/8-bit integers with fp16 block "
                f"scales (a multiple of 16), E4M3 / E5M2 and 4/8-bit integers with E8M0 scales of 32, not {q.fmt.name}")
    return next(w for w in whys if not w.startswith("serves"))  # the format is served: why not this weight


def _prefill_ws_reason(q: QTensor, x: torch.Tensor) -> str | None:
    """Why :func:`prefill_ws` cannot serve ``x @ dequant(q)^T``, or None."""
    why = _ws_weight_reason(q)
    if why is not None:
        return why
    f = q.fmt
    k = q.shape[1]
    if x.dim() != 2 or x.shape[1] != k or k % 64:
        return f"needs [M, K] activations with K = {k} a multiple of 64"
    if x.dtype not in (torch.bfloat16, torch.float16):
        return f"needs bfloat16 or float16 activations, got {x.dtype}"
    if not (x.is_cuda and q.data.is_cuda) or torch.cuda.get_device_capability(x.device) != (9, 0):
        return "needs a Hopper GPU (sm_90: wgmma)"
    if not (q.data.is_contiguous() and q.scales.is_contiguous() and q.data.data_ptr() % 16 == 0):
        return "needs contiguous, 16-byte aligned codes and contiguous scales"
    if x.dtype == torch.float16:
        return _f16_weight_reason(q)
    if f.scale.name == "e8m0" and _e8m0_window(q) is None:
        return "E8M0 scales span more than 126 binades or hold NaN"
    return None


def _f16_weight_reason(q: QTensor) -> str | None:
    """Why the Gluon kernels' f16 decode (fp16 activations) cannot take weight ``q`` exactly, or
    None: E8M0 scales within the element kind's window of :data:`_E8M0_F16_WINDOW` (NaN none), fp16
    block scales small enough that ``(code - z) * s`` stays finite in f16 (both scanned once;
    unscanned during a CUDA graph capture: refused)."""
    f = q.fmt
    if f.scale.name == "e8m0":
        rng = _e8m0_range(q)
        lo, hi, _ = _E8M0_F16_WINDOW[(_gluon_elem_kind(q), f.element.bits)]
        if rng is None or rng[1] - rng[0] > hi - lo:
            return (f"with float16 activations needs E8M0 scales within {hi - lo + 1} binades and none NaN "
                    "(scanned once; unscanned during a CUDA graph capture)")
    elif f.scale.name == "fp16":
        smax = _f16_scale_max(q)
        if smax is None or not smax * (1 << f.element.bits) <= 65504:
            return (f"with float16 activations needs fp16 scales of at most {65504 / (1 << f.element.bits):g} in "
                    "magnitude (scanned once; unscanned during a CUDA graph capture)")
    return None


#: :func:`linear` routes the weights :func:`prefill_ws` takes with at least ``PREFILL_WS_MIN_M``
#: tokens on Hopper (8-bit codes, which :func:`decode_tma` serves only up to
#: ``DECODE_TMA_MAX_M_8BIT`` tokens: ``PREFILL_WS_MIN_M_8BIT``) to :func:`prefill_ws`;
#: ``MICROSCALE_PREFILL_WS=0`` (read at import) sends them to :func:`prefill` instead (A/B
#: runs). H200, graphs, weights past L2 (twenty-seventh session, ``h200_2026-12-03/s27/b/``):
#: 96 tokens on 28672x8192 / 8192x8192 / 8192x28672, NVFP4 138.2 / 49.1 / 141.2 µs against the
#: prefill kernel's 236.8 / 73.5 / 255.1, MXFP8 176.3 / 61.2 / 174.4 against 258.4 / 76.1 / 258.6,
#: int4_affine_g128 164.6 / 56.5 / 178.1 against 280.4 / 89.7 / 277.7; MXFP8 at 48 / 64 tokens
#: 161.5 / 161.7, 53.1 / 53.7 and 155.2 / 156.2 against 152.5 / 151.9, 55.9 / 57.0 and 187.5 / 190.2
#: (128 tokens was the limit until then, from a kernel two dozen sessions older)
_PREFILL_WS = os.environ.get("MICROSCALE_PREFILL_WS", "1") == "1"
PREFILL_WS_MIN_M = 65
PREFILL_WS_MIN_M_8BIT = 33


def _ws_min_m(q: QTensor) -> int:
    """The fewest tokens :func:`linear` sends to :func:`prefill_ws` outside the small-weight rule:
    ``PREFILL_WS_MIN_M_8BIT`` for 8-bit codes but integers with fp16 scales in blocks of 32, which
    take the Triton prefill kernel up to 64 tokens. H200, graphs, weights past L2 (twenty-eighth
    session, ``h200_2026-12-03/s28/c/``), 33 / 64 / 96 tokens, Triton prefill against prefill_ws:
    28672x8192 int8_fp16 170.9 / 179.0 / 311.3 µs against 182.3 / 185.5 / 207.8, int8_affine_g32
    191.1 / 204.5 / 352.8 against 209.9 / 212.8 / 220.8 (8192x8192: 70.2 / 73.5 / 101.3 against
    66.7 / 67.6 / 72.1); int8_affine_g128 187.4 / 204.6 / 354.0 against 182.9 / 186.0 / 214.8."""
    f = q.fmt
    if f.element.bits == 8 and not (f.scale.name == "fp16" and f.block_size == 32):
        return PREFILL_WS_MIN_M_8BIT
    return PREFILL_WS_MIN_M
#: :func:`linear` also routes ``PREFILL_WS_SMALL_MIN_M..DECODE_TMA_MAX_M`` (33-64) tokens on E2M1 weights
#: of at most ``PREFILL_WS_SMALL_MAX_NK`` elements to :func:`prefill_ws` (64-token tiles, K split over
#: the SMs) instead of :func:`decode_tma`, while a CUDA graph is being captured (eager, the
#: planned :func:`decode_tma` call costs the host less). H200, graphs, weights past L2
#: (twentieth session, ``benchmarks/exp_ws_knobs.py``): NVFP4 at 48 tokens 4096x4096 19.5 against
#: 32.1 µs, 14336x4096 34.0 / 41.8, 8192x8192 39.7 / 44.7; above the limit :func:`decode_tma` stays
#: ahead (8192x14336 63.6 against 68.7 µs, 28672x8192 and 8192x28672 at 64 tokens 115-116 against
#: 117-123 µs), and at 32 tokens everywhere measured (8192x8192: 26.8 against 42.2 µs). 4-bit integers
#: keep :func:`decode_tma` (8192x8192 at 48 / 64 tokens 44.5 / 44.6 µs against 46.8 / 47.4;
#: twenty-seventh session)
PREFILL_WS_SMALL_MIN_M = 33
PREFILL_WS_SMALL_MAX_NK = 1 << 26
#: The limit where :func:`decode_tma` takes its 256-row tile (:func:`_dt_big`: bf16 activations, at 33-64
#: tokens whenever ``_DT_ONE_TABLE`` is on; thirty-third session): that tile is behind :func:`prefill_ws` up
#: to 2^25 elements, mixed at 2^25.3, ahead from 2^25.8 (the limit, 3 x 2^24, lies between). H200, graphs,
#: weights past L2 (thirty-fourth session,
#: ``benchmarks/run_gpu_s34c.sh``), NVFP4 at 64 tokens, :func:`prefill_ws` / :func:`decode_tma`, µs:
#: 4096x4096 19.7 / 27.8; 6144x4096 24.9 / 29.6; 8192x4096 25.5 / 27.2; 4096x8192 26.7 / 33.0; 5120x8192
#: 33.9 / 37.6; 8192x5120 29.7 / 29.7; 4096x10240 32.6 / 35.7; 10240x4096 33.5 / 30.9; 14336x4096 35.8 / 33.7;
#: 4096x14336 43.7 / 41.0; 8192x8192 41.2 / 36.9 (48 tokens and MXFP4 within ~1 µs of these where timed)
PREFILL_WS_SMALL_MAX_NK_BF16 = 3 << 24


def _prefill_ws_small_wanted(x: torch.Tensor, q: QTensor) -> bool:
    """Whether :func:`linear` sends ``x`` to :func:`prefill_ws` below ``PREFILL_WS_MIN_M`` tokens
    (see ``PREFILL_WS_SMALL_MAX_NK``; the kernel's own limits aside; ``MICROSCALE_DECODE_TMA=1``
    keeps these calls on :func:`decode_tma`)."""
    k = x.shape[-1]
    if not (_PREFILL_WS and _DECODE_TMA != "1" and x.is_cuda and _fp4_codes(q)
            and PREFILL_WS_SMALL_MIN_M * k <= x.numel() <= DECODE_TMA_MAX_M * k
            and torch.cuda.is_current_stream_capturing()):
        return False
    big = _dt_big(q, x.numel() // k, x.dtype, x.device)  # decode_tma's 256-row tile: ahead on smaller weights
    return q.shape[0] * q.shape[-1] <= (PREFILL_WS_SMALL_MAX_NK_BF16 if big else PREFILL_WS_SMALL_MAX_NK)


#: :func:`prefill_ws` default: the tiles past the last full wave split in K
#: (``MICROSCALE_PREFILL_WS_SPLIT_TAIL=0``, read at import: whole tiles only)
PREFILL_WS_SPLIT_TAIL = os.environ.get("MICROSCALE_PREFILL_WS_SPLIT_TAIL", "1") == "1"
#: relative tensor-core throughput of one ``prefill_ws`` tile per ``block_t`` (H200: a 128-token
#: tile runs at 0.61x the rate of a 256-token one, a 64-token tile at 0.35x: the per-step decode
#: is a fixed cost that the MMAs of a narrower tile do not cover)
_WS_TILE_RATE = {256: 1.0, 128: 0.61, 64: 0.35}
#: activation ring slots per ``block_t`` (the most that leave room for two output tiles, capped)
_WS_STAGES = {256: 4, 128: 6, 64: 8}


def _tail_parts(tiles: int, programs: int) -> int:
    """K parts per tail tile of :func:`prefill_ws` with ``split_tail`` (as the kernel's
    ``_plan``; it also caps them at the K step count): ``programs // R`` for the
    ``R = tiles % programs`` tiles past the last full wave, at most 8; 1 means unsplit."""
    tail = tiles % programs
    return max(min(programs // tail, 8), 1) if tail else 1


def choose_prefill_ws_tile(m: int, n: int, num_sms: int, split_tail: bool = True) -> tuple[int, int]:
    """``(block_t, stages)`` for :func:`prefill_ws` on ``m`` tokens and ``n`` weight rows: the
    token tile with the least modelled time, the waves of tiles times the tile's cost
    (``block_t / rate``), so that few-token calls on few rows still fill the SMs. With
    ``split_tail`` a last wave of ``R`` tiles costs ``1 / S`` of a wave (``S = SMs // R``
    parts, at most 8; see :func:`prefill_ws`)."""
    rows = 2 * 64  # two consumer warpgroups of 64 rows

    def cost(bt: int) -> float:
        tiles = -(-m // bt) * -(-n // rows)
        full, tail = divmod(tiles, num_sms)
        parts = _tail_parts(tiles, num_sms) if split_tail else 1
        return (full + (1 / parts if tail else 0)) * bt / _WS_TILE_RATE[bt]
    bt = min(_WS_TILE_RATE, key=lambda b: (cost(b), -b))
    return bt, _WS_STAGES[bt]


def _gluon_scale_args(q: QTensor, f16: bool = False) -> tuple[int, int, float]:
    """``(SK, ke, post)`` of the Gluon kernels' decode (:mod:`microscale.kernels._prefill_gluon`)
    for weight ``q`` (``f16``: the f16 decode, for fp16 activations): the scale kind, the E8M0
    exponent offset and the power of two the scale placement leaves to the epilogue."""
    from .kernels import _prefill_gluon as pg

    f = q.fmt
    if f.scale.name == "ue4m3":  # bf16: E2M1 as v * 2^-126 and s * 2^119; f16: v * 2^-14 and s
        sk = pg.SK_UE4M3N if not f16 and _SCALE_IMAD and _ue4m3_normal(q) else pg.SK_UE4M3
        return sk, 0, 2.0 ** (14 if f16 else 7)
    if f.scale.name == "e8m0" and f16:
        # f16 scale bits (e + ke) << 10, the decode gives v * 2^-B: the sums want 2^(e - 127 + B - frac) /
        # 2^(e + ke - 15); the largest scale goes to the top of the window
        _, top, b = _E8M0_F16_WINDOW[(_gluon_elem_kind(q), f.element.bits)]
        ke = top - _e8m0_range(q)[1]
        return pg.SK_E8M0, ke, 2.0 ** (b - 112 - ke - f.element.frac_bits)
    if f.scale.name == "e8m0":
        # the decode gives v * 2^-B and the E8M0 scale is 2^(e + C - D - 127) (ke = C - D), so the sums
        # want 2^(B - C + D) (times the integers' 2^-frac); C keeps each element's least nonzero code
        # times the smallest scale at or above 2^-133, bf16's least subnormal
        b, c = _E8M0_PLACEMENT[(_gluon_elem_kind(q), f.element.bits)]
        d = _e8m0_window(q)
        return pg.SK_E8M0N if _SCALE_IMAD else pg.SK_E8M0, c - d, 2.0 ** (b - c + d - f.element.frac_bits)
    return (pg.SK_F16Z if f.zero_point else pg.SK_F16), 0, 1.0  # integers, fp16 scales


#: the Gluon kernels' bf16 decodes make UE4M3 and E8M0 block scales by one integer multiply-add
#: (``SK_UE4M3N`` for scanned weights, ``SK_E8M0N``) instead of the conversion sequences (A/B switch)
_SCALE_IMAD = True
#: ``(B, C)`` per Gluon element kind and code width (:func:`_gluon_scale_args`): E2M1 placed as
#: ``v * 2^-126``; E4M3 as ``v * 2^-120`` with the window one binade lower; E5M2 as ``v * 2^-112``;
#: integers (MXINT4, MXINT8) exact, their products in [2^-125, 2^8]
_E8M0_PLACEMENT = {(0, 4): (126, 126), (0, 8): (120, 121), (2, 8): (112, 120), (1, 4): (0, 0), (1, 8): (0, 0)}
#: ``(least, largest, B)`` per Gluon element kind and code width for the f16 decode (fp16 activations):
#: the f16 exponent fields ``e + ke`` of the E8M0 scales for which every code times the scale is an exact,
#: finite f16 (E2M1 decoded as ``v * 2^-14``: least product 2^-24; E4M3 / E5M2 / integers exact, ``B = 0``:
#: E4M3 448 * 2^7, E5M2 57344 * 2^0 and 2^-16 * 2^-8, MXINT4 -8 * 2^12, MXINT8 -128 * 2^8)
_E8M0_F16_WINDOW = {(0, 4): (6, 30, 14), (0, 8): (1, 22, 0), (2, 8): (7, 15, 0), (1, 4): (1, 27, 0), (1, 8): (1, 23, 0)}


def _gluon_elem_kind(q: QTensor) -> int:
    """The Gluon kernels' ``EI`` for ``q``: the element kind under E8M0 scales where the code
    width leaves it open (1 two's-complement integers: MXINT4 / MXINT8; 2 E5M2; else 0)."""
    from .kernels import _gemv_kernels as kern

    if q.fmt.scale.name != "e8m0":
        return 0
    return 1 if q.fmt.element.kind == "int" else 2 if _gemv_kind(q.fmt) == kern.E5M2 else 0


#: direct launch of the Gluon kernel (its TMA descriptor is no key for ``launch``'s cache;
#: ``tools/gemv_ptx.py --ws`` replaces it to compile without a GPU)
def _launch_direct(fn, grid, *args, **kwargs) -> None:
    fn[grid](*args, **kwargs)


def prefill_ws(x2: torch.Tensor, q: QTensor, bias: torch.Tensor | None = None, block_t: int | None = None,
               stages: int | None = None, group_t: int = 4, persistent: bool = True,
               split_tail: bool | None = None) -> torch.Tensor:
    """``x2 [M, K] @ dequant(q)^T (+ bias)`` for many tokens of bf16 or fp16 activations on Hopper and an
    E2M1 weight (NVFP4, MXFP4), 4-bit integers with fp16 block scales (``int4_affine_g*`` with
    zero points of at most 15, ``int4_fp16``), 8-bit integers with fp16 block scales
    (``int8_affine_g*``, ``int8_fp16``: each weight the bf16 of ``(code - z) * s`` but within 2^-15
    of a rounding tie, relative, see :func:`microscale.kernels._prefill_gluon.int8_decode_asm`), MXFP8
    (E4M3 / E5M2 codes without Inf / NaN, E8M0 scales), MXINT4 or MXINT8,
    with the warp-specialized Gluon kernel
    (:mod:`microscale.kernels._prefill_gluon`: TMA ring for the activations, two consumer
    warpgroups decoding the codes straight into the wgmma register operand; fp16 activations: f16
    decodes and fp16 MMAs, weights exact or the f16 of ``(code - z) * s``, within the limits of
    :func:`_f16_weight_reason`). :func:`linear`
    routes here from ``PREFILL_WS_MIN_M`` tokens. ``block_t``: tokens per tile (the wgmma N:
    64, 128 or 256); ``stages``: activation ring slots (both default to
    :func:`choose_prefill_ws_tile`); ``group_t``: token tiles that sweep the row tiles together
    (L2 reuse); ``persistent``: one program per SM looping over the tiles (else one per
    tile); ``split_tail`` (persistent only; default ``PREFILL_WS_SPLIT_TAIL``): the ``R``
    tiles past the last full wave (all tiles when fewer than the SMs) are split in K into
    ``SMs // R`` parts (2 to 8) on as many programs, the parts' fp32 sums added up in K
    order by each tile's last part (a workspace per device and stream). Raises ValueError
    saying why when it cannot serve the call."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .kernels import _prefill_gluon as pg

    _check(x2, q.shape[0], q.shape[-1], q.device, bias)
    why = _prefill_ws_reason(q, x2)
    if why is not None:
        raise ValueError(f"{_OP}: prefill_ws {why}")
    split_tail = persistent and (PREFILL_WS_SPLIT_TAIL if split_tail is None else split_tail)
    sms = _num_sms(x2.device)
    if block_t is None:
        block_t, auto_stages = choose_prefill_ws_tile(x2.shape[0], q.shape[0], sms, split_tail)
        stages = auto_stages if stages is None else stages
    stages = _WS_STAGES.get(block_t, 4) if stages is None else stages
    # shared memory: the activation ring and two output tiles (<= 227 KB on an H100 / H200)
    if block_t not in (64, 128, 256) or stages < 2 or group_t < 1 or (stages + 2) * block_t * 128 > 200 * 1024:
        raise ValueError(f"{_OP}: prefill_ws needs block_t in (64, 128, 256), 2 <= stages <= "
                         f"{200 * 8 // block_t - 2} for block_t={block_t}, group_t >= 1")
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    m, k = x2.shape
    n = q.shape[0]
    f = q.fmt
    bk = int(pg.BK.value)
    cb = f.element.bits  # 4, or 8 (E4M3, 8-bit integers)
    f16 = x2.dtype == torch.float16
    gdt = gl.float16 if f16 else gl.bfloat16
    xp = torch.empty((m, k), dtype=x2.dtype, device=x2.device)  # activations in the consumers' K order
    launch(pg._xperm_kernel, (cdiv(m, 32), k // bk), x2, xp, m, x2.stride(0), K=k, BLOCK_R=32, CB=cb, num_warps=4)
    desc = TensorDescriptor.from_tensor(xp, [block_t, bk], gl.NVMMASharedLayout.get_default_for([block_t, bk], gdt))
    wv = _weight_views(q)
    scales, zps = wv.scales_u8, wv.scales_u8
    sk, ke, post = _gluon_scale_args(q, f16)
    if f.scale.name == "fp16":  # integers: fp16 scales as int16 bits, zero points
        scales = wv.scales_int
        zps = wv.zero_points if f.zero_point else scales
    out = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    gs = wv.global_scale if wv.global_scale is not None else out
    rows = int(pg.WG_ROWS.value)
    tma_out = n % 8 == 0  # TMA needs 16-byte row strides
    out_desc = (TensorDescriptor.from_tensor(out, [block_t, rows], gl.NVMMASharedLayout.get_default_for(
        [block_t, rows], gdt)) if tma_out else desc)
    tiles = cdiv(m, block_t) * cdiv(n, 2 * rows)
    grid = sms if split_tail else (min(tiles, sms) if persistent else tiles)
    split = split_tail and _tail_parts(tiles, grid) > 1  # a partial tile per program, counters per tail tile
    ws, cnt = _workspace(x2.device, grid * 2 * rows * block_t if split else 0, (tiles % grid) * 2 * rows * 4 if split
                         else 0)
    _launch_direct(pg._prefill_ws_kernel, (grid,), desc, wv.words, scales, zps, gs,
                   bias if bias is not None else out, out, out_desc, ws, cnt, n, m, k, wv.words.stride(0),
                   scales.stride(0), out.stride(0), ke, post, BT=block_t, STAGES=stages, GROUP_T=group_t,
                   SK=sk, TPS=f.block_size // 16, HAS_GS=q.global_scale is not None, HAS_BIAS=bias is not None,
                   TMA_OUT=tma_out, SPLIT_TAIL=split_tail, CB=cb, EI=_gluon_elem_kind(q), F16=f16, num_warps=4)
    return out


#: :func:`linear` routes E2M1 weights (NVFP4, MXFP4), 4/8-bit integers with fp16 scales in blocks of 32
#: or a multiple of 64, MXFP8 (E4M3, E5M2), MXINT4 and MXINT8 (8-bit codes up to ``DECODE_TMA_MAX_M_8BIT`` tokens;
#: eager calls of 5-16 tokens
#: on small weights of these too, which have no ``gemv_mma``) with ``DECODE_TMA_MIN_M`` (weights of at
#: least ``DECODE_TMA_EAGER_MIN_NK`` elements; ``DECODE_TMA_SMALL_MIN_M`` for smaller ones; 4-bit
#: integers from ``DECODE_TMA_MIN_M_INT4`` / ``DECODE_TMA_MIN_M_INT4_SYM``, MXFP8 from
#: ``DECODE_TMA_MIN_M_8BIT``, at least: :func:`_dt_min_m`) to
#: ``DECODE_TMA_MAX_M`` tokens on Hopper to :func:`decode_tma` (``MICROSCALE_DECODE_TMA``,
#: read at import): ``auto`` (the default) while a CUDA graph is being captured, and in eager
#: calls with call plans on for more than 16 tokens, or from ``DECODE_TMA_EAGER_MIN_M`` tokens on
#: weights of at least ``DECODE_TMA_EAGER_MIN_NK`` elements; ``graph`` only while capturing;
#: ``1`` always; ``0`` never (:func:`gemv_mma` instead up to 16 tokens, the prefill kernel above). H200, 16 tokens,
#: graph replays: 50-51 µs on 28672x8192 against gemv_mma's 71-73; 8192x8192 at 8 tokens
#: gemv_mma stayed ahead of its 16 token columns (18.5 against 19.1-19.7 µs; twelfth session). Eager loops
#: with plans (``benchmarks/eager_decode.py``, thirteenth session): 51.9 / 54.0 µs per call
#: at 16 / 9 tokens on 28672x8192 against gemv_mma's 71.3 / 68.9, but 55.5 / 53.3 on
#: 8192x8192 against 32.3 / 22.9 (its two launches and three TMA descriptors cost ~35-55 µs
#: of host time there, more than the kernel), hence the size limit between the two. From 17
#: tokens the alternative is the prefill kernel, no faster on the GPU (8192x8192, 32 tokens,
#: weights rotated past L2: 36.7-36.9 against 31.3-36.5 µs) and without plans (102-158 µs of host time
#: per call against ~35 for a planned ``decode_tma`` call), so no size limit there.
#: From 2 tokens on weights of at least ``DECODE_TMA_EAGER_MIN_NK`` elements, from
#: ``DECODE_TMA_SMALL_MIN_M`` on smaller ones, with 8 token columns up to 8 tokens (H200, graphs,
#: twenty-fourth session, ``benchmarks/exp_ws_knobs.py``, ``h200_2026-12-03/s24/``): 2-8 tokens on
#: 28672x8192 and 8192x28672 42.6-45.3 µs against 46.2-58.0 for the GEMV (2 tokens) and gemv_mma
#: (4-8); on 8192x8192 the GEMV keeps 2 tokens (16.2 against 18.9 µs), 4 tokens tie (19.0-19.2),
#: 8 tokens 19.0 against 20.8; smaller weights at 4-8 tokens within 0.6 µs either way
#: (14336x4096, 4096x4096) or 3-4 µs ahead (4096x14336)
_DECODE_TMA = os.environ.get("MICROSCALE_DECODE_TMA", "auto")
DECODE_TMA_MIN_M = 2
DECODE_TMA_SMALL_MIN_M = 4
DECODE_TMA_EAGER_MIN_NK = 1 << 27
#: eager calls (``auto``, plans on) on weights of at least ``DECODE_TMA_EAGER_MIN_NK`` elements take
#: :func:`decode_tma` from this many tokens. Eager loops, NVFP4, plans on, alternated and
#: clock-settled (twenty-fifth session, ``benchmarks/exp_eager_routes.py``, ``h200_2026-12-03/s25/``),
#: medians of 3 windows of 2000 calls, 2 / 4 / 8 tokens: 28672x8192 47.0 / 46.8 / 46.9 µs against the
#: GEMV's / gemv_mma's 46.1 / 53.3 / 57.6; 8192x28672 44.1 / 44.6 / 45.0 against 47.5 / 51.8 / 56.0.
#: That needs the plans' bound launches (:func:`microscale.runtime.launch.bind`): with the
#: descriptors encoded at every launch the host time per call is close to the kernel's and a third
#: of the windows took 51.8-52.7 µs (the twenty-fourth session's 55-66)
DECODE_TMA_EAGER_MIN_M = 2


def _fp4_codes(q: QTensor) -> bool:
    """Whether ``q`` holds 4-bit float codes (E2M1: NVFP4, MXFP4), which the routing rules
    treat apart from the integer and 8-bit formats."""
    return q.fmt.element.kind == "float" and q.fmt.element.bits == 4


def _dt_large(q: QTensor) -> bool:
    """Whether ``q`` has at least ``DECODE_TMA_EAGER_MIN_NK`` elements (the size from which
    :func:`decode_tma` serves more token counts, and eager calls)."""
    return q.shape[0] * q.shape[-1] >= DECODE_TMA_EAGER_MIN_NK


def _dt_min_m(q: QTensor) -> int:
    """The fewest tokens :func:`linear` sends to :func:`decode_tma` on weight ``q``."""
    least = DECODE_TMA_MIN_M if _dt_large(q) else DECODE_TMA_SMALL_MIN_M
    if q.fmt.element.bits == 8:
        small_int = q.fmt.element.kind == "int" and not _dt_large(q)
        return max(least, DECODE_TMA_SMALL_MIN_M_INT8 if small_int else DECODE_TMA_MIN_M_8BIT)
    if q.fmt.element.kind == "int":
        return max(least, DECODE_TMA_MIN_M_INT4 if q.fmt.zero_point else DECODE_TMA_MIN_M_INT4_SYM)
    return least


def _decode_tma_ahead(x2: torch.Tensor, q: QTensor) -> bool:
    """Whether an eager call that :func:`linear` does not send to :func:`decode_tma` should
    make the weight's :func:`decode_tma` tables (step-major scales and TMA descriptors) for a
    CUDA graph captured later: the route is on (``MICROSCALE_DECODE_TMA`` not ``0``) and the
    kernel could serve the call. (Captured calls never get here: :func:`_decode_tma_wanted`
    takes them.)"""
    return _DECODE_TMA != "0" and x2.is_cuda and _decode_tma_reason(q, x2) is None


def _decode_tma_wanted(x: torch.Tensor, q: QTensor) -> bool:
    """Whether :func:`linear` sends ``x`` (:func:`_dt_min_m` to ``DECODE_TMA_MAX_M`` tokens) to
    :func:`decode_tma` by ``MICROSCALE_DECODE_TMA`` (the kernel's own limits aside)."""
    if _DECODE_TMA == "1":
        return True
    if _DECODE_TMA == "0" or not x.is_cuda:
        return False
    if torch.cuda.is_current_stream_capturing():
        return True
    m = x.numel() // x.shape[-1]
    # (below 17 tokens small E2M1 weights keep gemv_mma with bf16 activations; the other formats and fp16
    # activations have no such kernel)
    mma_kernel = _fp4_codes(q) and x.dtype == torch.bfloat16
    return _DECODE_TMA == "auto" and _PLANS and (m > 16 or (m >= DECODE_TMA_EAGER_MIN_M and _dt_large(q))
                                                 or (m > GEMV_MAX_M and not mma_kernel))


#: :func:`decode_tma` tiles: weight rows per program (8 consumer warps), K steps per ring
#: chunk, ring chunks, resident programs per SM (80 registers x 12 warps)
_DT_ROWS, _DT_CHUNK, _DT_STAGES, _DT_PER_SM = 128, 4, 3, 2
#: the tile of :func:`decode_tma` on E2M1 weights (bf16 activations) with one 256-row tile per SM for 80 to 100%
#: of the SMs (28672 rows on an H200): 256 rows, two 16-row slices per consumer warp (each warp reads its
#: activation fragments once for both: half the ``LDSM``; 684 SASS per 32 code words against 371 per 16), one
#: program per SM at 160 registers, whole tiles (K unsplit). H200, graphs, 28672x8192, two rounds each: 16 tokens
#: in three calls (``h200_2026-12-04/s31/d``, ``/e``, ``/f``) NVFP4 45.5-46.6 against 48.6-50.1 µs, MXFP4
#: 46.3-47.0 against 48.4-50.0; ``s31/f`` NVFP4 / MXFP4 at 8 tokens 42.0 / 42.6 against 43.4 / 43.7, 32 tokens
#: 61.7 / 59.1 against 65.0 / 64.4, 64 tokens 90.2 / 91.7 against 116.1 / 113.7 (128 rows spill at 64 columns).
#: Equal stream-K shares over 128 / 132 programs were slower (51-52 at 16 tokens), as were 8192-row weights
#: at 4-16 tokens (8192x8192: 21.6 against 20.1 µs at 16; 8192x28672 42.7 against 41.7 at 4, even at 16). At 64
#: token columns it wins on every shape (``s31/g``, one round each: 8192x28672 93.3 / 94.1 against 113.3 / 113.5,
#: 8192x8192 40.0 against 45.3), but a weight taking both tiles would keep two step-major scale tables (each
#: +11% of an NVFP4 weight's bytes; a graph captured at a height whose table no eager call made rebuilds it at
#: every replay), so the tile depends on the weight and the activations' dtype, not the token count: the
#: 256-row one on weights of 80-100% of a wave of its tiles (bf16), the 128-row one elsewhere. (A weight used
#: with both bf16 and fp16 activations keeps both tables.)
_DT_TILE_BIG = (256, 2, 1, 160)
#: ring of the 256-row tile up to ``_DT_BIG_CHUNK_MAX_TOK`` token columns where K is a multiple of 64 x
#: ``_DT_BIG_CHUNK``: chunks of 8 K steps in 2 stages (16 steps of ring, 176 KB at 16 columns) instead of 4 in 3
#: (half the slot handshakes a step). H200, graphs, weights past L2, two rounds each (thirty-fifth session,
#: ``h200_2026-12-04/s35/f``), NVFP4 µs against 4-step chunks: 28672x8192 (112 whole tiles) at 8 / 16 / 32
#: tokens 40.7 / 45.2 / 58.4 against 41.3 / 45.9 / 58.0, MXFP4 at 16 46.1 against 46.5; 8192x28672 (128
#: shares) 42.0 / 46.1 / 59.1 against 41.9 / 46.1 / 57.8. So up to 16 columns (``_DT_BIG_CHUNK_MAX_TOK = 0``: none)
_DT_BIG_CHUNK, _DT_BIG_STAGES, _DT_BIG_CHUNK_MAX_TOK = 8, 2, 16
#: most tokens :func:`decode_tma` serves, as 8, 16, 32 or 64 token columns (shared memory per
#: program 66 / 78 / 102 / 100 KB with 3 / 3 / 3 / ``_DT_STAGES_64`` ring chunks: two programs per SM).
#: H200, graphs (fifteenth session, ``benchmarks/exp_dtma_tokens.py``): 24-32 tokens 64-68 µs
#: on 28672x8192 and 8192x28672 against 100-118 for the prefill kernel routed before, 48-64
#: tokens 109-114 against 139-182 (64 columns spill ~200 bytes at 80 registers)
DECODE_TMA_MAX_M = 64
_DT_STAGES_64 = 2
#: with 8-bit codes (MXFP8) a ring chunk's codes take twice the shared memory: 2 chunks, up to 32
#: tokens (two programs per SM)
DECODE_TMA_MAX_M_8BIT = 32
_DT_STAGES_8BIT = 2
#: MXFP8 in :func:`decode_tma` (``MICROSCALE_DECODE_TMA_8BIT``, read at import; ``0``: refused, the
#: GEMV / Triton prefill kernel instead), from ``DECODE_TMA_MIN_M_8BIT`` tokens. H200, graphs
#: (twenty-sixth session): 28672x8192 at 4 / 16 / 32 tokens 65.7 / 67.8 / 81.5 µs against the GEMV's
#: 80.6 (4) and the Triton prefill kernel's 104.7 / 118.6; 8192x8192 26.6 / 27.7 / 31.5 against
#: 29.5 / 38.5 / 39.6; 2-3 tokens not measured (the GEMV keeps them)
_DECODE_TMA_8BIT = os.environ.get("MICROSCALE_DECODE_TMA_8BIT", "1") == "1"
DECODE_TMA_MIN_M_8BIT = 4
#: 8-bit integers (int8_fp16, int8_affine_g*, MXINT8) go to :func:`decode_tma` from
#: ``DECODE_TMA_MIN_M_8BIT`` tokens on weights of at least ``DECODE_TMA_EAGER_MIN_NK`` elements, from this
#: many on smaller ones. H200, graphs, weights past L2 (twenty-eighth session, ``h200_2026-12-03/s28/a/``),
#: 4 tokens, decode_tma / GEMV / Triton prefill: 28672x8192 int8_fp16 69.4 / 79.2 / 130.4 µs,
#: int8_affine_g128 66.5 / 72.3 / 120.2, MXINT8 66.7 / 76.4 / 139.5; 8192x8192 28.0 / 23.8 / 43.2,
#: 26.6 / 23.2 / 45.1, 26.4 / 22.8 / 45.8 (cuBLAS 110.5 / 33.9)
DECODE_TMA_SMALL_MIN_M_INT8 = 5
#: affine 4-bit integers go to :func:`decode_tma` from this many tokens (2 tokens: the GEMV), signed
#: ones (no zero points) from ``DECODE_TMA_MIN_M_INT4_SYM``. H200, graphs, weights past L2
#: (twenty-seventh session, ``h200_2026-12-03/s27/a/``), 28672x8192 at 2 / 3 / 4 tokens:
#: int4_affine_g128 GEMV 44.7 / 56.5 / 61.1 µs against decode_tma's 54.0 / 53.8 / 53.5 (per-pair
#: scaling; with the later post scale, ``_DT_POST_SCALE``, 41.6 / 41.4 at 2 / 3 tokens against the
#: GEMV's 43.3 / 56.1 in one round, ``s27/d/``: 2 tokens left on the GEMV, within that round's
#: spread); int4_affine_g32 45.4 / 57.8 / 60.9 against 53.2 / 53.5 / 53.3; int4_fp16 45.4 / 50.0 /
#: 59.2 against 54.7 / 54.8 / 55.1
DECODE_TMA_MIN_M_INT4 = 3
DECODE_TMA_MIN_M_INT4_SYM = 4
#: :func:`decode_tma` on integers with fp16 scales and one block per K step (blocks of a multiple of 64)
#: and at most ``_DT_POST_MAX_TOK`` token columns multiplies each step's fp32 MMA result by the rows'
#: fp16 scales instead of scaling every weight pair in bf16 (``MICROSCALE_DT_POST_SCALE``, read at
#: import; ``0``: per-pair scaling, each weight the bf16 of ``(code - z) * s`` as in
#: :func:`prefill_ws`; with the post scale the weights are exact, ``(code - z) * s``). sm_90 SASS:
#: 342 instructions per ring chunk at 16 token columns against 466. H200, graphs, weights past L2
#: (twenty-seventh session, ``h200_2026-12-03/s27/d/``), int4_affine_g128, post / per pair: 28672x8192
#: at 2 / 3 / 16 / 32 tokens 41.6 / 41.4 / 48.9 / 89.7 µs against 53.9 / 54.0 / 61.2 / 77.2; 8192x8192
#: 18.1 / 18.2 / 20.4 / 37.1 against 21.0 / 21.0 / 23.5 / 29.3 (32 columns: per pair)
_DT_POST_SCALE = os.environ.get("MICROSCALE_DT_POST_SCALE", "1") == "1"
_DT_POST_MAX_TOK = 16


def _dt_post(q: QTensor, tok: int) -> bool:
    """Whether :func:`decode_tma` with ``tok`` token columns applies ``q``'s block scales to the
    MMA results (``_DT_POST_SCALE``): integer codes with fp16 scales in blocks of a multiple of 64."""
    return (_DT_POST_SCALE and q.fmt.element.kind == "int" and q.fmt.scale.name == "fp16" and _dt_nps(q) == 1
            and tok <= _DT_POST_MAX_TOK)


def _dt_tokens(m: int) -> int:
    """Token columns of :func:`decode_tma`'s tile for ``m`` tokens: 8, 16, 32 or 64."""
    return 8 if m <= 8 else 16 if m <= 16 else 32 if m <= 32 else 64


#: K steps per TMA box of :func:`decode_tma`'s code words: 4, one ``[rows, 32]`` box (128-byte
#: rows, 128-byte swizzle) per ring chunk, against 1 (``[rows, 8]``, 32-byte rows): a fourth of
#: the copy operations, time within +-2 us (``benchmarks/exp_dtma_variants.py``); divides the chunk
_DT_WIDE = 4
#: K steps per TMA box of :func:`decode_tma`'s step-major scales: the ring chunk's (``[2 x chunk,
#: 256]`` bytes, consecutive rows of the copy) or 1; divides the chunk
_DT_SBOX = _DT_CHUNK
#: :func:`decode_tma`'s consumer warps free ring slots each on its own, without the partition-wide
#: barriers Gluon puts before each ``mbarrier`` wait and arrive (:mod:`microscale.kernels._ptx`;
#: 0.4-2.2% faster at 16 tokens in an A/B run, bit-identical; ``MICROSCALE_WARP_ARRIVE=0`` off)
_DT_WARP_ARRIVE = os.environ.get("MICROSCALE_WARP_ARRIVE", "1") != "0"
#: E2M1 weights keep :func:`decode_tma`'s step-major scales in the 256-row layout only, which its 128-row
#: tiles read through a 4-d descriptor (boxes of ``_DT_SBOX`` steps), so that any E2M1 weight with bf16
#: activations can take 256-row tiles where they are faster: 64 token columns, and 16-32 where K >= 2 N
#: (:func:`_dt_tile`). H200, thirty-third session, NVFP4, this default against ``MICROSCALE_DT_ONE_TABLE=0``,
#: µs: 64 columns 8192x8192 37.2 / 43.9, 8192x28672 88.8 / 108.4; 32 columns 8192x28672 57.2 / 61.3; 16
#: columns 8192x28672 45.6 / 45.1 (1% slower: the 128-row tile through the view would be 3-7% slower);
#: 8192x8192 at 8-32 and 8192x28672 at 8 columns even (the 128-row tiles read the view for free there).
#: ``MICROSCALE_DT_ONE_TABLE=0`` (read at import): each tile height its own table, each weight one height.
_DT_ONE_TABLE = os.environ.get("MICROSCALE_DT_ONE_TABLE", "1") == "1"


def _dt_nps(q: QTensor) -> int:
    """int32 block scales per row and K step in :func:`decode_tma`'s step-major copy of an
    integer weight with fp16 scales: 2 for blocks of 32, else 1 (E8M0 / UE4M3 scales: 1, four bytes)."""
    return 2 if q.fmt.scale.name == "fp16" and q.fmt.block_size == 32 else 1


def _step_scales(q: QTensor, rows: int) -> torch.Tensor:
    """``q``'s block scales step-major for :func:`decode_tma`: ``[tiles * steps * rows / 64,
    256]`` uint8, where row tile ``t`` (``rows`` weight rows, zero-padded) and K step ``s`` (64
    elements) hold ``[rows, 4]`` bytes at row ``(t * steps + s) * rows / 64``: one byte per 16
    elements (E8M0 scales of 32 repeated), so that one TMA box brings a step's scales. For
    integers with fp16 scales a step holds ``[nps, rows]`` int32 (:func:`_dt_nps`: 1 for
    blocks of a multiple of 64, the same bytes; 2 for blocks of 32), the fp16 scale bits of
    elements ``64 s + 32 j ..`` | the zero point << 16 (8 for two's-complement codes)."""
    n, k = q.shape
    tiles = cdiv(n, rows)
    if q.fmt.scale.name == "fp16":  # integers: fp16 bits | zero point << 16, _dt_nps(q) int32 a step
        nps = _dt_nps(q)
        zp = q.zero_points.to(torch.int32) if q.zero_points is not None else 8
        pk = (q.scales.reshape(n, -1).view(torch.int16).to(torch.int32) & 0xFFFF) | (zp << 16)
        pk = pk.repeat_interleave(q.fmt.block_size // 16, dim=1)[:, :: 4 // nps]  # the block of 64 s + 64 j / nps
        pad = torch.zeros((tiles * rows, k // 64 * nps), dtype=torch.int32, device=pk.device)
        pad[:n] = pk
        return (pad.reshape(tiles, rows, k // 64, nps).permute(0, 2, 3, 1).contiguous().view(torch.uint8)
                .reshape(-1, 256))
    sc = q.scales.reshape(n, -1).view(torch.uint8)
    if sc.shape[1] != k // 16:
        sc = sc.repeat_interleave(k // 16 // sc.shape[1], dim=1)
    pad = torch.zeros((tiles * rows, k // 16), dtype=torch.uint8, device=sc.device)
    pad[:n] = sc
    return pad.reshape(tiles, rows, k // 64, 4).permute(0, 2, 1, 3).reshape(-1, 256).contiguous()


@functools.lru_cache(maxsize=None)
def _dt_layouts(wide: int, tok: int = 16, f16: bool = False) -> tuple:
    """Shared-memory layouts of :func:`decode_tma`'s TMA boxes: code words (``wide`` K steps a
    box) swizzled by their row width (conflict-free 8-byte reads of one K step's words by each
    quad), scale bytes unswizzled (each warp reads its own rows), activations (``[tok, 64]``,
    bf16 or ``f16``) as the MMA operand wants them."""
    from triton.experimental.gluon import language as gl

    return (gl.NVMMASharedLayout(swizzle_byte_width=0 if wide == 1 else 32 * wide, element_bitwidth=32, rank=2),
            gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2),
            gl.NVMMASharedLayout.get_default_for([tok, 64], gl.float16 if f16 else gl.bfloat16))


def _dt_weight_descs(q: QTensor, wv: "_WeightViews", rows: int | None = None) -> tuple:
    """TMA descriptors of ``q``'s code words and step-major scales (:func:`_step_scales`) for
    :func:`decode_tma` tiles of ``rows`` rows (default ``_DT_ROWS``), made once per weight, tile
    height and version of its tensors and kept on it (not while a CUDA graph is being captured: the
    graph then makes its own step-major scales at every replay; :func:`linear`'s eager calls in the
    kernel's token range make them ahead, see :func:`_route`)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    rows = rows or _DT_ROWS
    trows = _dt_table_rows(q, rows)
    key = (_weight_key(q), _DT_WIDE, _DT_SBOX, trows)  # (the switches: benchmarks/exp_dtma_variants.py)
    kept = q.__dict__.get("_ms_dt_descs")
    hit = kept.get(rows) if kept is not None else None
    if hit is not None and hit[0] == key:
        return hit[1]
    # one step-major table per weight and table height, shared by the tile heights that read it
    table = kept.get(("table", trows)) if kept is not None else None
    table = table[1] if table is not None and table[0] == key else _step_scales(q, trows)
    # a box of 8-bit codes (16 words a step) spans half the steps: the same 32 * _DT_WIDE-byte rows
    cw = _DT_WIDE if q.fmt.element.bits == 4 else max(_DT_WIDE // 2, 1)
    lw, ls, _ = _dt_layouts(cw * q.fmt.element.bits // 4)
    if trows == rows:
        sdesc = TensorDescriptor.from_tensor(table, [_DT_SBOX * _dt_nps(q) * rows // 64, 256], ls)
    else:  # 128-row tiles on the 256-row table: [tiles256 x steps, half, 2, 256] (see _decode_tma_kernel)
        sdesc = TensorDescriptor(table, [table.shape[0] // 4, 2, 2, 256], [1024, 512, 256, 1], [_DT_SBOX, 1, 2, 256],
                                 gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=4))
    descs = (TensorDescriptor.from_tensor(wv.words, [rows, 2 * q.fmt.element.bits * cw], lw), sdesc)
    if not _capturing(q.data):
        d = q.__dict__.setdefault("_ms_dt_descs", {})
        d[rows] = (key, descs)
        d[("table", trows)] = (key, table)
    return descs


def _dt_table_rows(q: QTensor, rows: int) -> int:
    """The tile height whose step-major scale layout :func:`decode_tma`'s ``rows``-row tiles read on
    ``q``: their own, or with ``_DT_ONE_TABLE`` the 256-row one for every E2M1 weight (one table for
    both heights, so that a weight can take 256-row tiles at 64 token columns and 128-row ones below)."""
    return _DT_TILE_BIG[0] if _DT_ONE_TABLE and _fp4_codes(q) and rows == _DT_ROWS else rows


def _decode_tma_reason(q: QTensor, x: torch.Tensor) -> str | None:
    """Why :func:`decode_tma` cannot serve ``x @ dequant(q)^T``, or None."""
    why = _prefill_ws_reason(q, x)
    if why is not None:
        return why
    if q.fmt.element.bits == 8 and not _DECODE_TMA_8BIT:
        return "takes 8-bit codes only with MICROSCALE_DECODE_TMA_8BIT=1"
    if q.fmt.element.bits == 8 and x.shape[0] > DECODE_TMA_MAX_M_8BIT:
        return f"serves 1 to {DECODE_TMA_MAX_M_8BIT} tokens with 8-bit codes, got {x.shape[0]}"
    if q.fmt.scale.name == "fp16" and q.fmt.block_size % 64 and q.fmt.block_size != 32:
        return f"serves integer weights with fp16 scales in blocks of 32 or a multiple of 64, not {q.fmt.block_size}"
    if not 1 <= x.shape[0] <= DECODE_TMA_MAX_M:
        return f"serves 1 to {DECODE_TMA_MAX_M} tokens, got {x.shape[0]}"
    if q.shape[1] % (64 * _DT_CHUNK):
        return f"needs K a multiple of {64 * _DT_CHUNK}, got {q.shape[1]}"
    return None


def _dt_ring(rows: int, tok: int, k: int, bits: int) -> tuple[int, int]:
    """``(K steps per ring chunk, ring chunks)`` of :func:`decode_tma`'s ``rows``-row tiles with ``tok`` token
    columns on ``bits``-bit codes and K = ``k``: ``_DT_BIG_CHUNK`` / ``_DT_BIG_STAGES`` for the 256-row tile
    where they apply (4-bit codes, at most ``_DT_BIG_CHUNK_MAX_TOK`` columns, K a multiple of 64 x that chunk),
    else ``_DT_CHUNK`` steps in as many chunks as shared memory holds."""
    if rows == _DT_TILE_BIG[0] and bits == 4 and tok <= _DT_BIG_CHUNK_MAX_TOK and k % (64 * _DT_BIG_CHUNK) == 0:
        return _DT_BIG_CHUNK, _DT_BIG_STAGES
    return _DT_CHUNK, _DT_STAGES_8BIT if bits == 8 else _DT_STAGES if tok < 64 else min(_DT_STAGES, _DT_STAGES_64)


def choose_decode_tma_programs(n: int, k: int, num_sms: int, rows: int = 0, per_sm: int = 0, chunk: int = 0) -> int:
    """Programs for :func:`decode_tma` on an ``n x k`` weight, with tiles of ``rows`` rows,
    ``per_sm`` programs resident per SM and ring chunks of ``chunk`` K steps (default ``_DT_ROWS``, ``_DT_PER_SM``,
    ``_DT_CHUNK``). Units: row tiles, cut into
    the fewest K parts (a power of two, at most 8, dividing the chunks) that give every SM
    one; as many units per program as ``per_sm`` resident per SM need (whole units where the
    count divides) where that spreads evenly over the SMs, else ``per_sm`` programs per SM, each
    with an equal stream-K share (H200, 16 tokens, ``benchmarks/exp_balance.py``: 176 tiles 44.6
    µs with equal shares against 51.5 with one program per tile; 224 tiles 57.3 against 54.9)."""
    rows, per_sm = rows or _DT_ROWS, per_sm or _DT_PER_SM
    tiles, nct = cdiv(n, rows), k // (64 * (chunk or _DT_CHUNK))
    parts = 1
    while parts < 8 and tiles * parts < num_sms and nct % (2 * parts) == 0:
        parts *= 2
    units = tiles * parts
    per = cdiv(units, per_sm * num_sms)  # units per program
    programs = cdiv(units, per)
    # SMs run one or two programs: the busiest has ceil(programs / SMs), against programs / SMs on average
    if programs > num_sms and cdiv(programs, num_sms) * num_sms > 1.3 * programs:
        programs = per_sm * num_sms
    elif per_sm == 1 and units > num_sms and programs < 0.8 * num_sms:  # (several units each: SMs left idle)
        programs = num_sms
    return min(programs, tiles * nct)


@functools.lru_cache(maxsize=256)
def _dt_parts(tiles: int, nct: int, programs: int) -> int:
    """Most programs sharing one row tile when :func:`decode_tma`'s ``programs`` take equal
    contiguous shares of the ``tiles x nct`` ring chunks (1: every tile is one program's)."""
    total = tiles * nct
    return max(((t + 1) * nct * programs - 1) // total - ((t * nct + 1) * programs - 1) // total + 1
               for t in range(tiles))


def _dt_big(q: QTensor, m: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether :func:`decode_tma` takes its 256-row tile (``_DT_TILE_BIG``) for ``m`` tokens of ``dtype`` on
    ``q`` by default: E2M1 weights with bf16 activations (what that tile was built and tested for), at
    every token count where one 256-row tile per SM keeps 80-100% of the SMs busy (see ``_DT_TILE_BIG``),
    and with ``_DT_ONE_TABLE`` (one scale table for both heights) at 64 token columns, and at 16-32 where
    K >= 2 N (where each was measured faster)."""
    if not (_fp4_codes(q) and dtype == torch.bfloat16):
        return False
    sms = _num_sms(device)
    fills = 0.8 * sms <= cdiv(q.shape[0], _DT_TILE_BIG[0]) <= sms
    tok = _dt_tokens(m)
    return fills or (_DT_ONE_TABLE and (tok == 64 or (tok >= 16 and q.shape[1] >= 2 * q.shape[0])))


def _dt_tile(q: QTensor, x2: torch.Tensor, rows: int | None = None) -> tuple[int, int, int, int]:
    """:func:`decode_tma`'s tile for activations like ``x2`` on ``q``: ``(rows, row slices per consumer
    warp, programs per SM, registers)``. ``rows`` None: ``_DT_TILE_BIG`` where :func:`_dt_big` says so, else
    ``_DT_ROWS``; else the tile of that height, ValueError where the kernel has none."""
    big = _fp4_codes(q) and x2.dtype == torch.bfloat16  # (the 256-row tile was built and tested for these)
    if rows is None:
        rows = _DT_TILE_BIG[0] if _dt_big(q, x2.shape[0], x2.dtype, x2.device) else _DT_ROWS
    if rows == _DT_TILE_BIG[0] and big:
        return _DT_TILE_BIG
    if rows == _DT_ROWS:
        return _DT_ROWS, 1, _DT_PER_SM, 80
    raise ValueError(f"{_OP}: decode_tma takes rows={_DT_ROWS}, or {_DT_TILE_BIG[0]} for E2M1 weights with "
                     f"bfloat16 activations; got rows={rows} for {q.fmt.name} and {x2.dtype}")


def decode_tma(x2: torch.Tensor, q: QTensor, bias: torch.Tensor | None = None,
               programs: int | None = None, tokens: int | None = None, rows: int | None = None) -> torch.Tensor:
    """``x2 [M <= 64, K] @ dequant(q)^T (+ bias)`` for bf16 or fp16 activations on Hopper and an E2M1
    weight (NVFP4, MXFP4), a 4/8-bit integer weight with fp16 scales in blocks of 32 or a multiple
    of 64 (``int4_affine_g*``, ``int4_fp16``, ``int8_affine_g*``, ``int8_fp16``), MXFP8 (E4M3, E5M2),
    MXINT4 or MXINT8 (8-bit codes: ``M <= 32``), with the
    warp-specialized Gluon kernel
    (:mod:`microscale.kernels._decode_tma`: a producer warp brings each K step's code words,
    block scales and activations by TMA into a shared-memory ring, eight consumer warps
    decode them into ``mma.sync`` and free each slot each on its own; fp16 activations as in
    :func:`prefill_ws`). :func:`linear` routes here
    from ``DECODE_TMA_MIN_M``
    (``DECODE_TMA_SMALL_MIN_M``; per format :func:`_dt_min_m`) tokens while a CUDA graph is being
    captured and for large weights (``_decode_tma_wanted``). Work: the row tiles' ring chunks (256 K elements,
    or 512: :func:`_dt_ring`) in tile-major order, split into ``programs`` contiguous shares of equal size (stream-K;
    default :func:`choose_decode_tma_programs`); a tile shared by several programs is added
    up in K order (256-row tiles by their first program when every program is resident, else by the
    last part to arrive). ``tokens``: the tile's token columns (8, 16, 32 or 64, at
    least M; default the fewest). ``rows``: the tile height, 128 (8 consumer warps of 16 rows, two
    programs per SM) or 256 (E2M1 weights and bf16 activations: 8 warps of two 16-row slices, one
    program per SM); default :func:`_dt_tile`. The first call on a weight makes its step-major scales
    and their TMA descriptors (kept on the QTensor, per tile height). Raises ValueError saying why when
    it cannot serve the call."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .kernels import _decode_tma as dk
    from .kernels import _prefill_gluon as pg
    from .kernels import _ptx

    _check(x2, q.shape[0], q.shape[-1], q.device, bias)
    if tokens is not None and (tokens not in (8, 16, 32, 64) or tokens < x2.shape[0]):
        raise ValueError(f"{_OP}: decode_tma needs tokens in (8, 16, 32, 64) and at least M={x2.shape[0]}, "
                         f"got {tokens}")
    why = _decode_tma_reason(q, x2)
    if why is not None:
        raise ValueError(f"{_OP}: decode_tma {why}")
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    m, k = x2.shape
    n = q.shape[0]
    if programs is not None and programs < 1:
        raise ValueError(f"{_OP}: decode_tma needs programs >= 1, got {programs}")
    tok = _dt_tokens(m) if tokens is None else tokens
    rows, slices, per_sm, nreg = _dt_tile(q, x2, rows)
    cb = q.fmt.element.bits
    xp = _scratch((m, k), x2.dtype, x2.device)  # activations in the consumers' K order
    launch(pg._xperm_kernel, (cdiv(m, 32), k // 64), x2, xp, m, x2.stride(0), K=k, BLOCK_R=32, CB=cb, num_warps=4)
    f16 = x2.dtype == torch.float16
    sk, ke, post = _gluon_scale_args(q, f16)
    wv = _weight_views(q)
    w_desc, s_desc = _dt_weight_descs(q, wv, rows)
    x_desc = TensorDescriptor.from_tensor(xp, [tok, 64], _dt_layouts(_DT_WIDE, tok, f16)[2])
    out = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    gs = wv.global_scale if wv.global_scale is not None else out
    tiles = cdiv(n, rows)
    chunk, stages = _dt_ring(rows, tok, k, cb)
    nct = k // (64 * chunk)
    grid = min(tiles * nct, programs or choose_decode_tma_programs(n, k, _num_sms(x2.device), rows, per_sm, chunk))
    maxp = _dt_parts(tiles, nct, grid)
    ws, cnt = _workspace(x2.device, tiles * maxp * rows * tok if maxp > 1 else 0, tiles * rows * 4 if maxp > 1 else 0)
    launch(dk._decode_tma_kernel, (grid,), w_desc, s_desc, x_desc, gs, bias if bias is not None else out,
           out, ws, cnt, n, m, tiles, maxp, ke, post, NCT=nct, C=chunk, SK=sk, STAGES=stages,
           HAS_GS=q.global_scale is not None, HAS_BIAS=bias is not None, NPS=_dt_nps(q), CB=cb,
           EI=_gluon_elem_kind(q), F16=f16,
           POST=_dt_post(q, tok), WARP_ARRIVE=_DT_WARP_ARRIVE and _ptx.active(), SLICES=slices,
           # a shared tile's first program may wait for later ones: only when all programs fit at once
           OWNER=slices == 2 and grid <= per_sm * _num_sms(x2.device),
           num_warps=rows // (16 * slices), maxnreg=nreg)
    return out


def _word_rows(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``t`` [rows, entries] as an int32 view when its rows are whole 4-byte words, so the
    kernel loads entries as words (wide enough for asynchronous copies); else ``t``."""
    row_bytes = t.shape[-1] * t.element_size()
    if t.dim() == 2 and row_bytes % 4 == 0 and t.data_ptr() % 4 == 0:
        return t.view(torch.int32), True
    return t, False
