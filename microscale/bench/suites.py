"""Cases, the suite registry, and the runner.

A suite names, per op, the formats and shapes to time (:class:`Suite`, :data:`SUITES`);
:func:`select_cases` turns a suite and the user's ``--ops/--formats/--shapes`` filters
into :class:`CaseSpec` rows without importing anything. Each op has a builder
(:data:`BUILDERS`) that looks the op up lazily and turns a spec into a :class:`Case`:
the function to time, a fresh-input factory, a reference check, the bytes and flops
models and the peers. A builder raises :class:`Skip` when the op (or its format) is not
there yet, and the case is reported as ``skipped: <reason>``. :func:`run_cases` checks
each op's output against the reference before timing it, times it with
:mod:`microscale.bench._timing`, then times its peers the same way.
"""
from __future__ import annotations

import fnmatch
import gc
import importlib
import inspect
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Optional, Sequence, TextIO

import torch
import torch.nn.functional as F

from . import _clocks, _peers, _timing, models
from ._peers import Skip
from .report import bf16_mbps, collect_env, fmt_time

__all__ = [
    "OPS",
    "DEFAULT_FORMATS",
    "CaseSpec",
    "OpPlan",
    "Suite",
    "SUITES",
    "Check",
    "Peer",
    "Case",
    "Context",
    "PeerResult",
    "CaseResult",
    "RunOptions",
    "BUILDERS",
    "Skip",
    "known_formats",
    "parse_shape",
    "select_cases",
    "random_input",
    "check_qtensor",
    "check_bits",
    "check_matmul",
    "rel_fro",
    "measure_ceilings",
    "run_case",
    "run_cases",
    "run_benchmark",
]

#: Ops the harness knows how to time, in report order.
OPS: tuple[str, ...] = ("quantize", "dequantize", "linear")
#: Formats timed by the default suite (and wherever a suite names no formats).
DEFAULT_FORMATS: tuple[str, ...] = ("nvfp4", "mxfp4", "mxfp8_e4m3", "int4_affine_g128")
#: Shape rank per op: quantize/dequantize take [rows, cols]; linear takes [M, N, K].
SHAPE_RANK: dict[str, int] = {"quantize": 2, "dequantize": 2, "linear": 3}
#: Relative Frobenius error a bf16-output matmul must stay under (DESIGN.md, Testing).
LINEAR_TOL = 1e-2
#: What each peer is, for the report.
PEERS: dict[str, str] = {
    "cuBLAS bf16": "F.linear on a dense bf16 weight of the same shape (fresh random data, own rotation)",
    "cuBLAS fp16": "F.linear on a dense fp16 weight of the same shape (fresh random data, own rotation; "
                   "linear with --dtype fp16)",
    "torch.compile(dequant+linear)": "torch.compile of microscale.reference.dequantize(q) to the activations' "
                                     "dtype followed by F.linear, on the op's own inputs",
    "torch.compile(reference)": "torch.compile of microscale.reference.dequantize(q, bf16)",
    "tl.dot_scaled": "a plain Triton tl.dot_scaled bf16 x MXFP4 kernel (no split-K, one tile per M bucket)",
    "torchao (compiled)": "torchao NVFP4Tensor.to_nvfp4 / MXTensor.to_mx under torch.compile, checked by "
                          "round-trip error against microscale's",
}


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
#: Issue 4's matrix: the peer's (N, K) shapes at every M from one token to a prefill, by M
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
                    "8192x28672; MXFP8 and int8 at M=1 (issue 4's benchmark)",
          cuda={"linear": OpPlan(("mxfp8_e4m3", "int8_fp16", "mxint8"), tuple((1, n, k) for n, k in _PEER_NK),
                                 more=tuple(OpPlan(("nvfp4", "mxfp4"), tuple((m, n, k) for n, k in _PEER_NK))
                                            for m in _MATRIX_M))},
          cpu={"linear": OpPlan(("nvfp4", "mxfp4"), _CPU_L)},
          # every row, ours and the peers', as graph replays of back-to-back calls (a decode
          # loop's conditions); 'auto' chose by host time, so one-token rows flipped between
          # methods run to run (2026-12-02: int8_fp16 1x28672x8192 62.5 us by events, 58.1-60.0
          # in graphs) while the cuBLAS rows, with less host time, stayed on events
          graph="always"),
    Suite("all", "every op on every registered format and every shape",
          cuda={"quantize": OpPlan(None, _QSHAPES_ALL), "dequantize": OpPlan(None, _QSHAPES_ALL),
                "linear": OpPlan(None, _LSHAPES_ALL)},
          cpu={"quantize": OpPlan(None, _CPU_Q), "dequantize": OpPlan(None, _CPU_Q),
               "linear": OpPlan(None, _CPU_L)}),
)}


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
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"shape={text!r} is not a shape; expected positive integers joined by 'x', "
                         "e.g. 8192x8192 (quantize) or 1x28672x8192 (linear M x N x K)")
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
            ops whose shape rank they match (2: quantize/dequantize, 3: linear).
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
        bad_rank = [s for s in shape_list if len(s) not in SHAPE_RANK.values()]
        if bad_rank:
            raise ValueError(f"shapes={bad_rank} have neither 2 dims (rows x cols) nor 3 (M x N x K)")
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


