"""Bit packing of element codes and scale layouts.

Packing (canonical, checkpoint order): codes are packed LSB-first along the last
dimension. For 4-bit codes the low nibble holds the even element (torch
``float4_e2m1fn_x2``, ModelOpt, compressed-tensors, gpt-oss); 8-bit codes are one per
byte; other widths form a little-endian bit stream per row (element ``i`` occupies
stream bits ``[i*b, (i+1)*b)``; byte ``j`` holds stream bits ``8j .. 8j+7``).

Scale layouts are frozen dataclasses with ``swizzle`` / ``unswizzle``:
row-major (identity), and the tiled layouts consumed by cuBLAS/CUTLASS block-scaled
GEMMs: 128x4 (``offset(r,c) = ((r//128)*ceil(C/4) + c//4)*512 + (r%32)*16 +
((r%128)//32)*4 + c%4``) and 8x4 (``(r//8)*ceil(C/4)*32 + (c//4)*32 + (r%8)*4 + c%4``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["pack_codes", "unpack_codes", "packed_len", "ScaleLayout", "SCALE_LAYOUTS", "get_scale_layout"]


def packed_len(k: int, bits: int) -> int:
    """Bytes per row of ``k`` codes of ``bits`` bits; raises if they don't fill whole bytes."""
    if (k * bits) % 8:
        raise ValueError(f"a row of {k} {bits}-bit codes is not a whole number of bytes")
    return k * bits // 8


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack uint8 codes (low ``bits`` used) along the last dim into uint8 bytes."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"pack_codes: codes must be uint8, got {codes.dtype}")
    k = codes.shape[-1]
    nbytes = packed_len(k, bits)
    if bits == 8:
        return codes.contiguous()
    mask = (1 << bits) - 1
    if bits == 4:
        c = codes.reshape(*codes.shape[:-1], k // 2, 2)
        return (c[..., 0] & mask) | (c[..., 1] << 4)
    # General width: 8 codes -> `bits` bytes through one int64 word per group.
    g = (codes.reshape(*codes.shape[:-1], k // 8, 8).to(torch.int64) & mask)
    shifts = torch.arange(8, device=codes.device, dtype=torch.int64) * bits
    word = (g << shifts).sum(-1, keepdim=True)  # disjoint bits: sum == or
    bshift = torch.arange(bits, device=codes.device, dtype=torch.int64) * 8
    out = ((word >> bshift) & 0xFF).to(torch.uint8)
    return out.reshape(*codes.shape[:-1], nbytes)


def unpack_codes(packed: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: ``k`` uint8 codes per row."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack_codes: packed must be uint8, got {packed.dtype}")
    nbytes = packed_len(k, bits)
    if packed.shape[-1] != nbytes:
        raise ValueError(f"unpack_codes: expected {nbytes} bytes per row for k={k}, got {packed.shape[-1]}")
    if bits == 8:
        return packed
    mask = (1 << bits) - 1
    if bits == 4:
        return torch.stack((packed & mask, packed >> 4), dim=-1).reshape(*packed.shape[:-1], k)
    g = packed.reshape(*packed.shape[:-1], k // 8, bits).to(torch.int64)
    bshift = torch.arange(bits, device=packed.device, dtype=torch.int64) * 8
    word = (g << bshift).sum(-1, keepdim=True)
    shifts = torch.arange(8, device=packed.device, dtype=torch.int64) * bits
    return ((word >> shifts) & mask).to(torch.uint8).reshape(*packed.shape[:-1], k)


@dataclass(frozen=True)
class ScaleLayout:
    """A 2-D scale matrix ``[R, C]`` laid out in tiles of ``tile_rows x tile_cols``.

    ``tile_rows == 0`` is plain row-major. Tiled layouts pad R to ``tile_rows`` and C
    to 4 with zeros; within a tile of 128 rows, rows ``r`` and ``r+32k`` are
    interleaved in 32-row sub-tiles (``sub_rows``) as cuBLAS expects.
    """

    name: str
    tile_rows: int  # 0 = row-major
    sub_rows: int = 0  # rows per interleaved sub-tile (32 for 128x4), 0 = none
    tile_cols: int = 4

    def padded_shape(self, rows: int, cols: int) -> tuple[int, int]:
        if not self.tile_rows:
            return rows, cols
        ceil = lambda a, b: -(-a // b)  # noqa: E731
        return ceil(rows, self.tile_rows) * self.tile_rows, ceil(cols, self.tile_cols) * self.tile_cols

    def swizzle(self, scales: torch.Tensor) -> torch.Tensor:
        """Row-major ``[R, C]`` -> this layout, returned as a flat 1-D tensor."""
        if scales.dim() != 2:
            raise ValueError(f"{self.name}.swizzle: expected a 2-D scale matrix, got shape {tuple(scales.shape)}")
        if not self.tile_rows:
            return scales.contiguous().reshape(-1)
        r, c = scales.shape
        rp, cp = self.padded_shape(r, c)
        padded = scales.new_zeros((rp, cp))
        padded[:r, :c] = scales
        t = self._tiled_view(padded)
        return t.permute(*self._perm()).contiguous().reshape(-1)

    def unswizzle(self, flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        """This layout (flat) -> row-major ``[rows, cols]`` (padding dropped)."""
        if not self.tile_rows:
            return flat.reshape(rows, cols)
        rp, cp = self.padded_shape(rows, cols)
        if flat.numel() != rp * cp:
            raise ValueError(f"{self.name}.unswizzle: expected {rp * cp} scales for [{rows}, {cols}], got {flat.numel()}")
        shape = self._tiled_view(flat.new_empty((rp, cp))).shape
        perm = self._perm()
        permuted_shape = [shape[p] for p in perm]
        inv = [perm.index(i) for i in range(len(perm))]
        t = flat.reshape(permuted_shape).permute(*inv)
        return t.reshape(rp, cp)[:rows, :cols].contiguous()

    def offset(self, r: int, c: int, cols: int) -> int:
        """Flat position of scale ``(r, c)`` (the layout's defining formula)."""
        if not self.tile_rows:
            return r * cols + c
        ct = -(-cols // self.tile_cols)
        if self.sub_rows:
            return ((r // 128) * ct + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
        return (r // 8) * ct * 32 + (c // 4) * 32 + (r % 8) * 4 + c % 4

    def _tiled_view(self, m: torch.Tensor) -> torch.Tensor:
        rp, cp = m.shape
        if self.sub_rows:  # [R/128, 4, 32, C/4, 4]: row = r0*128 + b*32 + a
            return m.reshape(rp // self.tile_rows, self.tile_rows // self.sub_rows, self.sub_rows, cp // 4, 4)
        return m.reshape(rp // self.tile_rows, self.tile_rows, cp // 4, 4)

    def _perm(self) -> list[int]:
        # 128x4: [r0, b, a, c0, c1] -> [r0, c0, a, b, c1]; 8x4: [r0, r1, c0, c1] -> [r0, c0, r1, c1]
        return [0, 3, 2, 1, 4] if self.sub_rows else [0, 2, 1, 3]


SCALE_LAYOUTS: dict[str, ScaleLayout] = {
    "row_major": ScaleLayout("row_major", 0),
    "swizzled_128x4": ScaleLayout("swizzled_128x4", 128, 32),
    "swizzled_8x4": ScaleLayout("swizzled_8x4", 8),
}


def get_scale_layout(name: str | ScaleLayout) -> ScaleLayout:
    """Look up a scale layout: ``row_major``, ``swizzled_128x4`` or ``swizzled_8x4``."""
    if isinstance(name, ScaleLayout):
        return name
    if name not in SCALE_LAYOUTS:
        raise KeyError(f"unknown scale layout {name!r}; known: {', '.join(SCALE_LAYOUTS)}")
    return SCALE_LAYOUTS[name]
