"""Serving engines' fp8 KV pages to and from :class:`~microscale.attention.PagedKVCache`.

vLLM's FlashAttention backend keeps each layer's cache as one tensor ``[2, num_blocks, block_size,
num_kv_heads, head_size]`` (K then V; ``layout="vllm"``), FlashInfer's NHD layout as ``[num_blocks, 2,
block_size, num_kv_heads, head_size]`` (``layout="flashinfer"``); SGLang's token pool keeps per layer a K and a V
buffer ``[slots, num_kv_heads, head_dim]`` and a ``req_to_token`` table of each token's slot (``layout="sglang"``:
pages of one token). With ``kv_cache_dtype="fp8"`` (or
``"fp8_e4m3"``) the bytes are E4M3 codes of ``k / k_scale`` with one float32 ``k_scale`` (and ``v_scale``) per
layer; ``"fp8_e5m2"`` stores E5M2 codes, usually with scale 1. A block table ``[seqs, max_blocks]`` maps a
sequence's token ``t`` to block ``table[s, t // block_size]``, slot ``t % block_size``.

microscale's per-token fp8 formats hold the same bytes in the same ``[page, slot, head, D]`` order, with a
float32 scale per token and head. So :func:`from_engine_fp8` is lossless: codes copied byte for byte, every
scale of a layer set to the engine's scalar, the block table taken as the page table; decoding gives exactly
the engine's ``code * scale``. :func:`to_engine_fp8` is lossless when the cache holds such codes with one scale
per layer (a cache imported this way, say); any other cache (NVFP4, MXFP8, per-token scales) is decoded and
requantized with one scale per layer, which loses precision, so it needs ``allow_lossy=True``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats import get_format
from .cache import PagedKVCache

__all__ = ["EngineKV", "from_engine_fp8", "to_engine_fp8"]

OP = "microscale.attention"
#: page layouts: the axis of the (K, V) pair in each layer's tensor (None: a (K, V) pair of token buffers)
LAYOUTS = {"vllm": 0, "flashinfer": 1, "sglang": None}
#: engine fp8 kinds -> (torch dtype of the codes, microscale format, largest finite value)
_KINDS = {"e4m3": (torch.float8_e4m3fn, "fp8_e4m3_fp32", 448.0), "e5m2": (torch.float8_e5m2, "fp8_e5m2_fp32", 57344.0)}


@dataclass
class EngineKV:
    """A serving engine's fp8 KV cache (see the module docstring): ``kv_caches[l]`` per layer in ``layout``
    (uint8 or the fp8 dtype; SGLang: a ``(k_buffer, v_buffer)`` pair), float32 ``k_scales[l]`` / ``v_scales[l]``,
    the int32 ``block_table`` ``[seqs, max_blocks]`` (SGLang: ``req_to_token``, a slot per token; -1 past a
    sequence's length), ``seq_lens`` int32 ``[seqs]``; ``lossless``: whether decoding these pages gives exactly
    what the microscale cache decodes to (export only)."""

    kv_caches: list
    k_scales: list[float]
    v_scales: list[float]
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    layout: str = "vllm"
    fp8: str = "e4m3"
    lossless: bool = True


def _kind(fp8: str) -> tuple:
    if fp8 not in _KINDS:
        raise ValueError(f"{OP}: fp8={fp8!r}; expected one of {', '.join(_KINDS)}")
    return _KINDS[fp8]


def _pair_axis(layout: str) -> int:
    if layout not in LAYOUTS:
        raise ValueError(f"{OP}: layout={layout!r}; expected one of {', '.join(LAYOUTS)}")
    return LAYOUTS[layout]


def _scale(v, name: str, layer: int) -> float:
    s = float(v.item() if isinstance(v, torch.Tensor) else v)
    if not (0.0 < s < float("inf")):
        raise ValueError(f"{OP}: {name}[{layer}] = {s}; a layer's fp8 scale must be finite and > 0")
    return s


def _pages(kv_caches: list, layout: str, dt: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's K and V pages as uint8 ``[blocks, block_size, heads, dim]`` views (checked alike)."""
    axis = _pair_axis(layout)
    out, first = [], None
    for i, t in enumerate(kv_caches):
        if axis is None:
            ok = (isinstance(t, (tuple, list)) and len(t) == 2 and all(isinstance(b, torch.Tensor) and b.dim() == 3
                                                                        and b.dtype in (torch.uint8, dt) for b in t)
                  and t[0].shape == t[1].shape)
            want = f"a (k_buffer, v_buffer) pair of uint8 or {dt} [slots, heads, dim] tensors (sglang layout)"
            kv = (t[0].view(torch.uint8).unsqueeze(1), t[1].view(torch.uint8).unsqueeze(1)) if ok else None
        else:
            ok = isinstance(t, torch.Tensor) and t.dim() == 5 and t.shape[axis] == 2 and t.dtype in (torch.uint8, dt)
            want = f"uint8 or {dt} with the (K, V) pair on axis {axis} ({layout} layout)"
            u = t.view(torch.uint8) if ok else None
            kv = ((u[0], u[1]) if axis == 0 else (u[:, 0], u[:, 1])) if ok else None
        if not ok:
            got = (f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}"
                   if isinstance(t, torch.Tensor) else type(t).__name__)
            raise ValueError(f"{OP}: kv_caches[{i}] is {got}; expected {want}")
        if first is None:
            first = kv[0]
        elif kv[0].shape != first.shape or kv[0].device != first.device:
            raise ValueError(f"{OP}: kv_caches[{i}] holds pages {tuple(kv[0].shape)} on {kv[0].device}; layer 0 "
                             f"{tuple(first.shape)} on {first.device}")
        out.append(kv)
    return out


