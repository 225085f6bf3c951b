"""A paged KV cache whose pages hold K and V in a block-scaled format (codes + block scales
along head_dim), shared page table and per-layer sequence lengths.

Byte layout (one layer; ``P`` = page size, ``H`` = KV heads, ``D`` = head_dim, ``b`` = element
bits, ``G`` = the format's block size):

* ``k_codes[layer]`` / ``v_codes[layer]``: uint8 ``[num_pages, P, H, D*b/8]`` — the codes of
  token slot ``s`` of page ``p``, head ``h`` in the format's canonical packing (4-bit codes:
  even element in the low nibble), i.e. exactly ``ms.quantize(k_token).data``.
* ``k_scales[layer]`` / ``v_scales[layer]``: the scale storage dtype, ``[num_pages, P, H, D/G]``.
* ``k_zero_points`` / ``v_zero_points``: uint8 ``[num_pages, P, H, D/G]`` for affine formats.
* K and V of a layer are the two halves of one ``[2, num_pages, P, H, ...]`` allocation each (codes,
  scales, zero points), so that one quantize launch writes both.
* ``global_scale``: float32 scalar (two-level formats): one static per-tensor decode scale per
  cache (a dynamic one would differ per append and could not be shared by a page).
* ``page_table``: int32 ``[max_seqs, max_pages_per_seq]``, entry ``-1`` for unassigned;
  ``seq_lens``: int32 ``[num_layers, max_seqs]``. Both are the cache's output for the kernels:
  read them, do not write them. The cache keeps a host copy of the page table (where appends
  write) and of the lengths; ``reset`` and the engine importers keep the copies in step.

Token ``t`` of sequence ``i`` lives in page ``page_table[i, t // P]``, slot ``t % P``.
"""
from __future__ import annotations

import torch

from .. import reference
from ..formats import Format, packed_len
from ..formats.format import check_int
from ..options import resolve_format
from ..qtensor import QTensor
from ..runtime import target

__all__ = ["PagedKVCache", "kv_format"]

OP = "PagedKVCache"


def kv_format(fmt: str | Format, head_dim: int, per_token: bool = False) -> Format:
    """Resolve a KV format: a preset name or :class:`Format`; ``per_token=True`` makes its
    block the whole head (one scale per token and head, e.g. fp8 e4m3 with an fp32 scale)."""
    f = resolve_format(fmt)
    if per_token:
        f = f.replace(block_size=head_dim, name=f"{f.name}_per_token")
    if f.block_rows != 1:
        raise ValueError(f"{OP}: format {f.name!r} has 2-D blocks ({f.block_rows} rows); KV blocks run along "
                         "head_dim only")
    if head_dim % f.block_size:
        raise ValueError(f"{OP}: head_dim={head_dim} is not a multiple of the {f.name} block size {f.block_size}")
    if f.element.bits not in (4, 8):
        raise NotImplementedError(f"{OP}: format {f.name!r} has {f.element.bits}-bit codes; the KV kernels "
                                  "read 4- and 8-bit codes")
    return f


