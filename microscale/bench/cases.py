"""Runnable cases: each op has a builder (:data:`BUILDERS`) that looks the op up lazily
and turns a :class:`~.suites.CaseSpec` into a :class:`Case`: the function to time, a
fresh-input factory, a reference check, the bytes and flops models and the peers. A
builder raises :class:`Skip` when the op (or its format) is not there yet, and the case is
reported as ``skipped: <reason>``.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from . import _peers, models
from ._peers import Skip
from .checks import Check, check_bits, check_matmul, check_qtensor, rel_fro
from .suites import _DTYPE_TAGS, CaseSpec

__all__ = ["PEERS", "Peer", "Case", "Context", "Skip", "random_input", "build_quantize", "build_dequantize",
           "build_linear", "BUILDERS"]

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

# ---- the op families beyond quantize / dequantize / linear: builders in their own modules, imported on
# first use (they build on this module)
PEERS["SDPA bf16 KV"] = ("torch SDPA (enable_gqa) on dense bf16 K/V [B, Hkv, L, D] of the same shape; a sliding "
                         "window as the last W keys")
PEERS["FlashAttention bf16 KV"] = "flash_attn_with_kvcache on dense bf16 K/V [B, L, Hkv, D] (when installed)"
PEERS["rmsnorm + 3x ms.linear"] = "F.rms_norm then one ms.linear per q/k/v weight (the unfused calls)"
PEERS["F.embedding bf16"] = "F.embedding on a dense bf16 table of the same shape"
PEERS["bf16 experts (transformers loop)"] = ("dense bf16 experts, a Python loop over the touched experts (as "
                                             "transformers runs dequantized experts)")
PEERS["torch._grouped_mm bf16"] = "dense bf16 experts, both projections as torch._grouped_mm grouped GEMMs"
PEERS["microscale Gluon prefill path"] = ("ms.moe_experts with its Gluon prefill path switched on for the call "
                                          "(microscale.moe.tuning.PREFILL_WS_MIN_PER_EXPERT; by default from 128 rows "
                                          "an expert)")
PEERS["microscale grouped kernel"] = ("ms.moe_experts with the Gluon prefill path switched off for the call, where "
                                      "it is the op's own route (the grouped Triton kernel)")
PEERS["triton_kernels matmul_ogs"] = ("OpenAI triton_kernels' matmul_ogs on the same MXFP4 experts, gpt-oss's "
                                      "clamped SwiGLU, its routing from the same ids (when installed)")
PEERS["microscale fast_accum"] = "ms.scaled_mm(a, b, fast_accum=True): the fp8 MMA with a float32 promotion per 128 K"
PEERS["microscale fold_fp8 fast_accum"] = ("the weight refolded losslessly by ms.fold_fp8 (E4M3, a scale per row and "
                                           "128 columns), then fast_accum with fp8 block-128 activations")
PEERS["microscale fold_fp8 128x128 fast_accum"] = ("the same with ms.fold_fp8(w, block_rows=128): a scale per "
                                                   "128 x 128 block, where the weight's values allow it")


def _lazy(module: str, name: str) -> Callable[[CaseSpec, Context], Case]:
    def build(spec: CaseSpec, ctx: Context) -> Case:
        return getattr(importlib.import_module(module, __package__), name)(spec, ctx)
    build.__name__ = build.__qualname__ = name
    build.__doc__ = f"``{module[1:]}.{name}``, imported on first use."
    return build


BUILDERS.update({"kv_decode": _lazy(".cases_kv", "build_kv_decode"),
                 "norm_qkv": _lazy(".cases_ops", "build_norm_qkv"),
                 "embedding": _lazy(".cases_ops", "build_embedding"),
                 "moe": _lazy(".cases_moe", "build_moe"),
                 "scaled_mm": _lazy(".cases_moe", "build_scaled_mm")})

# the conv2d family (builder in .cases_conv)
PEERS["F.conv2d bf16"] = "F.conv2d (cuDNN) in bf16 on a dense bf16 weight of the same shape"
BUILDERS["conv2d"] = _lazy(".cases_conv", "build_conv2d")
