"""The weight-only linear op: ``out = x @ dequant(W)^T (+ bias)`` for a QTensor ``W`` ``[N, K]`` in
any registered format and bf16 / fp16 activations ``x`` ``[..., K]``.

Use::

    import microscale as ms
    y = ms.linear(x, q, bias)            # q: a QTensor; per-weight facts kept in its state
    pw = ms.linear.prepare(q)            # the packed weight, for torch.compile(fullgraph=True)
    with ms.linear.tuning.override(gemv_max_m=2):   # thresholds and knobs, in code
        y = ms.linear(x, q)

Layout: :mod:`.op` (the op and its ``torch.library`` registration), :mod:`.routing` (the ordered
backend table), :mod:`.tuning` (every measured threshold), :mod:`.weight_state` (per-weight facts),
:mod:`.plans` (eager call plans), :mod:`.packed` (the split-K kernel's layout), ``backends/`` (one
module per kernel) and ``_kernels/`` (the device code, which needs Triton: loaded on first use).
"""
from __future__ import annotations

from . import tuning
from .backends.decode_tma import choose_decode_tma_programs, decode_tma
from .backends.gemv import GemvConfig, choose_gemv_config, gemv, gemv_supported
from .backends.gemv_mma import GemvMmaConfig, choose_gemv_mma_config, gemv_mma, gemv_mma_supported, \
    with_gemv_mma_split
from .backends.prefill import PrefillConfig, choose_prefill_config, prefill, prefill_supported
from .backends.prefill_ws import choose_prefill_ws_tile, prefill_ws
from .backends.splitk import LinearConfig, choose_config
from .op import linear
from .packed import PackedLinearWeight, prepare
from .routing import explain
from .tuning import Tuning, set_tuning

__all__ = ["linear", "prepare", "PackedLinearWeight", "tuning", "Tuning", "set_tuning", "explain",
           "LinearConfig", "choose_config", "GemvConfig", "choose_gemv_config", "gemv", "gemv_supported",
           "GemvMmaConfig", "choose_gemv_mma_config", "with_gemv_mma_split", "gemv_mma", "gemv_mma_supported",
           "PrefillConfig", "choose_prefill_config", "prefill", "prefill_supported", "prefill_ws",
           "choose_prefill_ws_tile", "decode_tma", "choose_decode_tma_programs"]


# ``ms.linear`` is the op itself (a plain function: torch.compile traces it); the package's public
# helpers ride on it, so ``ms.linear.tuning.override(...)`` and ``ms.linear.prepare(q)`` read as here
for _name in ("tuning", "prepare", "explain", "set_tuning", "PackedLinearWeight"):
    setattr(linear, _name, globals()[_name])
del _name
