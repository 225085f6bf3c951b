"""The linear backends' launches for ``tools/compile_check.py`` (private; run with launches
intercepted, never on a device): each backend that serves a call on a Hopper, over the formats,
activation dtypes and token counts the routes take, on CPU tensors standing in for CUDA ones."""
from __future__ import annotations

import dataclasses

import torch

from .. import reference
from ..formats import registry
from ..runtime import target
from .backends import decode_tma as dt
from .backends import gemv as gv
from .backends import gemv_mma as gmma
from .backends import prefill as pf
from .backends import prefill_ws as pws
from .backends.splitk import choose_config, splitk_run
from .packed import prepare

#: formats whose routes differ (E2M1 with both scale kinds, 8-bit floats, affine and plain integers)
MAIN = ("nvfp4", "mxfp4", "mxfp8_e4m3", "mxfp8_e5m2", "int4_affine_g128", "int4_affine_g32", "int8_fp16",
        "int4_fp16", "mxint8", "mxint4", "int8_affine_g128", "mxfp6_e2m3")
#: smoke: one launch of each backend (NVFP4, bf16: every backend serves it)
SMOKE_M = (1, 8, 256)


class _OnDevice(torch.Tensor):
    """A CPU tensor that answers ``is_cuda`` as a device tensor would (the backends' checks)."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def _dev(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.as_subclass(_OnDevice)


def _try(f, *a, **kw) -> None:
    try:
        f(*a, **kw)
    except (ValueError, NotImplementedError, TypeError):  # a combination the backend refuses
        pass


def launches(mode: str = "full") -> None:
    """Every backend's launches for the calls it serves (``mode`` "smoke": a few formats and token counts)."""
    capturing = torch.cuda.is_current_stream_capturing
    torch.cuda.is_current_stream_capturing = lambda: False  # no CUDA runtime here: nothing is captured
    try:
        _launches(mode)
    finally:
        torch.cuda.is_current_stream_capturing = capturing


def _launches(mode: str) -> None:
    smoke = mode == "smoke"
    names = ("nvfp4",) if smoke else tuple(n for n in MAIN if n in registry)
    ms_ = SMOKE_M if smoke else (1, 2, 3, 8, 16, 32, 64, 128, 1024)
    with target.override(capability=(9, 0), num_sms=132, pdl=True):
        for name in names:
            q0 = reference.quantize(torch.randn(256, 1024), name)
            q = dataclasses.replace(q0, data=_dev(q0.data), scales=_dev(q0.scales),
                                    global_scale=_dev(q0.global_scale), zero_points=_dev(q0.zero_points))
            pw = prepare(q0)
            q1 = reference.quantize(torch.randn(256, 1440), name) if 1440 % registry[name].block_size == 0 else None
            q_odd_k = q1 and dataclasses.replace(q1, data=_dev(q1.data), scales=_dev(q1.scales),
                                                 global_scale=_dev(q1.global_scale), zero_points=_dev(q1.zero_points))
            for dtype in (torch.bfloat16,) if smoke else (torch.bfloat16, torch.float16):
                for m in ms_:
                    x = _dev(torch.zeros(m, 1024, dtype=dtype))
                    for bias in (None,) if smoke else (None, torch.zeros(256, dtype=dtype)):
                        _try(splitk_run, x, pw, bias, choose_config(m, pw, dtype, x.device))
                    if gv.gemv_supported(q, x):
                        _try(gv.gemv, x, q, None, use_asm=True)
                    if gmma.gemv_mma_supported(q, x):
                        _try(gmma.gemv_mma, x, q, None)
                        if q_odd_k is not None and m <= 16:  # K not a multiple of the step (gpt-oss's 2880: lanes past the row)
                            _try(gmma.gemv_mma, _dev(torch.zeros(m, 1440, dtype=dtype)), q_odd_k, None)
                    if dt.decode_tma_reason(q, x) is None:
                        dt.decode_tma_run(x, q, None)
                    if pws.prefill_ws_reason(q, x) is None:
                        pws.prefill_ws_run(x, q, None)
                    if pf.prefill_supported(q, x):
                        pf.prefill(x, q, None)
