"""The suite registry and case selection.

A suite names, per op, the formats and shapes to time (:class:`Suite`, :data:`SUITES`);
:func:`select_cases` turns a suite and the user's ``--ops/--formats/--shapes`` filters
into :class:`CaseSpec` rows without importing anything. The builders that turn a row into
a runnable case live in :mod:`.cases`, the runner in :mod:`.runner`.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import torch

__all__ = ["OPS", "DEFAULT_FORMATS", "SHAPE_RANK", "DTYPES", "CaseSpec", "OpPlan", "Suite", "SUITES", "known_formats",
           "parse_shape", "select_cases", "suite_graph"]

#: Ops the harness knows how to time, in report order.
OPS: tuple[str, ...] = ("quantize", "dequantize", "linear")
#: Formats timed by the default suite (and wherever a suite names no formats).
DEFAULT_FORMATS: tuple[str, ...] = ("nvfp4", "mxfp4", "mxfp8_e4m3", "int4_affine_g128")
#: Shape rank per op: quantize/dequantize take [rows, cols]; linear takes [M, N, K].
SHAPE_RANK: dict[str, int] = {"quantize": 2, "dequantize": 2, "linear": 3}

#: activation dtypes of the linear cases (``--dtype``)
DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
_DTYPE_TAGS = {v: k for k, v in DTYPES.items()}


# ---- selection ------------------------------------------------------------------------

@dataclass(frozen=True)
class CaseSpec:
    """One row of a suite: an op, a format name and a shape ([rows, cols] or [M, N, K])."""

    op: str
    format: str
    shape: tuple[int, ...]

    @property
    def id(self) -> str:
        """``op/format/AxBxC``: the case's name in logs and reports."""
        return f"{self.op}/{self.format}/{'x'.join(map(str, self.shape))}"


@dataclass(frozen=True)
class OpPlan:
    """Formats and shapes of one op in a suite (``formats=None``: every registered format);
    ``more``: further (formats x shapes) products of the same op, after this one."""

    formats: Optional[tuple[str, ...]]
    shapes: tuple[tuple[int, ...], ...]
    more: tuple["OpPlan", ...] = ()


@dataclass(frozen=True)
class Suite:
    """A named suite: per op an :class:`OpPlan`, one table for CUDA and one for ``--cpu``;
    ``budget_s`` is the default time budget (cases left after it are reported skipped);
    ``graph``: the default CUDA-graph mode of its timings (None: 'auto')."""

    name: str
    description: str
    cuda: dict[str, OpPlan]
    cpu: dict[str, OpPlan]
    budget_s: Optional[float] = None
    graph: Optional[str] = None


_W = (28672, 8192)  # a 70B-class MLP projection weight [N, K]
_QSHAPES_DEFAULT = ((8192, 8192), _W)
_QSHAPES_ALL = ((128, 8192), (8192, 8192), _W)
_LSHAPES_DEFAULT = ((1, *_W), (16, *_W), (4096, *_W))
_LSHAPES_ALL = ((1, 8192, 8192), (16, 8192, 8192), (1, *_W), (16, *_W), (128, *_W), (4096, *_W))
#: The matrix suite: the peers' (N, K) shapes at every M from one token to a prefill, by M
#: (so that the one-token cases do not follow the compute-bound ones and their clocks)
_PEER_NK = ((8192, 8192), _W, (8192, 28672))
_MATRIX_M = (1, 2, 4, 8, 16, 32, 64, 128, 512, 4096)
_CPU_Q = ((4096, 4096),)
_CPU_L = ((16, 4096, 4096),)

