"""Every grouped-kernel launch the MoE ops ship, on CPU tensors (for an sm_90 compile check:
a caller intercepts the launches; run plainly under the interpreter they compute real results)."""
from __future__ import annotations

from dataclasses import replace

import torch

from ..formats import registry
from ..ops import quantize
from ..runtime import target
from .decode import DecodeConfig, decode_run
from .grouped import grouped_run, pair_eligible, route, slot_sum
from .op import _experts_forward
from .packed import prepare_experts
from .prefill import PrefillConfig, prefill_run
from .tuning import GroupedConfig


def launches(mode: str = "full") -> None:
    """Each registry format through the decode (split-K) and prefill configs, bias and the
    routing gather, bf16 and fp16 activations; the decode path's tensor-core kernel (E2M1 experts:
    K a multiple of its step or not, K split, gather, both epilogues); and the composed experts
    forward; the Gluon prefill path (E2M1 experts on a Hopper stood in: each tile height, plain, gathered with
    both activations, scattered) (``mode`` "smoke": MXFP4)."""
    e, n, k = 3, 128, 256
    offsets = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    configs = (GroupedConfig(block_n=128, block_m=16, block_kw=32, split_k=4),
               GroupedConfig(block_n=128, block_m=128, block_kw=16, split_k=1, num_warps=8),
               GroupedConfig(block_n=64, block_m=64, block_kw=16, split_k=1, num_warps=8))
    with target.override(interpreting=True):
        for name, fmt in [("mxfp4", registry["mxfp4"])] if mode == "smoke" else registry.items():
            pe = prepare_experts(quantize(torch.randn(e, n, k), fmt))
            for dtype in (torch.bfloat16, torch.float16):
                x = torch.randn(5, k).to(dtype)
                for c in configs:
                    grouped_run(x, pe, offsets, None, config=c)
                grouped_run(x, pe, offsets, torch.randn(e, n), rows=torch.tensor([0, 1, 1, 4, 3], dtype=torch.int32))
            if pair_eligible(pe, torch.bfloat16):  # the bf16x2 decode at decode and prefill tiles
                x = torch.randn(5, k).to(torch.bfloat16)
                for c in configs[:2]:
                    grouped_run(x, pe, offsets, None, config=replace(c, pair=True))
        gu = prepare_experts(quantize(torch.randn(8, 128, 256), "mxfp4"))
        dn = prepare_experts(quantize(torch.randn(8, 256, 64), "mxfp4"))
        x = torch.randn(4, 256).to(torch.bfloat16)
        idx = torch.randint(0, 8, (4, 2))
        for act, lay in (("swiglu_clamped", "interleaved"), ("swiglu", "concat")):
            a, lim = (1.702, 7.0) if act == "swiglu_clamped" else (None, None)
            _experts_forward(x, gu, dn, idx, torch.rand(4, 2), torch.randn(8, 128), torch.randn(8, 256), act, a, lim,
                             lay)
        rows = torch.tensor([0, 1, 1, 4, 3], dtype=torch.int32)
        for name in ("mxfp4",) if mode == "smoke" else ("mxfp4", "nvfp4"):
            for kk in (1024, 2880):  # whole steps; K a multiple of a lane's words only
                pe = prepare_experts(quantize(torch.randn(e, n, kk), name))
                x = torch.randn(5, kk).to(torch.bfloat16)
                for c in (DecodeConfig(), DecodeConfig(split_k=4)):
                    decode_run(x, pe, offsets, None, config=c)
                    decode_run(x, pe, offsets, torch.randn(e, n), rows=rows, gather_div=2, config=c)
                    for act in (("swiglu_clamped", 1.702, 7.0, "interleaved"), ("swiglu", None, None, "concat")):
                        decode_run(x, pe, offsets, None, rows=rows, gather_div=2, config=c, act=act)
                    decode_run(x, pe, offsets, torch.randn(e, n), rows=rows, config=c, scatter=torch.rand(5))
                    # the decode chain's programmatic dependents (gate/up after the routing, down after gate/up)
                    decode_run(x, pe, offsets, None, rows=rows, gather_div=2, config=c,
                               act=("swiglu", None, None, "concat"), pdl_wait=1, pdl_trigger=True)
                    decode_run(x, pe, offsets, None, rows=rows, config=c, scatter=torch.rand(5), pdl_wait=2,
                               pdl_trigger=True)
        route(torch.randint(0, 8, (4, 2)), 8, 8, trigger=True)
        slot_sum(torch.randn(8, 64), 2, torch.bfloat16, wait=True)

    _prefill_launches(mode, offsets, rows)


def _prefill_launches(mode: str, offsets: torch.Tensor, rows: torch.Tensor) -> None:
    from ..linear._compile_cases import _dev

    e, n, k = 3, 256, 1024
    with target.override(interpreting=True, capability=(9, 0), num_sms=132):
        for name in ("mxfp4",) if mode == "smoke" else ("mxfp4", "nvfp4"):
            pe = prepare_experts(quantize(torch.randn(e, n, k), name))
            x = _dev(torch.randn(5, k).to(torch.bfloat16))
            for bt, st in ((128, 4),) if mode == "smoke" else ((64, 6), (128, 4)):
                c = PrefillConfig(block_t=bt, stages=st)
                prefill_run(x, pe, offsets, None, config=c)
                for act in (("swiglu_clamped", 1.702, 7.0, "interleaved"), ("swiglu", None, None, "concat")):
                    prefill_run(x, pe, offsets, torch.randn(e, n), rows=rows, gather_div=2, config=c, act=act)
                prefill_run(x, pe, offsets, torch.randn(e, n), rows=rows, config=c, scatter=torch.rand(5))