# ---- cases ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Check:
    """The outcome of comparing an output with the reference.

    Attributes:
        ok: the output passed.
        metric: what ``value`` measures ('mismatches' for bit-exact checks, 'rel_fro'
            for relative Frobenius error, 'roundtrip_rel' for peers checked by error).
        value: the measured value.
        detail: a human-readable summary.
    """

    ok: bool
    metric: str
    value: float
    detail: str = ""


@dataclass
class Peer:
    """A peer of an op: timed the same way, reported as a ratio.

    ``make_inputs=None`` reuses the op's own input sets; ``set_bytes`` sizes the
    rotation of its own sets; ``nbytes`` is its bytes model (default: the op's).
    """

    name: str
    fn: Callable[..., Any]
    check: Callable[[tuple, Any], Check]
    make_inputs: Optional[Callable[[], tuple]] = None
    set_bytes: Optional[int] = None
    nbytes: Optional[int] = None


@dataclass
class Case:
    """A runnable case built from a :class:`CaseSpec`.

    Attributes:
        spec: the row it came from.
        fn: the op, called as ``fn(*inputs)``.
        make_inputs: returns one fresh random input set (a tuple).
        check: ``check(inputs, output) -> Check`` against the reference.
        nbytes: bytes model (fewest bytes moved).
        flops: flops model (0 for ops without arithmetic worth counting).
        compute_kind: the compute ceiling that applies ('bf16_mm', 'fp8_mm' or None).
        set_bytes: device bytes of one input set plus its output (sizes the rotation).
        peers: (name, builder) pairs; a builder returns a :class:`Peer` or raises Skip.
    """

    spec: CaseSpec
    fn: Callable[..., Any]
    make_inputs: Callable[[], tuple]
    check: Callable[[tuple, Any], Check]
    nbytes: int
    flops: int
    compute_kind: Optional[str]
    set_bytes: int
    peers: list[tuple[str, Callable[[], Peer]]] = field(default_factory=list)


@dataclass
class Context:
    """What builders need: the device, the random generator for fresh inputs and the activation dtype of
    the linear cases (their cuBLAS peer runs in it too)."""

    device: torch.device
    generator: torch.Generator
    act_dtype: torch.dtype = torch.bfloat16

    @property
    def cpu(self) -> bool:
        """True in CPU mode."""
        return self.device.type == "cpu"


def _ms() -> Any:
    try:
        import microscale
    except Exception as exc:  # pragma: no cover - the package imports before this module
        raise Skip(f"import microscale failed: {type(exc).__name__}: {exc}") from None
    return microscale


def _lookup(what: str) -> Any:
    """``microscale.<what>`` (dotted), or Skip naming what is missing."""
    obj = _ms()
    path = "microscale"
    part = ""
    for part in what.split("."):
        path += "." + part
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:
                obj = importlib.import_module(path)
            except Exception as exc:
                raise Skip(f"{path} not available ({type(exc).__name__}: {exc})") from None
    if inspect.ismodule(obj) and callable(getattr(obj, part, None)):
        obj = getattr(obj, part)  # a module named like its op -> the op
    return obj


def _format(name: str) -> Any:
    registry = _lookup("formats.registry")
    if name not in registry:
        raise Skip(f"format {name!r} not in microscale.formats.registry")
    return registry[name]