#: The suites, by name.
SUITES: dict[str, Suite] = {s.name: s for s in (
    Suite("default", "quantize, dequantize and linear on the main formats; under 8 minutes on an H200",
          cuda={"quantize": OpPlan(DEFAULT_FORMATS, _QSHAPES_DEFAULT),
                "dequantize": OpPlan(DEFAULT_FORMATS, _QSHAPES_DEFAULT),
                "linear": OpPlan(DEFAULT_FORMATS, _LSHAPES_DEFAULT)},
          cpu={"quantize": OpPlan(DEFAULT_FORMATS, _CPU_Q),
               "dequantize": OpPlan(DEFAULT_FORMATS, _CPU_Q)},
          budget_s=450.0),
    Suite("quantize", "quantize and dequantize on every registered format",
          cuda={"quantize": OpPlan(None, _QSHAPES_ALL), "dequantize": OpPlan(None, _QSHAPES_ALL)},
          cpu={"quantize": OpPlan(None, _CPU_Q), "dequantize": OpPlan(None, _CPU_Q)}),
    Suite("linear", "weight-only linear on the main formats, M from 1 to 4096",
          cuda={"linear": OpPlan(DEFAULT_FORMATS, _LSHAPES_ALL)},
          cpu={"linear": OpPlan(DEFAULT_FORMATS, _CPU_L)}),
    Suite("matrix", "weight-only linear, NVFP4 and MXFP4 at M 1-4096 on 8192x8192, 28672x8192 and "
                    "8192x28672; MXFP8 and int8 at M=1",
          cuda={"linear": OpPlan(("mxfp8_e4m3", "int8_fp16", "mxint8"), tuple((1, n, k) for n, k in _PEER_NK),
                                 more=tuple(OpPlan(("nvfp4", "mxfp4"), tuple((m, n, k) for n, k in _PEER_NK))
                                            for m in _MATRIX_M))},
          cpu={"linear": OpPlan(("nvfp4", "mxfp4"), _CPU_L)},
          # every row, ours and the peers', as graph replays of back-to-back calls (a decode
          # loop's conditions); 'auto' chooses by host time, so one-token rows would flip
          # between methods run to run
          graph="always"),
    Suite("all", "every op on every registered format and every shape",
          cuda={"quantize": OpPlan(None, _QSHAPES_ALL), "dequantize": OpPlan(None, _QSHAPES_ALL),
                "linear": OpPlan(None, _LSHAPES_ALL)},
          cpu={"quantize": OpPlan(None, _CPU_Q), "dequantize": OpPlan(None, _CPU_Q),
               "linear": OpPlan(None, _CPU_L)}),
)}


# ---- the op families beyond quantize / dequantize / linear (builders: .cases_ops, .cases_kv, .cases_moe) ----
OPS += ("norm_qkv", "embedding", "kv_decode", "moe", "scaled_mm")
#: norm_qkv [M, Nq, Nkv, K]; embedding [T, V, D]; kv_decode batch x context x q heads x kv heads x head_dim x
#: sliding window (0: none); moe [T, E, H, I, top_k]; scaled_mm [M, N, K]
SHAPE_RANK.update({"norm_qkv": 4, "embedding": 3, "kv_decode": 6, "moe": 5, "scaled_mm": 3})

# RMSNorm + q/k/v at one token on Llama-3-8B shapes, and the embedding gather of its 128256 x 4096 table
# (1 id, a 4096-token prompt, and 32768 ids: how much of the gather's shortfall is its launch and ramp)
_OPS_FORMATS = ("nvfp4", "mxfp4", "mxfp8_e4m3", "int4_affine_g128")
SUITES["ops"] = Suite("ops", "RMSNorm + q/k/v fused (rmsnorm_linear over three weights) vs separate calls, and "
                             "the quantized embedding gather, on Llama-3-8B shapes",
                      cuda={"norm_qkv": OpPlan(_OPS_FORMATS, ((1, 4096, 1024, 4096), (16, 4096, 1024, 4096))),
                            "embedding": OpPlan(_OPS_FORMATS, ((1, 128256, 4096), (4096, 128256, 4096),
                                                               (32768, 128256, 4096)))},
                      cpu={"norm_qkv": OpPlan(("nvfp4",), ((1, 256, 128, 256),)),
                           "embedding": OpPlan(("nvfp4",), ((16, 512, 256),))})

_KV_BL = ((1, 32768), (8, 32768), (1, 4096), (8, 4096), (64, 4096), (1, 131072), (8, 131072), (64, 32768),
          (64, 131072))  # the 32k rows first: they carry the targets
_KV_LLAMA70 = tuple((b, n, 64, 8, 128, 0) for b, n in _KV_BL)
_KV_GPT_OSS = tuple((b, n, 64, 8, 64, w) for b, n in _KV_BL for w in (0, 128))  # full and sliding layers
SUITES["kv"] = Suite(
    "kv", "decode attention over a paged KV cache (fp8 per token, NVFP4, MXFP4; MXFP8 and int at 32k), "
          "batch 1/8/64, context 4k/32k/128k, 64 q / 8 kv heads at head_dim 128 and gpt-oss-120b's shape",
    cuda={"kv_decode": OpPlan(("fp8_e4m3_block128", "nvfp4", "mxfp4"), _KV_LLAMA70 + _KV_GPT_OSS,
                              more=(OpPlan(("mxfp8_e4m3", "int8_fp16", "int4_fp16"),
                                           tuple(s for s in _KV_LLAMA70 if s[1] == 32768)),))},
    cpu={"kv_decode": OpPlan(("nvfp4",), ((1, 256, 8, 2, 64, 0),))},
    budget_s=900.0, graph="always")

