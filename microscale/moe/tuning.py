"""The grouped kernel's config, chosen per row bucket (overridable in code: pass ``config``)."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from ..runtime import target
from ..runtime.launch import cdiv


@dataclass(frozen=True)
class GroupedConfig:
    """``block_n`` weight rows x ``block_m`` rows of one expert per out^T tile (the MMA's N side),
    ``block_kw`` int32 words of codes per row per step, K split ``split_k`` ways; ``pair``: the
    two-per-word bf16x2 decode (only where :func:`pair_eligible`)."""

    block_n: int = 128
    block_m: int = 16
    block_kw: int = 32
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    pair: bool = False


#: programs per SM the decode split aims at (the linear split-K decode's choice)
DECODE_PROGRAMS_PER_SM = 4
#: grouped rows (tokens x top_k) up to which the routing runs as one single-program kernel (a
#: counting sort and the tile map in one launch); above it, torch's sort and a few elementwise ops
ROUTE_KERNEL_MAX_ROWS = 1024
#: the decode chain (routing kernel, gate/up and down on the decode kernel, slot sum) as programmatic dependent
#: launches on a Hopper-or-newer GPU: each launch starts while the one before drains, and the down GEMM issues its
#: first weight step before it waits for gate/up's output (docs/decisions/moe-grouped-kernel.md)
DECODE_PDL = True
#: grouped rows expected per touched expert from which the experts' GEMMs take the Gluon prefill path
#: (:mod:`microscale.moe.prefill`: the linear op's warp-specialized prefill with an expert axis); None keeps the
#: grouped kernel. 128: on an H100 (MXFP4, 128 experts, 4096 tokens top-4: 128 rows an expert) it took 3.07 ms where
#: the grouped kernel took 4.68 and bf16 torch._grouped_mm 4.36 (docs/decisions/moe-grouped-kernel.md); fewer rows
#: an expert are not measured yet, so they keep the grouped kernel
PREFILL_WS_MIN_PER_EXPERT: int | None = 128


def expected_touched(rows: int, experts: int) -> float:
    """Experts that ``rows`` (token, slot) pairs touch, expected under uniform routing (at most
    ``min(rows, experts)``)."""
    if rows >= 64 * experts:
        return float(experts)
    return min(float(rows), experts * (1.0 - (1.0 - 1.0 / experts) ** rows))


def choose_config(rows: int, experts: int, n: int, kw: int, cb: int, device: torch.device,
                  pair: bool = False) -> GroupedConfig:
    """Decode (few rows per expert): 16 rows per tile, K split so about
    :data:`DECODE_PROGRAMS_PER_SM` programs per SM stream the touched experts (N tiles x touched
    experts x splits). Prefill: 64 or 128 rows per tile, each weight tile decoded once per K step
    for all of them. ``pair``: the weight is :func:`pair_eligible` for x's dtype."""
    return _choose(rows, experts, n, kw, cb, pair, target.num_sms(device))


@functools.lru_cache(maxsize=1024)  # a pure function of its arguments, asked twice a call
def _choose(rows: int, experts: int, n: int, kw: int, cb: int, pair: bool, sms: int) -> GroupedConfig:
    bn = 128 if n >= 128 else 64
    bkw = 32 if cb == 4 else 64
    while kw % bkw:
        bkw //= 2
    touched = expected_touched(rows, experts)
    per_expert = rows / max(1.0, touched)
    if per_expert <= 16:
        tiles = cdiv(n, bn) * max(1, math.floor(touched))
        want = DECODE_PROGRAMS_PER_SM * sms
        split = max(1, min(math.ceil(want / tiles), kw // bkw, 16))
        return GroupedConfig(block_n=bn, block_m=16, block_kw=bkw, split_k=split, pair=pair)
    bm = 64 if per_expert <= 96 else 128
    return GroupedConfig(block_n=bn, block_m=bm, block_kw=max(8, bkw // 2), split_k=1, num_warps=8, pair=pair)