def from_engine_fp8(kv_caches: list, k_scales: list, v_scales: list, block_table: torch.Tensor, seq_lens, *,
                    layout: str = "vllm", fp8: str = "e4m3") -> PagedKVCache:
    """A :class:`PagedKVCache` holding an engine's fp8 KV pages, losslessly (module docstring).

    Args:
        kv_caches: per layer, ``[2, blocks, block_size, kv_heads, head_dim]`` (``layout="vllm"``),
            ``[blocks, 2, block_size, kv_heads, head_dim]`` (``"flashinfer"``) or a ``(k_buffer, v_buffer)`` pair of
            ``[slots, kv_heads, head_dim]`` (``"sglang"``); uint8 or the fp8 dtype.
        k_scales, v_scales: each layer's scalar scale (float or 0-d tensor: vLLM's ``layer._k_scale``), kept as
            float32 as the engines keep it.
        block_table: int ``[seqs, max_blocks]`` (SGLang: ``req_to_token`` rows, a slot per token); entries past a
            sequence's ``ceil(len / block_size)`` blocks are ignored (engines pad with anything).
        seq_lens: tokens per sequence (list or tensor), the same in every layer.
        layout, fp8: see above (``"e4m3"`` for vLLM's ``fp8`` / ``fp8_e4m3``, ``"e5m2"`` for ``fp8_e5m2``).

    Returns:
        A cache in ``fp8_e4m3_fp32`` (``fp8_e5m2_fp32``) with one scale per token and head, on the pages'
        device, its pages the engine's blocks (the same ids). A block that several sequences share (prefix
        caching) stays with the first and is copied for each other one into a block no sequence uses
        (microscale's sequences own their pages; ValueError when too few are free). Refused: ids outside the
        pool, shapes that disagree.
    """
    dt, fmt, _ = _kind(fp8)
    if not kv_caches or len(kv_caches) != len(k_scales) or len(kv_caches) != len(v_scales):
        raise ValueError(f"{OP}: {len(kv_caches)} layers of pages, {len(k_scales)} k_scales, {len(v_scales)} "
                         "v_scales; one of each per layer")
    pages = _pages(kv_caches, layout, dt)
    blocks, page, heads, dim = pages[0][0].shape
    dev = pages[0][0].device
    table = torch.as_tensor(block_table).to("cpu", torch.int64)
    lens = [int(v) for v in torch.as_tensor(seq_lens).reshape(-1).tolist()]
    if table.dim() != 2 or table.shape[0] != len(lens):
        raise ValueError(f"{OP}: block_table {tuple(table.shape)} for {len(lens)} sequences; expected [seqs, "
                         "max_blocks]")
    rows: list[list[int]] = []
    for s, n in enumerate(lens):
        need = -(-n // page)
        if n < 0 or need > table.shape[1]:
            raise ValueError(f"{OP}: sequence {s} has {n} tokens; its block_table row holds {table.shape[1]} blocks "
                             f"of {page}")
        rows.append(table[s, :need].tolist())
        bad = [b for b in rows[-1] if not 0 <= b < blocks]
        if bad:
            raise ValueError(f"{OP}: block_table[{s}] names block {bad[0]}, outside [0, {blocks})")
    used = {b for r in rows for b in r}
    free = sorted(set(range(blocks)) - used, reverse=True)  # (popped from the end: lowest first)
    copies: list[tuple[int, int]] = []  # (shared block, its copy)
    owned: set[int] = set()
    for r in rows:
        for j, b in enumerate(r):
            if b in owned:
                if not free:
                    raise ValueError(f"{OP}: block {b} is shared by several sequences (prefix caching) and no block "
                                     f"is free to copy it into ({blocks} blocks, {len(used)} in use)")
                r[j] = free.pop()
                copies.append((b, r[j]))
            owned.add(r[j])
    cache = PagedKVCache(fmt, num_layers=len(kv_caches), num_kv_heads=heads, head_dim=dim, num_pages=blocks,
                         page_size=page, max_seqs=len(lens), max_pages_per_seq=max(table.shape[1], 1), device=dev,
                         per_token=True)
    src_b, dst_b = (torch.tensor([c[i] for c in copies], dtype=torch.long, device=dev) for i in (0, 1))
    for layer, (k, v) in enumerate(pages):
        for codes, src in ((cache.k_codes[layer], k), (cache.v_codes[layer], v)):
            codes.copy_(src.reshape(codes.shape))
            if copies:
                codes[dst_b] = codes[src_b]
        cache.k_scales[layer].fill_(_scale(k_scales[layer], "k_scales", layer))
        cache.v_scales[layer].fill_(_scale(v_scales[layer], "v_scales", layer))
    pt = torch.full(tuple(cache.page_table.shape), -1, dtype=torch.int32)
    for s, (n, r) in enumerate(zip(lens, rows)):
        pt[s, :len(r)] = torch.tensor(r, dtype=torch.int32)
        cache._pages[s] = list(r)
        for layer in range(cache.num_layers):
            cache._lens[layer][s] = n
    cache.page_table.copy_(pt)
    cache.seq_lens.copy_(torch.tensor([lens] * cache.num_layers, dtype=torch.int32))
    cache._free = free
    return cache


def _layer_scale(cache: PagedKVCache, layer: int, which: str) -> float | None:
    """The one scale every stored token of ``layer`` has in ``which`` ("k" / "v"), or None."""
    seen = None
    for s in range(cache.max_seqs):
        if cache._lens[layer][s]:
            sc = cache.gather(layer, s, which).scales.float().unique()
            if sc.numel() != 1 or (seen is not None and float(sc) != seen):
                return None
            seen = float(sc)
    return seen


def to_engine_fp8(cache: PagedKVCache, *, layout: str = "vllm", fp8: str = "e4m3", allow_lossy: bool = False,
                  dtype: torch.dtype = torch.uint8) -> EngineKV:
    """An engine's fp8 KV pages (module docstring) holding ``cache``'s stored tokens, on the same page ids.

    Lossless (``EngineKV.lossless``) when the cache's format has the engine's fp8 codes and one scale per token
    and head, and each layer's K (and V) tokens all carry one scale. Otherwise the tokens are decoded and
    requantized with one scale per layer, ``amax / largest fp8 value``: that loses precision (E4M3 keeps 3
    mantissa bits, against the cache's own per-block scales), so it is refused unless ``allow_lossy=True``.
    Every layer must hold the same sequence lengths (an engine keeps one per sequence). ``dtype``: uint8 (how
    vLLM allocates fp8 caches) or the fp8 dtype.
    """
    dt, fmt, top = _kind(fp8)
    axis = _pair_axis(layout)
    if dtype not in (torch.uint8, dt):
        raise ValueError(f"{OP}: dtype={dtype}; expected torch.uint8 or {dt}")
    for layer in range(1, cache.num_layers):
        if cache._lens[layer] != cache._lens[0]:
            raise ValueError(f"{OP}: layer {layer} holds sequence lengths {cache._lens[layer]}, layer 0 "
                             f"{cache._lens[0]}; an engine keeps one length per sequence")
    same = (cache.fmt.element.name == get_format(fmt).element.name and cache.fmt.block_size == cache.head_dim
            and cache.fmt.scale.name == "fp32" and not cache.fmt.zero_point and cache.global_scale is None)
    shape = (cache.num_pages, 2, cache.page_size, cache.num_kv_heads, cache.head_dim) if axis == 1 else \
        (2, cache.num_pages, cache.page_size, cache.num_kv_heads, cache.head_dim)  # (sglang: two token buffers)
    kv_caches, k_scales, v_scales, lossless = [], [], [], True
    for layer in range(cache.num_layers):
        out = torch.zeros(shape, dtype=torch.uint8, device=cache.device)
        pair = []
        for i, which in enumerate(("k", "v")):
            codes = cache.k_codes[layer] if which == "k" else cache.v_codes[layer]
            dst = out[:, i] if axis == 1 else out[i]
            scale = _layer_scale(cache, layer, which) if same else None
            if scale is not None or not any(cache._lens[layer]):
                dst.copy_(codes.view(dst.shape))
                pair.append(1.0 if scale is None else scale)
                continue
            if not allow_lossy:
                raise ValueError(f"{OP}: layer {layer}'s {which.upper()} is {cache.fmt.name} with its own scales; "
                                 f"fp8 pages with one scale per layer would requantize it (lossy): pass "
                                 "allow_lossy=True to accept that")
            lossless = False
            vals = {s: cache.gather(layer, s, which).dequantize(torch.float32) for s in range(cache.max_seqs)
                    if cache._lens[layer][s]}
            amax = max(float(t.abs().max()) for t in vals.values())
            scale = amax / top if amax > 0 else 1.0
            for s, t in vals.items():
                pos = torch.arange(t.shape[0], device=cache.device)
                pages = cache.page_table[s].long()[pos // cache.page_size]
                dst[pages, pos % cache.page_size] = (t / scale).to(dt).view(torch.uint8)
            pair.append(scale)
        out = out if dtype == torch.uint8 else out.view(dt)
        if axis is None:  # SGLang: a K and a V buffer of token slots
            out = (out[0].reshape(-1, cache.num_kv_heads, cache.head_dim),
                   out[1].reshape(-1, cache.num_kv_heads, cache.head_dim))
        kv_caches.append(out)
        k_scales.append(pair[0])
        v_scales.append(pair[1])
    table = cache.page_table.clone()
    if axis is None:  # req_to_token: each token's slot, page * page_size + offset (-1 past the length)
        width = cache.max_pages_per_seq * cache.page_size
        pos = torch.arange(width, device=cache.device)
        slots = table.long()[:, pos // cache.page_size] * cache.page_size + pos % cache.page_size
        live = pos[None, :] < torch.tensor(cache._lens[0], device=cache.device)[:, None]
        table = torch.where(live, slots, -1).to(torch.int32)
    lens = torch.tensor(cache._lens[0], dtype=torch.int32, device=cache.device)
    return EngineKV(kv_caches, k_scales, v_scales, table, lens, layout, fp8, lossless)

