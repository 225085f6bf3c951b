"""The grouped kernel's config, chosen per row bucket (overridable in code: pass ``config``)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..runtime import target
from ..runtime.launch import cdiv


@dataclass(frozen=True)
class GroupedConfig:
    """``block_n`` weight rows x ``block_m`` rows of one expert per out^T tile (the MMA's N side),
    ``block_kw`` int32 words of codes per row per step, K split ``split_k`` ways."""

    block_n: int = 128
    block_m: int = 16
    block_kw: int = 32
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


def choose_config(rows: int, experts: int, n: int, kw: int, cb: int, device: torch.device) -> GroupedConfig:
    """Decode (few rows per expert): 16 rows per tile, K split so about four programs per SM
    stream the touched experts (at most ``rows`` of them). Prefill: 64 or 128 rows per tile,
    each weight tile decoded once per K step for all of them."""
    bn = 128 if n >= 128 else 64
    bkw = 32 if cb == 4 else 64
    while kw % bkw:
        bkw //= 2
    per_expert = rows / max(1, min(experts, rows))
    if per_expert <= 16:
        touched = min(experts, rows)
        tiles = cdiv(n, bn) * touched
        want = 4 * target.num_sms(device) if device.type == "cuda" else 4
        split = max(1, min(math.ceil(want / tiles), kw // bkw, 16))
        return GroupedConfig(block_n=bn, block_m=16, block_kw=bkw, split_k=split)
    bm = 64 if per_expert <= 96 else 128
    return GroupedConfig(block_n=bn, block_m=bm, block_kw=max(8, bkw // 2), split_k=1, num_warps=8)