def random_input(shape: Sequence[int], ctx: Context, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Fresh random data (never zeros): normal values with a random power-of-two scale
    per row (2^-4 .. 2^4), so block scales vary as they do in real weights."""
    x = torch.randn(tuple(shape), generator=ctx.generator, device=ctx.device, dtype=torch.float32)
    if len(shape) >= 2:
        e = torch.randint(-4, 5, (*shape[:-1], 1), generator=ctx.generator, device=ctx.device)
        x = x * torch.exp2(e.to(torch.float32))
    return x.to(dtype)


def _nbytes(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _bit_mismatches(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> int:
    """Number of elements whose bits differ (NaNs with equal bits match); -1 on a
    shape/dtype/presence mismatch."""
    if a is None or b is None:
        return 0 if a is None and b is None else -1
    if a.shape != b.shape or a.dtype != b.dtype:
        return -1
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    ia = a.contiguous().view(ints[a.element_size()])
    ib = b.contiguous().to(a.device).view(ints[b.element_size()])
    return int((ia != ib).sum())


_QFIELDS = ("data", "scales", "global_scale", "zero_points")


def check_qtensor(q: Any, ref: Any) -> Check:
    """Bit-exact comparison of two QTensors field by field."""
    bad = {f: _bit_mismatches(getattr(q, f, None), getattr(ref, f, None)) for f in _QFIELDS}
    total = sum(v for v in bad.values() if v > 0)
    broken = [f for f, v in bad.items() if v < 0]
    ok = total == 0 and not broken
    detail = "bit-exact" if ok else ", ".join(
        f"{f}: {'shape/dtype differ' if v < 0 else f'{v} mismatches'}" for f, v in bad.items() if v)
    return Check(ok, "mismatches", float(total if not broken else -1), detail)


def check_bits(y: torch.Tensor, ref: torch.Tensor) -> Check:
    """Bit-exact comparison of two dense tensors."""
    n = _bit_mismatches(y, ref)
    ok = n == 0
    detail = "bit-exact" if ok else ("shape/dtype differ" if n < 0 else f"{n} of {ref.numel()} elements differ")
    return Check(ok, "mismatches", float(n), detail)


def rel_fro(y: torch.Tensor, ref: torch.Tensor) -> float:
    """``||y - ref|| / ||ref||`` in float64 (inf when y has NaN/Inf or shapes differ)."""
    if y.shape != ref.shape:
        return float("inf")
    y64 = y.to(torch.float64)
    if not bool(torch.isfinite(y64).all()):
        return float("inf")
    r64 = ref.to(device=y.device, dtype=torch.float64)
    return float((y64 - r64).norm() / r64.norm().clamp_min(1e-300))


def check_matmul(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, tol: float = LINEAR_TOL) -> Check:
    """``y`` against ``x @ w^T`` computed in float64, by relative Frobenius error."""
    ref = x.to(torch.float64) @ w.to(torch.float64).T
    err = rel_fro(y, ref)
    return Check(err < tol, "rel_fro", err, f"rel Frobenius error {err:.3g} (tolerance {tol:g})")


# ---- builders -------------------------------------------------------------------------

def _ref(name: str) -> Callable[..., Any]:
    return _lookup(f"reference.{name}")


def build_quantize(spec: CaseSpec, ctx: Context) -> Case:
    """``ms.quantize(x, fmt)`` on a bf16 [rows, cols] tensor; checked bit-exact against
    ``microscale.reference.quantize``; bytes: read numel*2, write q.nbytes."""
    quantize = _lookup("quantize")
    fmt = _format(spec.format)
    ref_quantize = _ref("quantize")
    name = spec.format

    def make() -> tuple:
        return (random_input(spec.shape, ctx),)

    def fn(x: torch.Tensor) -> Any:
        return quantize(x, name)

    x0 = make()[0]
    q0 = fn(x0)
    numel = x0.numel()

    def check(inputs: tuple, q: Any) -> Check:
        return check_qtensor(q, ref_quantize(inputs[0], name))

    def torchao_peer() -> Peer:
        tq = _peers.torchao_quantizer(fmt)

        def peer_check(inputs: tuple, t: Any) -> Check:
            x = inputs[0]
            mine = rel_fro(_ref("dequantize")(ref_quantize(x, name), torch.float32), x)
            theirs = rel_fro(_peers.torchao_dequantize(t, torch.float32), x)
            ok = theirs <= 1.25 * mine + 1e-4
            return Check(ok, "roundtrip_rel", theirs,
                         f"round-trip error {theirs:.4g} vs microscale reference {mine:.4g}")
        return Peer("torchao (compiled)", tq, peer_check)

    return Case(spec, fn, make, check, nbytes=models.quantize_bytes(numel, q0.nbytes), flops=0,
                compute_kind=None, set_bytes=_nbytes(x0) + q0.nbytes,
                peers=[("torchao (compiled)", torchao_peer)])


def build_dequantize(spec: CaseSpec, ctx: Context) -> Case:
    """``q.dequantize(torch.bfloat16)``; checked bit-exact against
    ``microscale.reference.dequantize``; bytes: read q.nbytes, write numel*2."""
    quantize = _lookup("quantize")
    _format(spec.format)
    ref_dequantize = _ref("dequantize")
    name = spec.format

    def make() -> tuple:
        return (quantize(random_input(spec.shape, ctx), name),)

    def fn(q: Any) -> torch.Tensor:
        return q.dequantize(torch.bfloat16)

    q0 = make()[0]
    numel = q0.numel

    def check(inputs: tuple, y: torch.Tensor) -> Check:
        return check_bits(y, ref_dequantize(inputs[0], torch.bfloat16))

    def compile_peer() -> Peer:
        cfn = _peers.compiled(lambda q: ref_dequantize(q, torch.bfloat16))
        return Peer("torch.compile(reference)", cfn, lambda inputs, y: check_bits(y, ref_dequantize(
            inputs[0], torch.bfloat16)))

    return Case(spec, fn, make, check, nbytes=models.dequantize_bytes(numel, q0.nbytes), flops=0,
                compute_kind=None, set_bytes=q0.nbytes + 2 * numel,
                peers=[("torch.compile(reference)", compile_peer)])


def build_linear(spec: CaseSpec, ctx: Context) -> Case:
    """``ms.linear(x, q)``: x [M, K] (``ctx.act_dtype``: bf16, or fp16) times the dequantized weight
    [N, K]^T; checked against float64 by relative Frobenius error; bytes: weight q.nbytes + M*K*2 +
    M*N*2; flops 2*M*N*K. Peers: cuBLAS in the same dtype, torch.compile(dequantize + F.linear), and a
    plain tl.dot_scaled kernel (bf16) where the format is MXFP4-shaped."""
    linear = _lookup("linear")
    quantize = _lookup("quantize")
    fmt = _format(spec.format)
    ref_dequantize = _ref("dequantize")
    name = spec.format
    m, n, k = spec.shape

    dt = ctx.act_dtype
    cublas = f"cuBLAS {_DTYPE_TAGS[dt]}"

    def act(shape: tuple) -> torch.Tensor:
        # fp16: rows 2^-8..2^0 (not 2^-4..2^4), else |x . w| reaches ~1e5 at K = 8192: past fp16's 65504
        x = random_input(shape, ctx, dt)
        return x * 2.0 ** -4 if dt == torch.float16 else x

    def make() -> tuple:
        return (act((m, k)), quantize(random_input((n, k), ctx), name))

    def fn(x: torch.Tensor, q: Any) -> torch.Tensor:
        return linear(x, q)

    x0, q0 = make()

    def check(inputs: tuple, y: torch.Tensor) -> Check:
        x, q = inputs
        return check_matmul(x, ref_dequantize(q, torch.float32), y)

    def cublas_peer() -> Peer:
        if ctx.cpu:
            raise Skip("cuBLAS is CUDA only")

        def make_dense() -> tuple:
            return (act((m, k)), random_input((n, k), ctx, dt))
        dense_bytes = models.linear_bytes(m, n, k, 2 * n * k)
        return Peer(cublas, _peers.cublas_linear, lambda inputs, y: check_matmul(inputs[0], inputs[1], y),
                    make_inputs=make_dense, set_bytes=dense_bytes, nbytes=dense_bytes)

    def compile_peer() -> Peer:
        cfn = _peers.compiled(lambda x, q: F.linear(x, ref_dequantize(q, dt)))
        return Peer("torch.compile(dequant+linear)", cfn, check)

    def dot_scaled_peer() -> Peer:
        if ctx.cpu:
            raise Skip("Triton kernels need CUDA")
        if not _peers.dot_scaled_mxfp4_applies(fmt):
            raise Skip(f"tl.dot_scaled peer is for MXFP4 (E2M1, E8M0 per 32), not {name}")
        if dt != torch.bfloat16:
            raise Skip("tl.dot_scaled peer takes bf16 activations")
        return Peer("tl.dot_scaled", lambda x, q: _peers.dot_scaled_mxfp4_linear(x, q.data, q.scales), check)

    return Case(spec, fn, make, check, nbytes=models.linear_bytes(m, n, k, q0.nbytes),
                flops=models.linear_flops(m, n, k), compute_kind="bf16_mm",
                set_bytes=_nbytes(x0) + q0.nbytes + 2 * m * n,
                peers=[(cublas, cublas_peer), ("torch.compile(dequant+linear)", compile_peer),
                       ("tl.dot_scaled", dot_scaled_peer)])


#: op name -> builder(spec, ctx) -> Case. Builders look the op up lazily.
BUILDERS: dict[str, Callable[[CaseSpec, Context], Case]] = {
    "quantize": build_quantize,
    "dequantize": build_dequantize,
    "linear": build_linear,
}


# ---- results --------------------------------------------------------------------------

@dataclass
class PeerResult:
    """A peer's outcome: status 'ok' | 'skipped' | 'failed' | 'error'; ``ratio`` is
    peer time / op time (above 1: microscale is faster)."""

    name: str
    status: str
    reason: str = ""
    timing: Optional[dict] = None
    nbytes: Optional[int] = None
    gbps: Optional[float] = None
    tflops: Optional[float] = None
    ratio: Optional[float] = None
    check: Optional[dict] = None


@dataclass
class CaseResult:
    """A case's outcome: status 'ok' | 'skipped' | 'failed' (check) | 'error' (raised)."""

    op: str
    format: str
    shape: list[int]
    status: str
    reason: str = ""
    nbytes: Optional[int] = None
    flops: Optional[int] = None
    compute_kind: Optional[str] = None
    timing: Optional[dict] = None
    throughput: Optional[dict] = None
    check: Optional[dict] = None
    peers: list[PeerResult] = field(default_factory=list)

    @property
    def id(self) -> str:
        """``op/format/shape`` as in :attr:`CaseSpec.id`."""
        return CaseSpec(self.op, self.format, tuple(self.shape)).id

    def to_dict(self) -> dict:
        """JSON-able form."""
        return asdict(self)


@dataclass
class RunOptions:
    """Knobs of :func:`run_cases` (defaults are the methodology's)."""

    warmup_ms: float = 25.0
    target_ms: float = 300.0
    graph: str = "auto"
    rotate_factor: float = 3.0
    max_rotation_bytes: int = 8 << 30
    cpu_target_s: float = 1.0
    time_budget_s: Optional[float] = None


def _log(stream: Optional[TextIO], msg: str) -> None:
    if stream is not None:
        print(msg, file=stream, flush=True)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _n_sets(set_bytes: int, ctx: Context, opts: RunOptions) -> int:
    if ctx.cpu:
        return 1
    return _timing.rotation_count(max(1, set_bytes), _timing.l2_cache_bytes(ctx.device),
                                  factor=opts.rotate_factor, max_total_bytes=opts.max_rotation_bytes)


def _time(fn: Callable[..., Any], sets: list[tuple], ctx: Context, opts: RunOptions,
          monitor: Optional[_clocks.Monitor] = None) -> _timing.Timing:
    if ctx.cpu:
        return _timing.time_cpu(fn, sets, target_s=opts.cpu_target_s)
    if monitor is not None:
        monitor.settle()  # not under a power cap that the previous timing brought on
    t0 = time.time()
    t = _timing.time_cuda(fn, sets, warmup_ms=opts.warmup_ms, target_ms=opts.target_ms, graph=opts.graph)
    state = monitor.window(t0, time.time()) if monitor is not None else None
    return replace(t, clocks=state.to_dict()) if state is not None else t


def _run_peer(name: str, build: Callable[[], Peer], case: Case, sets: list[tuple], op_ms: float,
              ctx: Context, opts: RunOptions, monitor: Optional[_clocks.Monitor] = None) -> PeerResult:
    try:
        peer = build()
    except Skip as s:
        return PeerResult(name, "skipped", str(s))
    except Exception as exc:
        return PeerResult(name, "skipped", f"could not build: {_short(exc)}")
    try:
        pbytes = peer.nbytes if peer.nbytes is not None else case.nbytes
        if peer.make_inputs is None:
            psets = sets
        else:
            first = peer.make_inputs()
            n = _n_sets(peer.set_bytes or case.set_bytes, ctx, opts)
            psets = [first] + [peer.make_inputs() for _ in range(n - 1)]
        out = peer.fn(*psets[0])
        chk = peer.check(psets[0], out)
        del out
        if not chk.ok:
            return PeerResult(name, "failed", f"check failed: {chk.detail}", check=asdict(chk))
        t = _time(peer.fn, psets, ctx, opts, monitor)
        gb = models.gbps(pbytes, t.median_ms)
        tf = models.tflops(case.flops, t.median_ms) if case.flops else None
        return PeerResult(name, "ok", t.note, timing=t.to_dict(), nbytes=pbytes, gbps=gb, tflops=tf,
                          ratio=t.median_ms / op_ms, check=asdict(chk))
    except Skip as s:
        return PeerResult(name, "skipped", str(s))
    except NotImplementedError as exc:
        return PeerResult(name, "skipped", f"not implemented: {_short(exc)}")
    except Exception as exc:
        return PeerResult(name, "error", _short(exc))
    finally:
        _free(ctx.device)


def run_case(spec: CaseSpec, ctx: Context, ceilings: models.Ceilings, opts: RunOptions,
             builders: Optional[dict[str, Callable[[CaseSpec, Context], Case]]] = None,
             monitor: Optional[_clocks.Monitor] = None) -> CaseResult:
    """Build, check, time and compare one case. Never raises for the op's own failures:
    they come back as status 'skipped', 'failed' or 'error' with a reason. ``monitor``:
    where given and sampling, each timing records the GPU's clocks (``timing['clocks']``)."""
    builders = BUILDERS if builders is None else builders
    base = dict(op=spec.op, format=spec.format, shape=list(spec.shape))
    if spec.op not in builders:
        return CaseResult(**base, status="skipped", reason=f"no builder for op {spec.op!r}")
    try:
        case = builders[spec.op](spec, ctx)
    except Skip as s:
        return CaseResult(**base, status="skipped", reason=str(s))
    except NotImplementedError as exc:
        _free(ctx.device)
        return CaseResult(**base, status="skipped", reason=f"not implemented: {_short(exc)}")
    except Exception as exc:
        _free(ctx.device)
        return CaseResult(**base, status="error", reason=f"build: {_short(exc)}")
    res = CaseResult(**base, status="error", nbytes=case.nbytes, flops=case.flops, compute_kind=case.compute_kind)
    try:
        sets = [case.make_inputs()]
        out = case.fn(*sets[0])
        chk = case.check(sets[0], out)
        del out
        res.check = asdict(chk)
        if not chk.ok:
            res.status, res.reason = "failed", f"check failed: {chk.detail}"
            return res
        n = _n_sets(case.set_bytes, ctx, opts)
        sets += [case.make_inputs() for _ in range(n - 1)]
        t = _time(case.fn, sets, ctx, opts, monitor)
        res.timing = t.to_dict()
        res.throughput = asdict(models.throughput(case.nbytes, case.flops, t.median_ms, ceilings,
                                                  case.compute_kind))
        res.status, res.reason = "ok", t.note
        for name, build in case.peers:
            pr = _run_peer(name, build, case, sets, t.median_ms, ctx, opts, monitor)
            res.peers.append(pr)
    except Skip as s:
        res.status, res.reason = "skipped", str(s)
    except NotImplementedError as exc:
        res.status, res.reason = "skipped", f"not implemented: {_short(exc)}"
    except Exception as exc:
        res.status, res.reason = "error", _short(exc)
    finally:
        sets = None
        _free(ctx.device)
    return res


def _describe(r: CaseResult) -> str:
    if r.status != "ok":
        return f"{r.status}: {r.reason}"
    t, th = r.timing or {}, r.throughput or {}
    parts = [f"{fmt_time(t['median_ms'])} [{t['method']}]", f"{th['gbps']:.4g} GB/s"]
    mbps = bf16_mbps(r.to_dict())
    if t.get("method") == "perf_counter" and mbps is not None:
        parts.append(f"{mbps:.0f} MB/s of bf16")
    if r.flops:
        parts.append(f"{th['tflops']:.4g} TFLOP/s")
    if th.get("pct_roofline") is not None:
        parts.append(f"{th['pct_roofline']:.0f}% of roofline")
    if t.get("clocks"):
        parts.append(_clocks.ClockState.from_dict(t["clocks"]).summary())
    for p in r.peers:
        parts.append(f"{p.name} {p.ratio:.2f}x" if p.status == "ok" else f"{p.name} {p.status}")
    return ", ".join(parts)


def run_cases(specs: Sequence[CaseSpec], ctx: Context, ceilings: models.Ceilings,
              opts: Optional[RunOptions] = None,
              builders: Optional[dict[str, Callable[[CaseSpec, Context], Case]]] = None,
              log: Optional[TextIO] = sys.stderr,
              on_result: Optional[Callable[[CaseResult], None]] = None) -> list[CaseResult]:
    """Run ``specs`` in order, printing progress to ``log`` and passing each result to
    ``on_result`` as it comes (so a killed run leaves its partial results); cases that
    would start after ``opts.time_budget_s`` seconds are reported as skipped (the first
    always runs). On a CUDA device with ``nvidia-smi``, the GPU's clocks are sampled
    throughout and each timing records them (:mod:`microscale.bench._clocks`)."""
    opts = opts or RunOptions()
    t0 = time.monotonic()
    out: list[CaseResult] = []
    with _clocks.Monitor(ctx.device) as monitor:  # inert on CPU or without nvidia-smi
        for i, spec in enumerate(specs, 1):
            if i > 1 and opts.time_budget_s is not None and time.monotonic() - t0 > opts.time_budget_s:
                r = CaseResult(spec.op, spec.format, list(spec.shape), "skipped",
                               f"time budget of {opts.time_budget_s:g} s spent")
            else:
                _log(log, f"[{i:>3}/{len(specs)}] {spec.id} ...")
                r = run_case(spec, ctx, ceilings, opts, builders, monitor)
                _log(log, f"          {_describe(r)}")
            out.append(r)
            if on_result is not None:
                on_result(r)
    return out


# ---- ceilings -------------------------------------------------------------------------

def _ceiling(fn: Callable[..., Any], sets: list[tuple], check: Callable[[Any], Check],
             ctx: Context, opts: RunOptions) -> tuple[Optional[float], dict]:
    """Check, then time, one ceiling; returns (median ms or None, detail). Never under
    ``graph='always'``: a captured copy becomes a memcpy node that the copy engines may serve
    (2026-12-02, H200: 2717 GB/s against 4229 GB/s for the same copy timed by events)."""
    out = fn(*sets[0])
    chk = check(out)
    del out
    if not chk.ok:
        return None, {"status": "failed", "reason": f"check failed: {chk.detail}", "check": asdict(chk)}
    t = _time(fn, sets, ctx, replace(opts, graph="auto") if opts.graph == "always" else opts)
    return t.median_ms, {"status": "ok", "timing": t.to_dict(), "check": asdict(chk)}


_MM_SIZE = 8192  # square matmul of the compute ceilings
_MM_CHECK_ROWS = 64  # rows checked in float64: the full product costs more than it tells


def _copy_ceiling(ctx: Context, opts: RunOptions) -> tuple[Optional[float], dict]:
    nbytes = (256 << 20) if ctx.cpu else (1 << 30)
    src = random_input((nbytes // 4,), ctx, torch.float32)
    dst = torch.empty_like(src)
    ms_, d = _ceiling(lambda a, b: b.copy_(a), [(src, dst)], lambda y: check_bits(y, src), ctx, opts)
    d.update(bytes=models.copy_bytes(nbytes), what=f"copy of {nbytes >> 20} MiB, bytes read + written")
    return (models.gbps(models.copy_bytes(nbytes), ms_) if ms_ else None), d


def _bf16_ceiling(ctx: Context, opts: RunOptions) -> tuple[Optional[float], dict]:
    n, rows = _MM_SIZE, _MM_CHECK_ROWS
    a, b = random_input((n, n), ctx), random_input((n, n), ctx)
    ms_, d = _ceiling(torch.mm, [(a, b)], lambda y: check_matmul(a[:rows], b.T, y[:rows]), ctx, opts)
    flops = models.linear_flops(n, n, n)
    d.update(flops=flops, what=f"cuBLAS bf16 torch.mm {n}x{n}x{n}, random data")
    return (models.tflops(flops, ms_) if ms_ else None), d


def _fp8_ceiling(ctx: Context, opts: RunOptions) -> tuple[Optional[float], dict]:
    if not hasattr(torch, "_scaled_mm"):
        raise Skip("torch has no _scaled_mm")
    n, rows = _MM_SIZE, _MM_CHECK_ROWS
    a8 = random_input((n, n), ctx, torch.float32).clamp(-448, 448).to(torch.float8_e4m3fn)
    w8 = random_input((n, n), ctx, torch.float32).clamp(-448, 448).to(torch.float8_e4m3fn)
    one = torch.ones((), dtype=torch.float32, device=ctx.device)

    def fp8_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    ms_, d = _ceiling(fp8_mm, [(a8, w8)], lambda y: check_matmul(a8[:rows].float(), w8.float(), y[:rows]),
                      ctx, opts)
    flops = models.linear_flops(n, n, n)
    d.update(flops=flops, what=f"torch._scaled_mm e4m3 x e4m3 -> bf16, tensor scales, {n}x{n}x{n}, random data")
    return (models.tflops(flops, ms_) if ms_ else None), d


def measure_ceilings(ctx: Context, opts: Optional[RunOptions] = None,
                     log: Optional[TextIO] = sys.stderr) -> tuple[models.Ceilings, dict]:
    """Measure the ceilings in this run: copy bandwidth (bytes read + written) of a
    1 GiB device-to-device copy (256 MiB on the CPU); on CUDA also the cuBLAS bf16 and
    ``torch._scaled_mm`` fp8 rates of an 8192^3 product on random data. Each is checked
    before it is timed. Returns the ceilings and per-ceiling details (sizes, timing,
    or the reason one could not be measured)."""
    opts = opts or RunOptions()
    details: dict[str, dict] = {}
    values: dict[str, Optional[float]] = {}
    plan = [("copy_gbps", "copy", _copy_ceiling), ("bf16_tflops", "bf16_mm", _bf16_ceiling),
            ("fp8_tflops", "fp8_mm", _fp8_ceiling)]
    for key, kind, measure in plan:
        values[key] = None
        if ctx.cpu and kind != "copy":
            details[kind] = {"status": "skipped", "reason": "not measured on the CPU"}
            continue
        try:
            values[key], details[kind] = measure(ctx, opts)
        except Skip as s:
            details[kind] = {"status": "skipped", "reason": str(s)}
        except Exception as exc:
            details[kind] = {"status": "error", "reason": _short(exc)}
        _free(ctx.device)
    _log(log, "ceilings: " + ", ".join(
        f"{key}={values[key]:.1f}" if values[key] is not None else f"{key}=n/a ({details[kind].get('reason', '')})"
        for key, kind, _ in plan))
    return models.Ceilings(**values), details


# ---- the whole run --------------------------------------------------------------------

def run_benchmark(suite: str = "default", *, ops: Optional[Iterable[str] | str] = None,
                  formats: Optional[Iterable[str] | str] = None,
                  shapes: Optional[Iterable[str | Sequence[int]] | str] = None,
                  cpu: bool = False, seed: Optional[int] = None, opts: Optional[RunOptions] = None,
                  log: Optional[TextIO] = sys.stderr,
                  checkpoint: Optional[Callable[[dict], None]] = None, dtype: str = "bf16") -> dict:
    """Select, measure ceilings, run the cases; returns the JSON-able result document
    (``schema``, ``mode``, ``suite``, ``selection``, ``env``, ``seed``, ``wall_s``,
    ``ceilings``, ``ceilings_detail``, ``methodology``, ``results``). ``checkpoint`` is
    called with the document so far after the ceilings and after every case. Without
    ``opts``, the suite's own graph mode (:attr:`Suite.graph`) applies. ``dtype``: the linear
    cases' activations and their cuBLAS peer, ``"bf16"`` or ``"fp16"``."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    specs = select_cases(suite, ops=ops, formats=formats, shapes=shapes, cpu=cpu)
    _peers.quiet_compiler()
    if not cpu and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device is visible; pass --cpu to time the reference path on the CPU")
    device = torch.device("cpu") if cpu else torch.device("cuda", torch.cuda.current_device())
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else int(seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    ctx = Context(device, gen, DTYPES[dtype])
    opts = opts or RunOptions(graph=suite_graph(suite))
    _log(log, f"microscale.bench: suite={suite} mode={'cpu' if cpu else 'cuda'} cases={len(specs)} seed={seed}")
    started = time.time()
    ceilings, cdetail = measure_ceilings(ctx, opts, log)
    doc: dict = {
        "schema": 1,
        "mode": "cpu" if cpu else "cuda",
        "suite": suite,
        "selection": {"ops": _as_list(ops), "formats": _as_list(formats), "dtype": dtype,
                      "shapes": None if shapes is None else [str(s) for s in (
                          [shapes] if isinstance(shapes, str) else shapes)]},
        "env": collect_env(device),
        "seed": seed,
        "wall_s": 0.0,
        "complete": False,
        "ceilings": ceilings.to_dict(),
        "ceilings_detail": cdetail,
        "methodology": _with_dtype(methodology(opts, cpu), dtype),
        "results": [],
    }

    def add(r: CaseResult) -> None:
        doc["results"].append(r.to_dict())
        doc["wall_s"] = round(time.time() - started, 1)
        if checkpoint is not None:
            checkpoint(doc)

    if checkpoint is not None:
        checkpoint(doc)
    run_cases(specs, ctx, ceilings, opts, log=log, on_result=add)
    doc["complete"] = True
    doc["wall_s"] = round(time.time() - started, 1)
    return doc


def _with_dtype(method: dict, dtype: str) -> dict:
    """``method`` with the linear cases' activation dtype, and only the cuBLAS peer of that dtype."""
    peers = {k: v for k, v in method["peers"].items() if not k.startswith("cuBLAS ") or k == f"cuBLAS {dtype}"}
    return {**method, "activations": f"{dtype} (linear: x and its cuBLAS peer; % roofline against the cuBLAS "
            "bf16 ceiling, which Hopper's fp16 tensor cores share)", "peers": peers,
            **({"data": method["data"] + "; fp16 activations (both ops) times 2^-4, so outputs stay finite"}
               if dtype == "fp16" and "data" in method else {})}


def suite_graph(suite: str, override: Optional[str] = None) -> str:
    """The CUDA-graph mode a run of ``suite`` uses: ``override`` when given, else the
    suite's own (:attr:`Suite.graph`), else 'auto'."""
    return override or SUITES[suite].graph or "auto"


#: how each ``RunOptions.graph`` mode times a CUDA call, for the methodology record
_GRAPH_MODES = {
    "auto": "auto (CUDA graph for calls < 10 us, host-bound launches, or per-call event times scattering "
            f"over {_timing.EVENTS_SPREAD_MAX:.0%} of the median)",
    "always": "always (every call, ours and the peers', as CUDA graph replays of back-to-back calls; events "
              "where a capture fails)",
    "never": "never (a CUDA event pair per call)",
}


def methodology(opts: RunOptions, cpu: bool) -> dict:
    """The timing method of a run, as recorded in its JSON and RESULTS.md."""
    if cpu:
        return {"timer": "time.perf_counter median", "target_s_per_case": opts.cpu_target_s,
                "rotation": "none (1 input set)", "check": "output vs microscale.reference before timing",
                "peers": PEERS}
    return {"timer": "CUDA events, median per call", "warmup_ms": opts.warmup_ms,
            "target_ms_per_case": opts.target_ms, "graph": _GRAPH_MODES[opts.graph],
            "rotation": f"input sets > {opts.rotate_factor:g} x L2 "
            f"(at most {opts.max_rotation_bytes >> 30} GiB)", "data": "fresh random normal, per-row 2^k scales",
            "check": "output vs microscale.reference (bit-exact) or float64 (matmul, rel Frobenius < 1e-2) "
            "before timing", "clocks": "SM clock, power and slowdown reasons sampled by nvidia-smi every "
            f"{_clocks.SAMPLE_MS} ms while each timing runs (where nvidia-smi is present); each timing starts "
            f"once a fresh sample shows no slowdown (at most {_clocks.SETTLE_MAX_S:g} s: the power cap "
            "outlasts the load that reached it)",
            "time_budget_s": opts.time_budget_s, "peers": PEERS}
