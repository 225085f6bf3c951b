"""Attention over a block-scaled paged KV cache: :func:`decode_attention` (one query per
sequence, flash decoding) and :func:`extend_attention` (causal prefill / extend, chunked),
both reading the pages directly; K/V are decoded tile by tile in registers, never written
back to memory in a wider type.

CUDA tensors (or the Triton interpreter) run the Triton kernels in :mod:`._kernels`; CPU
tensors run :func:`~.reference.attention_reference` in float32.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch

from ..formats import Format
from ..formats.kinds import ScaleKind, scale_kind
from ..runtime import target
from .cache import PagedKVCache
from .reference import attention_reference, check_attention_args

__all__ = ["decode_attention", "extend_attention", "AttentionConfig", "choose_config"]


@dataclass(frozen=True)
class AttentionConfig:
    """Tiling of one call: ``block_n`` keys per loop step, ``rows`` query rows (tokens x
    heads of a GQA group, >= 8: the MMA's N side), ``num_splits`` splits of the visible keys,
    ``num_warps``, ``num_stages`` (Triton's software pipelining of the code / scale loads),
    ``maxnreg`` (a register cap per thread: 168 lets three default decode programs share an SM
    where 182 registers fit two; None: the compiler's count), ``pdl`` (on a Hopper-or-newer GPU, both
    launches as programmatic dependents: each waits for the previous kernel before any read, so the
    combine's and the next call's launches overlap the kernel before them; :func:`choose_config` turns it on
    for decode with few query heads)."""

    block_n: int
    rows: int
    num_splits: int
    num_warps: int = 4
    num_stages: int = 3
    maxnreg: int | None = None
    pdl: bool = False


#: decode programs of the default tile (128 keys, 4 warps) an SM holds at once: 182 registers a thread
#: (sm_90 compile) fit two 128-thread programs in 64K registers (shared memory at 5 stages, 75-109 KiB each, fits two)
DECODE_PROGRAMS_PER_SM = 2

#: Triton pipeline stages of decode. 2-4 leave the page-table -> codes load chain one buffer, loaded after the step's
#: MMAs; 5 double-buffer it (a program decodes one step while the next streams; 2 programs still fit an SM): 4-11%
#: faster on an H100 at 32k keys, batch 1 and 8, fp8 / NVFP4 / MXFP4
DECODE_STAGES = 5


def decode_splits(pairs: int, n_blocks: int, slots: int) -> int:
    """Splits of each (sequence, KV head) pair's ``n_blocks`` key blocks for ``pairs`` pairs on ``slots``
    resident programs: the count whose rounds x (blocks per program + one block of per-program cost:
    the prologue and the split's partial output) is least, fewest splits on a tie.

    Programs past the slots run as a further round of full-length programs: 64 pairs in 5 splits are
    320 programs for 264 slots, two rounds of 52 blocks, where 4 splits are one round of 64."""
    best, best_s = None, 1
    for s in range(1, min(n_blocks, 256) + 1):
        cost = -(-pairs * s // slots) * (-(-n_blocks // s) + 1)
        if best is None or cost < best:
            best, best_s = cost, s
    return best_s


def choose_config(n_seqs: int, kv_heads: int, group: int, max_len: int, max_q: int, device: torch.device,
                  block_n: int | None = None) -> AttentionConfig:
    """Decode: 128 keys per step, :data:`DECODE_STAGES` pipeline stages, the keys split so that the
    programs fill the resident slots (:data:`DECODE_PROGRAMS_PER_SM` x SMs) in as few rounds as
    possible (:func:`decode_splits`: all SMs stream KV at batch 1, no short second round at batch 8),
    programmatic launches while the query heads are at most the SMs; prefill: 64-row query tiles, 64
    keys per step, at least 2 x SMs programs. ``max_len``: the most keys a query tile can see (with a
    sliding window, about the window)."""
    if block_n is None:  # decode: 128 keys a step halve the per-step softmax work per key (SASS count)
        block_n = 128 if max_q == 1 else 64
    gp = 1 << max(0, (group - 1).bit_length())
    n_blocks = max(1, -(-max_len // block_n))
    if max_q == 1:
        rows = max(16, gp)  # one token's heads, padded: 16 rows take the wgmma path (8 fall back to mma.sync)
        sms = target.num_sms(device)
        splits = decode_splits(max(1, n_seqs * kv_heads), n_blocks, DECODE_PROGRAMS_PER_SM * sms)
        # programmatic launches where the combine's programs (one per query head), launched early and waiting,
        # fit one an SM beside the attention programs: 0.6-0.9 us saved at batch 1 (64 heads); at batch 8 (512)
        # they cost up to 2%
        return AttentionConfig(block_n=block_n, rows=rows, num_splits=splits, num_stages=DECODE_STAGES,
                               pdl=n_seqs * kv_heads * group <= sms)
    rows = max(64, gp)
    m_tiles = -(-max_q // (rows // gp))
    want = -(-2 * target.num_sms(device) // max(1, n_seqs * kv_heads * m_tiles))
    return AttentionConfig(block_n=block_n, rows=rows, num_splits=max(1, min(want, n_blocks, 256)))


def decode_mode(fmt: Format, head_dim: int) -> tuple[int, int, float]:
    """How the kernel turns a format's codes into bf16 operands: (MODE, CPAIR, RES) (see
    ``_kernels``). 1: one scale per token and head, minifloat codes (scale on the logits /
    probabilities); 2: UE4M3 block scales (one exact bf16x2 multiply); 3: E8M0 block scales (two);
    0: the rest (float32 decode per element). CPAIR: bf16x2 bits of ``2^(127 - bias)``; RES: the
    power of two the logits and output are multiplied by."""
    el = fmt.element
    if el.kind != "float" or fmt.zero_point:
        return 0, 0, 1.0
    cpair = ((254 - el.bias) << 7) * 0x10001  # 2^(127 - bias): a normal bf16 for every 4/8-bit minifloat
    kind = scale_kind(fmt)
    if fmt.block_size == head_dim:
        return 1, cpair, 1.0
    if kind is ScaleKind.UE4M3:
        return 2, 0, 2.0 ** (127 - el.bias - 119)
    if kind is ScaleKind.E8M0:
        return 3, cpair, 1.0
    return 0, 0, 1.0


# Triton's interpreter (its bf16 dot is wrong): read once, as triton.jit reads it when the kernels are imported
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _device():
    from ..runtime import launch
    from . import _kernels

    return launch, _kernels


def _raw_scales(t: torch.Tensor) -> torch.Tensor:
    """Scales viewed as integers of their width (the kernel decodes the bits)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _paged(q, cache: PagedKVCache, layer, q_lens, seqs, softmax_scale, sliding_window, sinks, softcap, config, op):
    seqs, q_lens = check_attention_args(q, cache, layer, q_lens, seqs, sinks, sliding_window, softcap, op)
    if q.device.type != "cuda" and not target.interpreting():
        return attention_reference(q, cache, layer, q_lens=q_lens, seqs=seqs, softmax_scale=softmax_scale,
                                   sliding_window=sliding_window, sinks=sinks, softcap=softcap).to(q.dtype)
    from ..linear.packed import format_constexprs

    rl, kern = _device()
    dev = q.device
    hq, d = q.shape[1], q.shape[2]
    hkv = cache.num_kv_heads
    group = hq // hkv
    if d & (d - 1) or d < 16:
        raise NotImplementedError(f"{op}: head_dim={d}; the kernel takes powers of two >= 16")
    lens = cache.lengths(layer)
    max_len = max(lens[s] for s in seqs)
    max_q = max(q_lens)
    # the most keys one query tile can see: with a window, about the window (the splits start at its first key)
    reach = max_len if sliding_window is None else min(max_len, int(sliding_window) + max_q + 126)
    cfg = config or choose_config(len(seqs), hkv, group, reach, max_q, dev)
    gp = 1 << max(0, (group - 1).bit_length())
    if cfg.rows % gp or cfg.rows < 8:
        raise ValueError(f"{op}: config rows={cfg.rows} must be >= 8 and a multiple of the padded group {gp}")
    if cfg.block_n < 16 or cfg.block_n & (cfg.block_n - 1):
        raise ValueError(f"{op}: config block_n={cfg.block_n} must be a power of two >= 16")
    if cfg.maxnreg is not None and (type(cfg.maxnreg) is not int or not 24 <= cfg.maxnreg <= 255):
        raise ValueError(f"{op}: config maxnreg={cfg.maxnreg!r} must be None or an int in [24, 255] (registers a thread)")
    block_m = cfg.rows // gp
    if sliding_window is not None:  # a tile's first visible key is aligned down to block_n
        reach = min(max_len, int(sliding_window) + min(block_m, max_q) - 1 + cfg.block_n - 1)
    split_len = -(-(-(-reach // max(1, cfg.num_splits))) // cfg.block_n) * cfg.block_n
    n_splits = max(1, -(-reach // split_len))
    starts = [0]
    for n in q_lens[:-1]:
        starts.append(starts[-1] + n)
    key = (tuple(seqs), tuple(q_lens))
    meta = cache._meta.get(key)
    if meta is None:  # kept per batch layout: no host-to-device copy per call (CUDA-graph capturable)
        meta = cache._meta[key] = torch.tensor([seqs, starts, q_lens], dtype=torch.int32).to(dev)
    total = q.shape[0]
    o_part = torch.empty((total, hq, n_splits, d), dtype=torch.float32, device=dev)
    lse = torch.empty((total, hq, n_splits), dtype=torch.float32, device=dev)
    out = torch.empty((total, hq, d), dtype=q.dtype, device=dev)
    if q.stride(2) != 1:
        q = q.contiguous()
    fc = format_constexprs(cache.fmt, specials=cache.fmt.element.kind == "float")
    mode, cpair, res = decode_mode(cache.fmt, d)
    kz = cache.k_zero_points[layer] if cache.fmt.zero_point else cache.k_codes[layer]
    vz = cache.v_zero_points[layer] if cache.fmt.zero_point else cache.v_codes[layer]
    gs = cache.global_scale if cache.global_scale is not None else o_part
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    grid = (-(-max_q // block_m), len(seqs) * hkv, n_splits)
    pdl = bool(cfg.pdl) and not _INTERPRET and target.pdl_capable(dev)
    pdl_kw = {"launch_pdl": True} if pdl else {}
    kc, vc = cache.k_codes[layer], cache.v_codes[layer]
    rl.launch(kern._paged_attn_kernel, grid,
              q, kc.view(torch.int32), vc.view(torch.int32), _raw_scales(cache.k_scales[layer]),
              _raw_scales(cache.v_scales[layer]), kz, vz, gs, cache.page_table, cache.seq_lens[layer],
              meta[0], meta[1], meta[2], o_part, lse,
              q.stride(0), q.stride(1), cache.page_table.stride(0), hkv, hq, n_splits, scale,
              float(softcap or 1.0), int(sliding_window or 0),
              D=d, DW=kc.shape[-1] // 4, NB=cache.k_scales[layer].shape[-1],
              PAGE=cache.page_size, G=group, GP=gp, BLOCK_M=block_m, BLOCK_N=cfg.block_n,
              HAS_WINDOW=sliding_window is not None, HAS_SOFTCAP=softcap is not None, INTERP=_INTERPRET,
              MODE=mode, CPAIR=cpair, RES=res, PDL=pdl, **fc, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
              **pdl_kw, **({} if cfg.maxnreg is None or _INTERPRET else {"maxnreg": cfg.maxnreg}))
    sp = 1 << max(0, (n_splits - 1).bit_length())
    rl.launch(kern._combine_kernel, (total * hq,), o_part, lse, sinks if sinks is not None else lse, out, hq,
              n_splits, out.stride(0), out.stride(1), D=d, SP=sp, HAS_SINKS=sinks is not None, PDL=pdl, num_warps=4,
              **pdl_kw)
    return out


def decode_attention(q: torch.Tensor, cache: PagedKVCache, layer: int, *, seqs: list[int] | None = None,
                     softmax_scale: float | None = None, sliding_window: int | None = None,
                     sinks: torch.Tensor | None = None, softcap: float | None = None,
                     config: AttentionConfig | None = None) -> torch.Tensor:
    """One query token per sequence over the quantized pages (flash decoding).

    Args:
        q: ``[B, Hq, D]``, the newest token of each of ``seqs`` (its K/V already appended).
        cache, layer: the KV cache and the layer read.
        seqs: cache sequences of the batch rows (default ``0..B-1``).
        softmax_scale: default ``1/sqrt(D)``; sliding_window, sinks ``[Hq]``, softcap: as
            :func:`~.reference.attention_reference`.
        config: tiling override (default :func:`choose_config`).

    Returns:
        ``[B, Hq, D]`` in q's dtype.
    """
    return _paged(q, cache, layer, None, seqs, softmax_scale, sliding_window, sinks, softcap, config,
                  "decode_attention")


def extend_attention(q: torch.Tensor, cache: PagedKVCache, layer: int, q_lens: list[int], *,
                     seqs: list[int] | None = None, softmax_scale: float | None = None,
                     sliding_window: int | None = None, sinks: torch.Tensor | None = None,
                     softcap: float | None = None, config: AttentionConfig | None = None) -> torch.Tensor:
    """Causal prefill / extend: ``q_lens[i]`` new query tokens per sequence (ragged), each
    attending to the cached tokens before it and itself.

    Args:
        q: ``[sum(q_lens), Hq, D]``, the queries of ``seqs`` concatenated (their K/V already appended).
        q_lens: query tokens per sequence.
        Others: as :func:`decode_attention`.

    Returns:
        ``[sum(q_lens), Hq, D]`` in q's dtype.
    """
    return _paged(q, cache, layer, q_lens, seqs, softmax_scale, sliding_window, sinks, softcap, config,
                  "extend_attention")
