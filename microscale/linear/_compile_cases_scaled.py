"""Every launch of the scaled_mm kernel that microscale ships, on CPU tensors: for a compile
check that intercepts Triton launches and compiles each specialization for sm_90."""
from __future__ import annotations

import dataclasses

import torch

from ..reference import quantize
from ..runtime import target
from .backends.scaled_exact import choose_scaled_config, fp8_kind, scaled_exact_run
from .backends.scaled_fp8 import Fp8Config, scaled_fp8_launch, scaled_fp8_reason, scaled_fp8_ws_reason
from .scaled import prepare_operand

# (activation format, weight format): each element family and scale kind, fp8/FP4/FP6/int/affine
PAIRS = (("fp8_e4m3_block128", "fp8_e4m3_block128x128"), ("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp8_e4m3", "mxfp4"),
         ("mxfp8_e4m3", "mxfp6_e2m3"), ("mxfp8_e5m2", "mxfp6_e3m2"), ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4"),
         ("mxint8", "mxint8"), ("int8_fp32", "int4_fp16"), ("int8_affine_g32", "int4_affine_g64"),
         ("fp8_e4m3_block128", "mxfp4"), ("nvfp8", "nvfp4"), ("mxfp8_e4m3", "nvfp4"),
         ("mxint5", "int3_fp16"))  # (3- and 5-bit codes span two bytes)
TOKENS = (1, 32, 256)  # one per tile config of choose_scaled_config


def _gluon_launches(a, b, bias, dt, mode: str) -> None:
    """The warp-specialized Gluon kernel on operands standing in for CUDA ones (on a Hopper), where it takes
    the pair: both tile widths (smoke: 128)."""
    from ._compile_cases import _dev

    oa, ob = (dataclasses.replace(o, codes=_dev(o.codes)) for o in (prepare_operand(a), prepare_operand(b)))
    with target.override(capability=(9, 0), num_sms=132):
        for bn in (128,) if mode == "smoke" else (64, 128):
            cfg = Fp8Config(128, bn, 4, 4, gluon=True)
            if scaled_fp8_ws_reason(oa, ob, cfg) is None:
                scaled_fp8_launch(oa, ob, bias, dt, cfg)


def launches(mode: str = "full") -> None:
    """Call the kernel's entry point over every format pair, tile config, bias and output dtype
    (``mode`` "smoke": MXFP4 weights x MXFP8 activations, on fp8 tensor cores)."""
    gen = torch.Generator().manual_seed(0)
    n, k = 256, 256
    with target.override(interpreting=True):
        smoke = [("mxfp8_e4m3", "mxfp4"), ("fp8_e4m3_block128", "fp8_e4m3_block128x128")]  # (fp8 MMA pairs)
        for fa, fb in smoke if mode == "smoke" else PAIRS:
            b = quantize(torch.randn(n, k, generator=gen), fb)
            for m in TOKENS:
                a = quantize(torch.randn(m, k, generator=gen), fa)
                for bias, dt in ((None, torch.bfloat16), (torch.randn(n, generator=gen), torch.float32),
                                 (None, torch.float16)):
                    cfg = choose_scaled_config(m, n, a.fmt, b.fmt)
                    scaled_exact_run(a, b, bias, dt, cfg)
                    if fp8_kind(a.fmt, b.fmt):  # the opt-in fp8 path
                        scaled_exact_run(a, b, bias, dt, dataclasses.replace(cfg, fp8=fp8_kind(a.fmt, b.fmt)))
                    if scaled_fp8_reason(a.fmt, b.fmt) is None:  # fast_accum: fp8 codes straight to the MMA
                        scaled_fp8_launch(prepare_operand(a), prepare_operand(b), bias, dt)
                        if m == TOKENS[-1] and mode != "smoke":  # (the compiler's warp specialization, opt-in)
                            scaled_fp8_launch(prepare_operand(a), prepare_operand(b), bias, dt,
                                              Fp8Config(128, 128, 8, 3, warp_specialize=True))
                        if m == TOKENS[-1]:
                            _gluon_launches(a, b, bias, dt, mode)
