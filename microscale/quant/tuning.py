"""Tuning of the quant family: the kernel paths' switches (one frozen record, overridable in
code with :func:`override`, never read from the environment) and the tiling heuristics.

Why each default: ``docs/decisions/quant-kernels.md``.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Iterator
from dataclasses import dataclass

from ..formats import Format

__all__ = ["QuantTuning", "current", "override", "QuantizeConfig", "choose_config", "choose_dequantize_config"]


@dataclass(frozen=True)
class QuantTuning:
    """Switches of the quantize / dequantize kernels' paths (all on by default; turning one
    off keeps results bit-identical and only changes speed)."""

    #: quantize bf16 inputs of 4-bit float formats two elements per 32-bit operation (the packed
    #: path, MXFP4 / NVFP4); off: the float32 path
    packed: bool = True
    #: the packed path's programs that loop over column tiles load the next tile before encoding
    #: the current one
    prefetch: bool = True
    #: launch the quantize / dequantize kernels as programmatic dependents (Hopper+): each waits for
    #: the previous kernel before any read; dequantize also lets the next kernel launch early
    pdl: bool = True
    #: dequantize streams whole tiles with cache hints (evict-first code loads, ``.cs`` stores)
    deq_cache_hints: bool = True


_CURRENT: contextvars.ContextVar[QuantTuning] = contextvars.ContextVar("microscale_quant_tuning",
                                                                       default=QuantTuning())


def current() -> QuantTuning:
    """The tuning in effect in this context."""
    return _CURRENT.get()


@contextlib.contextmanager
def override(**fields: bool) -> Iterator[QuantTuning]:
    """Within the ``with`` block (this thread / task only), the current tuning with ``fields``
    replaced, e.g. ``with override(packed=False): ...``. Unknown fields raise TypeError."""
    names = {f.name for f in dataclasses.fields(QuantTuning)}
    bad = sorted(set(fields) - names)
    if bad:
        raise TypeError(f"override: unknown QuantTuning field(s) {bad}; expected some of {sorted(names)}")
    token = _CURRENT.set(dataclasses.replace(_CURRENT.get(), **fields))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)


# ----------------------------------------------------------------------------------
# tiling
# ----------------------------------------------------------------------------------


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True)
class QuantizeConfig:
    """Tile of one program: ``tile_rows`` x ``tile_cols`` elements (powers of two;
    ``tile_rows`` a multiple of the format's block rows, ``tile_cols`` of its block size)."""

    tile_rows: int
    tile_cols: int
    num_warps: int = 4
    #: quantize only: column tiles one program loops over (amortizes its fixed work; the fused
    #: RMSNorm quantizer always loops over whole rows)
    k_tiles: int = 1


@functools.lru_cache(maxsize=1024)
def choose_config(fmt: Format, rows: int, k: int, packed: bool = False) -> QuantizeConfig:
    """Quantize tiling: few rows and wide columns move memory best
    (``docs/decisions/quant-kernels.md``).

    * The packed bf16 path (``packed``) for MXFP4 and one-level 8-bit float formats: 4K
      elements per program on 4 warps, up to 2048 columns (2 x 2048).
    * The packed path for the two-level NVFP4: 1 x 1024 on one warp (its per-tile "all
      blocks clean" vote is then one warp reduction), each program looping over up to 4
      such tiles along the row (``k_tiles``) with the next tile prefetched.
    * Everything else (the float32 path): 16 x 256 on 4 warps.
    """
    from ..runtime.launch import cdiv, next_pow2

    b, br = fmt.block_size, fmt.block_rows
    e = fmt.element
    if packed and fmt.global_scale:  # NVFP4: one warp, 1 x 1024, up to 4 tiles per program
        tk = max(b, min(1024, next_pow2(k)))
        nt = cdiv(k, tk)
        kt = next(t for t in (4, 2, 1) if nt % t == 0)  # (whole spans: no masked tiles)
        return QuantizeConfig(max(1, min(next_pow2(max(rows, 1)), 1024 // tk)), tk, 1, kt)
    wide = br == 1 and (packed or (not fmt.global_scale and e.kind == "float" and e.bits == 8))
    tk = max(b, min(2048 if wide else 256, next_pow2(k)))
    tr = max(br, min(next_pow2(max(rows, 1)), 4096 // tk))
    return QuantizeConfig(tr, tk, _warps(tr * tk, 8 if tr * tk > 8192 else 4))


def _warps(elements: int, warps: int) -> int:
    """``warps``, halved while a thread would get fewer than 4 of a (small) tile's elements."""
    while warps > 1 and elements < 128 * warps:
        warps //= 2
    return warps


@functools.lru_cache(maxsize=1024)
def choose_dequantize_config(fmt: Format, rows: int, k: int) -> QuantizeConfig:
    """Dequantize tiling: 8K elements per program on 4 warps, up to 2048 columns (4 x 2048)
    for 1-row blocks; 2-D blocks 16 x 512 (32 x 1024 for 8-bit codes) on 8 warps
    (``docs/decisions/quant-kernels.md``)."""
    from ..runtime.launch import next_pow2

    b, br = fmt.block_size, fmt.block_rows
    if br == 1:
        tk = max(b, min(2048, next_pow2(k)))
        tr = max(1, min(next_pow2(max(rows, 1)), 8192 // tk))
        return QuantizeConfig(tr, tk, _warps(tr * tk, 8 if tr * tk > 8192 else 4))
    wide = fmt.element.bits == 8
    tk = max(b, min(1024 if wide else 512, next_pow2(k)))
    tr = max(br, min(next_pow2(max(rows, 1)), (32768 if wide else 8192) // tk))
    return QuantizeConfig(tr, tk, _warps(tr * tk, 8 if tr * tk >= 8192 else 4))


def check_config(cfg: QuantizeConfig, fmt: Format, dequantize: bool = False) -> None:
    """Raise ValueError unless ``cfg`` tiles ``fmt``'s blocks (and, for dequantize, has one column tile)."""
    if not (_pow2(cfg.tile_rows) and _pow2(cfg.tile_cols)) or cfg.tile_rows % fmt.block_rows or \
            cfg.tile_cols % max(fmt.block_size, 8):
        raise ValueError(f"config {cfg} does not tile {fmt.name} blocks of {fmt.block_rows}x{fmt.block_size}")
    if cfg.k_tiles < 1 or (dequantize and cfg.k_tiles != 1):
        raise ValueError(f"config {cfg}: k_tiles must be >= 1 (and 1 for dequantize)")
