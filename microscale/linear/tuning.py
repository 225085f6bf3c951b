"""Every measured threshold and knob of the linear op's routes, in one frozen record.

Routing reads :func:`get` per call; nothing here is read from the environment. Change it
in code: ``with microscale.linear.tuning.override(gemv_max_m=2): ...`` for a block (tests,
A/B runs), :func:`set_tuning` for the process. Each default is a measured choice; its
evidence is on the linked decision page.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Iterator

__all__ = ["Tuning", "get", "serial", "override", "set_tuning", "reset", "DECODE_TMA_MODES"]

#: :attr:`Tuning.decode_tma`: ``auto`` (captured graphs and the eager calls where it wins), ``graph``
#: (only while a CUDA graph is captured), ``always``, ``never``
DECODE_TMA_MODES = ("auto", "graph", "always", "never")


@dataclass(frozen=True)
class Tuning:
    """The linear op's thresholds (token counts ``m``, weight sizes ``n * k``) and kernel knobs."""

    # f16x2 GEMV (docs/decisions/linear-gemv.md)
    gemv_max_m: int = 4  # most tokens routed to the GEMV; the prefill kernel starts at gemv_max_m + 1
    gemv_fallback_m: int = 8  # the GEMV still serves shapes the tensor-core kernels cannot tile, up to here
    gemv_programs_per_sm: int = 32  # one-token programs per SM below which a program takes 2 rows, not 4
    gemv_early_w: bool = True  # first weight loads issued before the programmatic-launch wait
    gemv_pdl_chain: bool = True  # the activation prep waits on the previous kernel: calls overlap
    # tensor-core decode of E2M1 weights (docs/decisions/linear-gemv.md)
    gemv_mma_min_m: int = 3
    gemv_mma_short_k_words: int = 32  # below gemv_mma_min_m too where the GEMV's K step is shorter (K=2880)
    gemv_mma_max_m: int = 16
    gemv_mma_scale_imad: bool = True  # UE4M3 scales by one multiply-add where the weight allows (same bits)
    # eager call plans (docs/decisions/linear-call-plans.md)
    plans: bool = True
    plans_per_weight: int = 64
    # repeat calls replay the route's recorded launches (docs/decisions/linear-host-time.md)
    route_cache: bool = True
    # warp-specialized prefill (docs/decisions/linear-prefill-ws.md)
    prefill_ws: bool = True
    prefill_ws_min_m: int = 65
    prefill_ws_min_m_8bit: int = 33  # 8-bit codes (decode_tma stops at decode_tma_max_m_8bit)
    prefill_ws_small_min_m: int = 33  # captured calls on small E2M1 weights: ahead of decode_tma ...
    prefill_ws_small_max_nk: int = 1 << 26  # ... up to this many weight elements
    prefill_ws_small_max_nk_bf16: int = 3 << 24  # ... where decode_tma would take its 256-row tile
    prefill_ws_split_tail: bool = True  # tiles past the last full wave split in K
    ws_tile_rate: tuple = ((256, 1.0), (128, 0.61), (64, 0.35))  # relative MMA rate per token tile
    ws_stages: tuple = ((256, 4), (128, 6), (64, 8))  # activation ring slots per token tile
    gluon_scale_imad: bool = True  # Gluon bf16 decodes make UE4M3 / E8M0 scales by one multiply-add
    # scaled_mm(fast_accum=True): the warp-specialized Gluon fp8 kernel from this many rows (0: never), on weights
    # with one scale per 128 x 128 block; H100, this config: 1.29x cuBLAS bf16 at 1024 rows, 1.26-1.29x at 4096,
    # the Triton kernel 1.12-1.13x; per-row weight scales stay on Triton (0.63x vs 0.59x):
    # docs/decisions/scaled-mm-operands.md
    fp8_gluon_min_m: int = 1024
    # TMA-fed tensor-core decode (docs/decisions/linear-decode-tma.md)
    decode_tma: str = "auto"  # one of DECODE_TMA_MODES
    decode_tma_min_m: int = 2  # on weights of at least decode_tma_eager_min_nk elements
    decode_tma_small_min_m: int = 4  # on smaller weights
    decode_tma_eager_min_nk: int = 1 << 27
    decode_tma_eager_min_m: int = 2
    decode_tma_max_m: int = 64
    decode_tma_max_m_8bit: int = 32
    decode_tma_8bit: bool = True
    decode_tma_min_m_8bit: int = 4
    decode_tma_small_min_m_int8: int = 5
    decode_tma_min_m_int4: int = 3  # affine 4-bit integers
    decode_tma_min_m_int4_sym: int = 4  # two's-complement 4-bit integers
    dt_rows: int = 128  # weight rows per program (8 consumer warps)
    dt_chunk: int = 4  # K steps per ring chunk
    dt_stages: int = 3  # ring chunks
    dt_per_sm: int = 2  # resident programs per SM
    dt_tile_big: tuple = (256, 2, 1, 160)  # E2M1 + bf16: (rows, row slices per warp, programs per SM, registers)
    dt_big_chunk: int = 8  # the 256-row tile's ring: chunks of 8 K steps ...
    dt_big_stages: int = 2  # ... in 2 stages ...
    dt_big_chunk_max_tok: int = 16  # ... up to this many token columns
    dt_stages_64: int = 2  # ring chunks at 64 token columns
    dt_stages_8bit: int = 2  # ring chunks for 8-bit codes
    dt_post_scale: bool = True  # integers with fp16 scales: scale the MMA results, not each weight pair
    dt_post_max_tok: int = 16
    dt_wide: int = 4  # K steps per TMA box of code words
    dt_sbox: int = 4  # K steps per TMA box of step-major scales (divides dt_chunk)
    dt_warp_arrive: bool = True  # consumer warps free ring slots each on its own (a PTX rewrite)
    dt_one_table: bool = True  # E2M1 weights keep one step-major scale table for both tile heights

    @property
    def prefill_min_m(self) -> int:
        """Fewest tokens the Triton prefill kernel takes (below: the GEMV)."""
        return self.gemv_max_m + 1

    def __post_init__(self):
        if self.decode_tma not in DECODE_TMA_MODES:
            raise ValueError(f"Tuning: decode_tma={self.decode_tma!r}; expected one of {DECODE_TMA_MODES}")


_current = Tuning()
_serial = 0  # bumped whenever the record in force changes (call plans key on it)


def get() -> Tuning:
    """The tuning record in force."""
    return _current


def serial() -> int:
    """A number that changes whenever the record in force changes."""
    return _serial


def _install(t: Tuning) -> Tuning:
    global _current, _serial
    _current = t
    _serial += 1
    return t


def set_tuning(**changes) -> Tuning:
    """Replace fields of the tuning record for the process (:func:`reset` restores the defaults).
    Returns the new record; unknown fields raise TypeError."""
    return _install(dataclasses.replace(_current, **changes))


def reset() -> Tuning:
    """Back to the measured defaults."""
    return _install(Tuning())


@contextlib.contextmanager
def override(**changes) -> Iterator[Tuning]:
    """Fields of the tuning record replaced while the block runs (the previous record comes back on exit)."""
    saved = _current
    t = _install(dataclasses.replace(saved, **changes))
    try:
        yield t
    finally:
        _install(saved)