# gpt-oss-20b (32 experts) and gpt-oss-120b (128 experts): hidden 2880, expert width 2880, top-4;
# Qwen3-30B-A3B: 128 experts, hidden 2048, expert width 768, top-8
_MOE_TOKENS = (1, 4, 8, 64, 512, 4096)
_MOE_SHAPES = (tuple((t, e, 2880, 2880, 4) for e in (32, 128) for t in _MOE_TOKENS)
               + tuple((t, 128, 2048, 768, 8) for t in _MOE_TOKENS))
SUITES["moe"] = Suite("moe", "the experts forward of one MoE layer (ms.moe_experts) on gpt-oss-20b/120b and "
                             "Qwen3-30B-A3B shapes, 1-4096 tokens (skewed routing beyond decode), vs bf16 experts "
                             "(transformers' loop, torch._grouped_mm)",
                      cuda={"moe": OpPlan(("mxfp4", "nvfp4", "mxfp8_e4m3"), _MOE_SHAPES)},
                      cpu={"moe": OpPlan(("mxfp4",), ((2, 4, 64, 64, 2), (8, 4, 64, 64, 2)))}, graph="always")

# the targets' pairs (weights x activations: .cases_moe.ACT_FORMAT) at 1, 16 and 4096 tokens on a 70B MLP weight
SUITES["scaled_mm"] = Suite("scaled_mm", "both operands quantized (ms.scaled_mm): fp8 block-128 W8A8, MXFP4 x MXFP8, "
                                         "MXFP8 x MXFP8, NVFP4 W4A4 on 28672x8192 at 1, 16 and 4096 tokens",
                            cuda={"scaled_mm": OpPlan(("fp8_e4m3_block128x128", "mxfp4", "mxfp8_e4m3", "nvfp4"),
                                                      ((1, *_W), (16, *_W), (4096, *_W)))},
                            cpu={"scaled_mm": OpPlan(("nvfp4",), ((4, 256, 256),))})

# the default suite covers every op once, on its headline shape
SUITES["default"].cuda.update({
    "norm_qkv": OpPlan(("nvfp4",), ((1, 4096, 1024, 4096),)),
    "embedding": OpPlan(("nvfp4",), ((1, 128256, 4096),)),
    "kv_decode": OpPlan(("nvfp4", "mxfp4"), ((1, 32768, 64, 8, 128, 0),)),
    "moe": OpPlan(("mxfp4",), ((1, 32, 2880, 2880, 4),)),
    "scaled_mm": OpPlan(("mxfp4",), ((4096, *_W),))})


def known_formats() -> tuple[str, ...]:
    """Names in ``microscale.formats.registry``, or :data:`DEFAULT_FORMATS` when the
    registry cannot be imported."""
    try:
        from microscale.formats import registry
        return tuple(registry)
    except Exception:
        return DEFAULT_FORMATS


def parse_shape(text: str) -> tuple[int, ...]:
    """``'8192x8192'`` -> ``(8192, 8192)``; ``'1x28672x8192'`` -> ``(1, 28672, 8192)``."""
    try:
        dims = tuple(int(p) for p in text.lower().split("x"))
    except ValueError:
        dims = ()
    # a kv_decode shape's last dim is its sliding window, where 0 means none
    sizes = dims[:-1] if len(dims) == SHAPE_RANK["kv_decode"] else dims
    if not dims or any(d <= 0 for d in sizes) or dims[-1] < 0:
        raise ValueError(f"shape={text!r} is not a shape; expected positive integers joined by 'x', "
                         "e.g. 8192x8192 (quantize) or 1x28672x8192 (linear M x N x K); a kv_decode "
                         "shape ends in its window, 0 for none")
    return dims


def _as_list(v: Optional[Iterable[str] | str]) -> Optional[list[str]]:
    if v is None:
        return None
    items = [v] if isinstance(v, str) else list(v)
    out = [p.strip() for item in items for p in item.split(",") if p.strip()]
    return out or None