class PagedKVCache:
    """A paged, block-scaled KV cache for ``num_layers`` layers and up to ``max_seqs`` sequences.

    Args:
        fmt: format of K and V (preset name or :class:`~microscale.formats.Format`).
        num_layers, num_kv_heads, head_dim: model shape.
        num_pages: pages in the pool (shared by all sequences; each layer has its own pool of that size).
        page_size: token slots per page.
        max_seqs: batch capacity; ``max_pages_per_seq``: page-table width (default: all pages).
        device: where the pages live.
        global_scale: two-level formats (NVFP4): the static per-tensor decode scale (default 1.0).
        per_token: one scale per token and head (the block becomes ``head_dim``).
    """

    def __init__(self, fmt: str | Format, *, num_layers: int, num_kv_heads: int, head_dim: int, num_pages: int,
                 page_size: int = 16, max_seqs: int = 1, max_pages_per_seq: int | None = None,
                 device: str | torch.device = "cpu", global_scale: float | None = None,
                 per_token: bool = False) -> None:
        for name, v in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                        ("num_pages", num_pages), ("page_size", page_size), ("max_seqs", max_seqs)):
            check_int(v, name, OP)
        self.fmt = kv_format(fmt, head_dim, per_token)
        f = self.fmt
        if global_scale is not None and not f.global_scale:
            raise ValueError(f"{OP}: global_scale applies only to two-level formats, not {f.name!r}")
        gs = 1.0 if global_scale is None else float(global_scale)
        if not (0 < gs < float("inf")):
            raise ValueError(f"{OP}: global_scale={gs} must be finite and > 0")
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.num_pages, self.page_size, self.max_seqs = num_pages, page_size, max_seqs
        self.max_pages_per_seq = num_pages if max_pages_per_seq is None else check_int(max_pages_per_seq,
                                                                                          "max_pages_per_seq", OP)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # "cuda" means the current device, as torch does
            self.device = torch.device("cuda", torch.cuda.current_device())
        dev = self.device
        db, nb = packed_len(head_dim, f.element.bits), head_dim // f.block_size
        shape = (num_pages, page_size, num_kv_heads)

        def pool(last, dtype):  # K and V of a layer in one allocation: append writes both in one launch
            return [torch.zeros((2, *shape, last), dtype=dtype, device=dev) for _ in range(num_layers)]

        self._codes, self._scales = pool(db, torch.uint8), pool(nb, f.scale.storage)
        self._zps = pool(nb, torch.uint8) if f.zero_point else None
        self.k_codes, self.v_codes = [t[0] for t in self._codes], [t[1] for t in self._codes]
        self.k_scales, self.v_scales = [t[0] for t in self._scales], [t[1] for t in self._scales]
        self.k_zero_points = [t[0] for t in self._zps] if f.zero_point else None
        self.v_zero_points = [t[1] for t in self._zps] if f.zero_point else None
        self.global_scale = torch.full((), gs, dtype=torch.float32, device=dev) if f.global_scale else None
        self.page_table = torch.full((max_seqs, self.max_pages_per_seq), -1, dtype=torch.int32, device=dev)
        self.seq_lens = torch.zeros((num_layers, max_seqs), dtype=torch.int32, device=dev)
        # host mirrors: lengths and page counts are known without reading the GPU back
        self._lens = [[0] * max_seqs for _ in range(num_layers)]
        self._pages: list[list[int]] = [[] for _ in range(max_seqs)]  # page_table's rows, host copy
        self._free = list(range(num_pages - 1, -1, -1))
        self._meta: dict = {}  # the attention kernels' per-batch-layout index tensors, on the device

    # ---- bookkeeping -------------------------------------------------------------------
    def lengths(self, layer: int = 0) -> list[int]:
        """Tokens held per sequence in ``layer`` (host copy; no device sync)."""
        return list(self._lens[layer])

    @property
    def nbytes_per_token(self) -> int:
        """Bytes of K+V codes, scales and zero points per token per layer."""
        f, d, h = self.fmt, self.head_dim, self.num_kv_heads
        per = packed_len(d, f.element.bits) + (d // f.block_size) * (f.scale.storage.itemsize +
                                                                      (1 if f.zero_point else 0))
        return 2 * h * per

    def _reserve(self, seq: int, upto: int) -> None:
        need = -(-upto // self.page_size)
        if need > self.max_pages_per_seq:
            raise ValueError(f"{OP}: sequence {seq} would hold {upto} tokens = {need} pages; max_pages_per_seq="
                             f"{self.max_pages_per_seq}")
        have = len(self._pages[seq])
        if need <= have:
            return
        if need - have > len(self._free):
            raise ValueError(f"{OP}: out of pages: sequence {seq} needs {need - have} more, {len(self._free)} free "
                             f"of num_pages={self.num_pages}")
        new = [self._free.pop() for _ in range(need - have)]
        self.page_table[seq, have:need] = torch.tensor(new, dtype=torch.int32).to(self.device, non_blocking=True)
        self._pages[seq].extend(new)

    def reset(self, seq: int | None = None) -> None:
        """Forget sequence ``seq`` (all sequences when None) and return its pages to the pool."""
        seqs = range(self.max_seqs) if seq is None else [seq]
        for s in seqs:
            self._free.extend(reversed(self._pages[s]))
            self.page_table[s] = -1
            self._pages[s] = []
            for layer in range(self.num_layers):
                self._lens[layer][s] = 0
                self.seq_lens[layer, s] = 0

    # ---- writing -----------------------------------------------------------------------
    def slots(self, layer: int, seqs: list[int], counts: list[int]) -> torch.Tensor:
        """Flat slot indices (``page * page_size + offset``) for ``counts[i]`` new tokens of
        ``seqs[i]`` appended to ``layer``, pages reserved as needed; int64 on the CPU, computed from
        the host copy of the page table (no device read)."""
        return torch.tensor(self._slot_list(layer, seqs, counts), dtype=torch.long)

    def _slot_list(self, layer: int, seqs: list[int], counts: list[int]) -> list[int]:
        out: list[int] = []
        for s, n in zip(seqs, counts):
            start = self._lens[layer][s]
            self._reserve(s, start + n)
            out.extend(self._slots_of(s, start, start + n))
        return out

    def _slots_of(self, seq: int, start: int, stop: int) -> list[int]:
        """Flat slots of tokens ``start .. stop-1`` of ``seq``, from the host page table (where appends write)."""
        p, pages = self.page_size, self._pages[seq]
        return [pages[t // p] * p + t % p for t in range(start, stop)]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, seqs: list[int] | None = None) -> None:
        """Quantize and write new tokens.

        Args:
            layer: layer index.
            k, v: ``[B, T, H, D]`` (T new tokens for each of sequences ``seqs``, default ``0..B-1``)
                or ``[N, H, D]`` with ``seqs`` naming one sequence (N new tokens of it).
            seqs: the sequences written.

        On CUDA (and on the CPU under ``TRITON_INTERPRET=1``), K and V (stacked) go through one
        launch of the Triton quantize kernel that writes each row's codes, scales and zero points
        straight into its page slot; the slots come from the host copy of the page table (one
        host-to-device copy of the row indices, no read back). Otherwise: the reference quantize,
        then a scatter per tensor. Either way the stored bytes are bit-identical to
        ``ms.quantize(k, fmt, global_scale=cache.global_scale)`` (float64 input fitted to float32
        as there).
        """
        check_int(layer + 1, "layer + 1", OP)
        if layer >= self.num_layers:
            raise ValueError(f"{OP}.append: layer={layer} is out of range [0, {self.num_layers})")
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{OP}.append: {name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype not in reference._FLOAT_DTYPES:
                raise TypeError(f"{OP}.append: {name} has dtype {t.dtype}; expected float32, float16, bfloat16 "
                                "or float64")
            if t.shape[-2:] != (self.num_kv_heads, self.head_dim):
                raise ValueError(f"{OP}.append: {name} has shape {tuple(t.shape)}; expected [..., "
                                 f"{self.num_kv_heads}, {self.head_dim}] (heads, head_dim)")
        if k.shape != v.shape:
            raise ValueError(f"{OP}.append: k {tuple(k.shape)} and v {tuple(v.shape)} differ")
        if k.device != self.device:
            raise ValueError(f"{OP}.append: k is on {k.device}, the cache on {self.device}")
        if k.dim() == 4:
            seqs = list(range(k.shape[0])) if seqs is None else list(seqs)
            if len(seqs) != k.shape[0]:
                raise ValueError(f"{OP}.append: {len(seqs)} seqs for a batch of {k.shape[0]}")
            counts = [k.shape[1]] * len(seqs)
        elif k.dim() == 3:
            if seqs is None or len(seqs) != 1:
                raise ValueError(f"{OP}.append: k of shape [N, H, D] needs seqs=[one sequence]")
            counts = [k.shape[0]]
        else:
            raise ValueError(f"{OP}.append: k must be [B, T, H, D] or [N, H, D], got {tuple(k.shape)}")
        for s in seqs:
            if not 0 <= s < self.max_seqs:
                raise ValueError(f"{OP}.append: sequence {s} is out of range [0, {self.max_seqs})")
        if len(set(seqs)) != len(seqs):
            raise ValueError(f"{OP}.append: seqs {seqs} repeat a sequence")
        slots = self._slot_list(layer, seqs, counts)
        if not slots:  # no new token
            return
        h = self.num_kv_heads
        kv = torch.stack([k.reshape(-1, h, self.head_dim), v.reshape(-1, h, self.head_dim)])
        if self._kernel_append():
            from ..quant.quantize import quantize_into_rows

            # a row per (K or V, token): its H heads' blocks lie side by side in the token's page slot, so
            # row i goes to slot row slots[i] (K) or num_pages * page_size + slots[i] (V) of the layer's
            # pools; one host-to-device copy of the indices, one quantize launch writing K and V in place
            per = self.num_pages * self.page_size
            dst = torch.tensor(slots + [x + per for x in slots], dtype=torch.long).to(self.device, non_blocking=True)
            codes, sc = self._codes[layer], self._scales[layer]
            quantize_into_rows(kv.reshape(2 * len(slots), -1), self.fmt, self.global_scale, dst,
                               codes.view(2 * per, -1), sc.view(2 * per, -1),
                               None if self._zps is None else self._zps[layer].view(2 * per, -1))
        else:  # the reference quantize, then a scatter per tensor
            q = self.quantize(kv)
            dslots = torch.tensor(slots, dtype=torch.long).to(self.device)
            for i, (codes, scales, zps) in enumerate(((self.k_codes, self.k_scales, self.k_zero_points),
                                                      (self.v_codes, self.v_scales, self.v_zero_points))):
                codes[layer].view(-1, h, codes[layer].shape[-1]).index_copy_(0, dslots, q.data[i])
                sc = q.scales[i]
                raw = scales[layer] if sc.element_size() > 1 else scales[layer].view(torch.uint8)
                raw.view(-1, h, raw.shape[-1]).index_copy_(0, dslots, sc.view(raw.dtype))  # (fp8 scales as bytes)
                if zps is not None:
                    zps[layer].view(-1, h, zps[layer].shape[-1]).index_copy_(0, dslots, q.zero_points[i])
        for s, n in zip(seqs, counts):
            self._lens[layer][s] += n
        # lengths from the host mirror (a host-to-device copy, never a read back)
        self.seq_lens[layer].copy_(torch.tensor(self._lens[layer], dtype=torch.int32), non_blocking=True)

    def _kernel_append(self) -> bool:
        """Whether append quantizes with the Triton kernel straight into the pages (CUDA, or the
        interpreter), rather than the reference quantize and a scatter."""
        from ..quant import params

        return ((self.device.type == "cuda" or target.interpreting()) and params.unsupported_reason(self.fmt) is None)

    def quantize(self, x: torch.Tensor) -> QTensor:
        """``ms.quantize(x)`` in the cache's format with its global scale (the exact codes append stores)."""
        from ..ops import quantize

        return quantize(x, self.fmt, global_scale=self.global_scale)

    # ---- reading -----------------------------------------------------------------------
    def gather(self, layer: int, seq: int, which: str = "k") -> QTensor:
        """The stored tokens of ``seq`` in ``layer`` as a QTensor ``[L, H, D]`` (``which`` = "k" or "v")."""
        if which not in ("k", "v"):
            raise ValueError(f"{OP}.gather: which={which!r}; expected 'k' or 'v'")
        slot_list = self._slots_of(seq, 0, self._lens[layer][seq])
        n, slots = len(slot_list), torch.tensor(slot_list, dtype=torch.long).to(self.device)
        codes, scales, zps = ((self.k_codes, self.k_scales, self.k_zero_points) if which == "k" else
                              (self.v_codes, self.v_scales, self.v_zero_points))
        h = self.num_kv_heads

        def take(t):
            return t[layer].view(-1, h, t[layer].shape[-1])[slots]

        meta = {"two_level": self.fmt.two_level.value} if self.fmt.global_scale else {}
        return QTensor(take(codes), take(scales), self.fmt, torch.Size((n, h, self.head_dim)), torch.float32,
                       self.global_scale, None if zps is None else take(zps), meta)

    def dequantize(self, layer: int, seq: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``seq`` in ``layer`` decoded, ``[L, H, D]`` each (the reference path's input)."""
        return (reference.dequantize(self.gather(layer, seq, "k"), dtype),
                reference.dequantize(self.gather(layer, seq, "v"), dtype))
