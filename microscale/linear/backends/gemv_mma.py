"""``gemv_mma``: tensor-core decode of E2M1 weights for 3-16 tokens of bf16 activations
(device code: :mod:`microscale.linear._kernels._gemv_mma`; docs/decisions/linear-gemv.md)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from ...qtensor import QTensor
from ...runtime import target
from ...runtime.launch import cdiv, launch
from ...runtime.workspace import workspace
from .. import tuning
from ..eligibility import OP, check, e2m1_weight_reason
from ..weight_state import e8m0_window, ue4m3_normal, views


@dataclass(frozen=True)
class GemvMmaConfig:
    """Tiles of :func:`gemv_mma`: each warp takes ``16 * row_groups`` weight rows and
    ``4 * words_per_lane`` int32 words of codes (``32 * words_per_lane`` elements) per row
    per K step; ``num_warps`` warps per program; K split ``split_k`` ways (fp32 partials in
    a workspace, summed in split order by the tile's last split)."""

    row_groups: int = 2
    words_per_lane: int = 8
    num_warps: int = 2
    split_k: int = 1


def gemv_mma_reason(q: QTensor, x: torch.Tensor, c: GemvMmaConfig) -> str | None:
    """Why :func:`gemv_mma` cannot serve ``x @ dequant(q)^T`` with config ``c``, or None
    (device-independent reasons first)."""
    why = e2m1_weight_reason(q)
    if why is not None:
        return why
    f = q.fmt
    k = q.shape[1]
    if x.shape[-1] != k or not 0 < x.numel() // k <= tuning.get().gemv_mma_max_m:
        return f"needs 1..{tuning.get().gemv_mma_max_m} tokens of K={k}"
    if x.dtype != torch.bfloat16:
        return f"needs bfloat16 activations, got {x.dtype}"
    if c.words_per_lane % 4 or k % (8 * c.words_per_lane):
        return f"needs K a multiple of a lane's words ({8 * c.words_per_lane} elements), got K={k}"
    if split_words(k // 8, c.split_k, c.words_per_lane) is None:
        return f"cannot split K={k} into {c.split_k} ranges of whole {32 * c.words_per_lane}-element steps (one would be empty)"
    if not (x.is_cuda and q.data.is_cuda):
        return "needs CUDA tensors"
    if target.capability(x.device) < (9, 0):
        return "needs Hopper (sm_90) or newer"
    if not (q.data.is_contiguous() and q.scales.is_contiguous() and x.is_contiguous()
            and q.data.data_ptr() % 16 == 0 and q.scales.data_ptr() % 4 == 0 and x.data_ptr() % 16 == 0):
        return "needs contiguous, 16-byte aligned codes and activations (4-byte aligned scales)"
    if f.scale.name == "e8m0" and e8m0_window(q) is None:
        return "E8M0 scales span more than 126 binades, hold NaN, or are unscanned during a CUDA graph capture"
    return None


def gemv_mma_default_config(q: QTensor, x: torch.Tensor) -> GemvMmaConfig | None:
    if len(q.shape) != 2 or x.shape[-1] == 0:
        return None
    n, k = (int(v) for v in q.shape)
    return choose_gemv_mma_config(n, k, x.device, x.numel() // k)


def gemv_mma_supported(q: QTensor, x: torch.Tensor, config: GemvMmaConfig | None = None) -> bool:
    """Whether :func:`gemv_mma` serves ``x @ dequant(q)^T``: CUDA (Hopper or newer), bf16
    ``x`` of at most ``tuning.gemv_mma_max_m`` tokens, an unpadded 2-D weight of E2M1 codes with
    UE4M3 (16) or E8M0 (32) block scales in row-major order, K a multiple of a lane's words
    (``8 * words_per_lane`` elements), 16-byte aligned codes and activations; E8M0 scales
    within a 126-binade window (see :func:`e8m0_window`)."""
    c = config or gemv_mma_default_config(q, x)
    return c is not None and gemv_mma_reason(q, x, c) is None


def choose_gemv_mma_config(n: int, k: int, device: torch.device, m: int = 1) -> GemvMmaConfig:
    """Two row groups per warp; up to 8 tokens 8 words per lane per step and 2 warps, from
    9 tokens 4 words and 4 warps (registers); K split by :func:`with_gemv_mma_split`
    (docs/decisions/linear-gemv.md)."""
    return _choose_gemv_mma_config(n, k, m, target.num_sms(device))


@functools.lru_cache(maxsize=1024)  # asked on every call
def _choose_gemv_mma_config(n: int, k: int, m: int, sms: int) -> GemvMmaConfig:
    d = GemvMmaConfig() if m <= 8 else GemvMmaConfig(words_per_lane=4, num_warps=4)
    while k % (8 * d.words_per_lane) and d.words_per_lane > 4:
        d = replace(d, words_per_lane=d.words_per_lane // 2)
    return _split(d, n, k, sms)


def with_gemv_mma_split(c: GemvMmaConfig, n: int, k: int, device: torch.device) -> GemvMmaConfig:
    """``c`` with K split (by powers of two, each slice at least 4 steps; 2 on rows of fewer than 16 steps,
    without passing 1.5x the warps wanted) until about 12 warps per SM stream the weight; a K of whole
    steps splits into whole steps only."""
    return _split(c, n, k, target.num_sms(device))


def _split(c: GemvMmaConfig, n: int, k: int, sms: int) -> GemvMmaConfig:
    step = 4 * c.words_per_lane
    kw = k // 8
    warps = -(-n // (16 * c.row_groups))
    want = 12 * sms
    split = 1
    even = kw % step == 0
    # rows of fewer than 16 steps (K=2880) split into slices of 2 steps, up to 1.5x the warps wanted: on an H100
    # [5120, 2880] took 10.9-11.2 µs split 4 where 2 took 13.8-14.8; [23040, 2880] was best at 2
    short = kw < 16 * step
    least = 2 if short else 4
    while (warps * split < want and (not even or kw % (step * split * 2) == 0) and kw // (step * split * 2) >= least
           and not (short and 2 * warps * split > want * 3 // 2)):
        split *= 2
    return replace(c, split_k=split)


def split_words(kw: int, split_k: int, words_per_lane: int) -> int | None:
    """Words of a ``kw``-word row each of ``split_k`` K ranges takes (whole steps of ``4 * words_per_lane``
    words; the last range may be short), or None when a range would be empty."""
    step = 4 * words_per_lane
    per = cdiv(cdiv(kw, split_k), step) * step
    return per if per * (split_k - 1) < kw else None


def gemv_mma_scale_args(q: QTensor) -> tuple[int, int, float]:
    """``(SK, ke, post)`` of :func:`gemv_mma` for E2M1 weight ``q``: the scale kind (:mod:`._gemv_mma`), its
    E8M0 input ``(126 - D) * 0x10001`` and the power of two the epilogue multiplies by."""
    from .._kernels import _gemv_mma as kern

    if q.fmt.scale.name == "ue4m3":
        return (kern.SK_UE4M3N if tuning.get().gemv_mma_scale_imad and ue4m3_normal(q) else kern.SK_UE4M3), 0, 2.0 ** 7
    d = e8m0_window(q)
    return kern.SK_E8M0, (126 - d) * 0x10001, 2.0 ** d


def gemv_mma(x2: torch.Tensor, q: QTensor, bias: torch.Tensor | None = None,
             config: GemvMmaConfig | None = None) -> torch.Tensor:
    """``x2 [M, K] @ dequant(q)^T (+ bias)`` for up to 16 tokens on tensor cores (see
    :mod:`microscale.linear._kernels._gemv_mma`). Raises ValueError saying why when it cannot
    serve the call (:func:`gemv_mma_supported`)."""
    check(x2, q.shape[0], q.shape[-1], q.device, bias)
    c = config or gemv_mma_default_config(q, x2)
    why = gemv_mma_reason(q, x2, c)
    if why is not None:
        raise ValueError(f"{OP}: gemv_mma {why}")
    return gemv_mma_run(x2, q, bias, c)


def gemv_mma_run(x2: torch.Tensor, q: QTensor, bias: torch.Tensor | None, c: GemvMmaConfig,
                 global_scale: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`gemv_mma` on a call already checked; ``global_scale`` (float32 ``[1]`` on the device)
    multiplies the float32 sums in place of ``q``'s own global scale."""
    from .._kernels import _gemv_mma as kern

    m, k = x2.shape
    n = q.shape[0]
    f = q.fmt
    kw = k // 8
    wpg = f.block_size // 8
    step = 4 * c.words_per_lane
    per = split_words(kw, c.split_k, c.words_per_lane)
    if kw % c.words_per_lane or per is None:
        raise ValueError(f"{OP}: K={k} does not split into {c.split_k} ranges of {8 * step}-element steps")
    tg = -(-m // 8)
    sk, ke, post = gemv_mma_scale_args(q)
    lasm, lcons, nout = kern.load_asm(c.row_groups, c.words_per_lane, 0, c.words_per_lane // wpg)
    xasm, xcons, nxout = kern.load_asm(0, c.words_per_lane, tg, 0, 16)
    sasm, scons = kern.step_asm(c.row_groups, c.words_per_lane, tg, wpg, sk)
    split = c.split_k
    out = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    wv = views(q)
    scales = wv.scales_u8
    gs = global_scale if global_scale is not None else wv.global_scale
    rows = 16 * c.row_groups * c.num_warps
    tiles = -(-n // rows)
    if split > 1:
        ws, cnt = workspace(x2.device, split * tiles * 4 * c.row_groups * tg * 32 * c.num_warps, tiles)
    else:
        ws = cnt = out
    launch(kern._gemv_mma_kernel, (tiles, split),
           x2, wv.words, scales, gs if gs is not None else out, bias if bias is not None else out, out, ws, cnt, ke,
           n, m, kw, x2.stride(0), kw, scales.stride(0), out.stride(0), post,
           KW_PER_SPLIT=per, RG=c.row_groups, WPL=c.words_per_lane, TG=tg, WPG=wpg, SK=sk, SPLIT_K=split,
           HAS_GS=gs is not None, HAS_BIAS=bias is not None, EVEN_K=per * split == kw, LASM=lasm, LCONS=lcons, NOUT=nout,
           XASM=xasm, XCONS=xcons, NXOUT=nxout, SASM=sasm, SCONS=scons, NW=c.num_warps,
           num_warps=c.num_warps, num_stages=1)
    return out