def select_cases(suite: str = "default", *, ops: Optional[Iterable[str] | str] = None,
                 formats: Optional[Iterable[str] | str] = None,
                 shapes: Optional[Iterable[str | Sequence[int]] | str] = None,
                 cpu: bool = False, universe: Optional[Sequence[str]] = None) -> list[CaseSpec]:
    """The cases of ``suite`` after the filters: per op, the plan's (format, shape) products
    in order, then those of its ``more`` plans (a case listed once).

    Args:
        suite: a name in :data:`SUITES`.
        ops: keep these ops (names in :data:`OPS`; comma-separated strings accepted).
        formats: format names or glob patterns (``'mx*'``) matched against every known
            format; replaces the suite's formats. ``None`` keeps the suite's.
        shapes: shapes (``'8192x8192'`` or tuples) replacing the suite's shapes for the
            ops whose shape rank they match (:data:`SHAPE_RANK`: 2 quantize/dequantize, 3 linear,
            ...); a shape that fits no selected op is an error.
        cpu: use the suite's CPU table.
        universe: the known format names (default: :func:`known_formats`).
    """
    if suite not in SUITES:
        raise ValueError(f"suite={suite!r} is not a suite; known suites: {', '.join(SUITES)}")
    plan = SUITES[suite].cpu if cpu else SUITES[suite].cuda
    op_list = _as_list(ops)
    if op_list is not None:
        bad = [o for o in op_list if o not in OPS]
        if bad:
            raise ValueError(f"ops={bad} are not ops; known ops: {', '.join(OPS)}")
    universe = tuple(universe) if universe is not None else known_formats()
    patterns = _as_list(formats)
    chosen: Optional[list[str]] = None
    if patterns is not None:
        chosen = []
        for p in patterns:
            hits = [f for f in universe if fnmatch.fnmatchcase(f, p.lower())]
            if not hits:
                raise ValueError(f"formats={p!r} matches no known format; known formats: {', '.join(universe)}")
            chosen += [h for h in hits if h not in chosen]
    shape_list: Optional[list[tuple[int, ...]]] = None
    if shapes is not None:
        raw = [shapes] if isinstance(shapes, str) else list(shapes)
        shape_list = []
        for s in raw:
            if isinstance(s, str):
                shape_list += [parse_shape(p) for p in s.split(",") if p.strip()]
            else:
                shape_list.append(tuple(int(d) for d in s))
        ranks: dict[int, list[str]] = {}
        for op in OPS:
            if op in plan and (op_list is None or op in op_list):
                ranks.setdefault(SHAPE_RANK[op], []).append(op)
        bad_rank = ["x".join(map(str, s)) for s in shape_list if len(s) not in ranks]
        if bad_rank:  # a shape no selected op takes would be dropped silently
            have = ", ".join(f"{r} dims ({'/'.join(o)})" for r, o in sorted(ranks.items()))
            raise ValueError(f"shapes={bad_rank} fit no op of suite {suite!r}: its ops take {have}")
    specs: list[CaseSpec] = []
    for op in OPS:
        if op not in plan or (op_list is not None and op not in op_list):
            continue
        for p in (plan[op], *plan[op].more):
            fmts = chosen if chosen is not None else list(p.formats if p.formats is not None else universe)
            shp = list(p.shapes)
            if shape_list is not None:
                mine = [s for s in shape_list if len(s) == SHAPE_RANK[op]]
                shp = mine or shp
            new = [CaseSpec(op, f, tuple(s)) for f in fmts for s in shp]
            specs += [c for c in new if c not in specs]  # filters can make the products overlap
    return specs


def suite_graph(suite: str, override: Optional[str] = None) -> str:
    """The CUDA-graph mode a run of ``suite`` uses: ``override`` when given, else the
    suite's own (:attr:`Suite.graph`), else 'auto'."""
    return override or SUITES[suite].graph or "auto"


# conv2d [batch, C_in, H, W, C_out, k, stride, groups] (.cases_conv): a ViT-B/16 patch embedding (16x16 stride
# 16, 3 -> 768 at 224x224) and a ConvNeXt-T stage-1 depthwise 7x7 (96 channels at 56x56), batch 1 and 32
from dataclasses import replace as _replace  # noqa: E402

OPS += ("conv2d",)
SHAPE_RANK["conv2d"] = 8
_CONV_SHAPES = ((1, 3, 224, 224, 768, 16, 16, 1), (32, 3, 224, 224, 768, 16, 16, 1),
                (1, 96, 56, 56, 96, 7, 1, 96), (32, 96, 56, 56, 96, 7, 1, 96))
SUITES["ops"].cuda["conv2d"] = OpPlan(_OPS_FORMATS, _CONV_SHAPES)
SUITES["ops"].cpu["conv2d"] = OpPlan(("nvfp4",), ((1, 3, 32, 32, 32, 16, 16, 1), (1, 16, 12, 12, 16, 7, 1, 16)))
SUITES["ops"] = _replace(SUITES["ops"], description=SUITES["ops"].description + "; conv2d on a ViT patch embedding "
                        "and a ConvNeXt depthwise 7x7 vs F.conv2d bf16")
SUITES["default"].cuda["conv2d"] = OpPlan(("nvfp4",), ((32, 3, 224, 224, 768, 16, 16, 1),))
