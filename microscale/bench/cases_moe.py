"""Bench builders of the MoE and both-quantized families: ``moe`` (``ms.moe_experts``, the
experts forward of one MoE layer) and ``scaled_mm`` (``ms.scaled_mm``, both operands quantized).

Shapes: ``moe`` ``(T, E, H, I, top_k)`` (T tokens, E experts with gate/up ``[E, 2I, H]`` and down
``[E, H, I]``); ``scaled_mm`` ``(M, N, K)``, the format naming the weight and :data:`ACT_FORMAT`
its activation format."""
from __future__ import annotations

import torch

from . import _peers, models
from ._peers import Skip
from .cases import Case, Context, Peer, _format, _lookup, _ref, random_input
from .checks import Check, check_matmul, rel_fro
from .suites import CaseSpec

__all__ = ["build_moe", "build_scaled_mm", "ACT_FORMAT"]

_TOL = 1e-2
_CHECK_ROWS = 64  # moe: tokens checked against float64
#: moe: at most this many experts decoded in float64 for a check (the first rows that use no more, at least one
#: row); every expert of a 64-token, 128-expert case was ~25 GB of float64 and ~15 s of CPU per check
_CHECK_EXPERTS = 32

#: scaled_mm: the activation format paired with each weight format (the pairs checkpoints ship)
ACT_FORMAT = {"fp8_e4m3_block128x128": "fp8_e4m3_block128", "mxfp4": "mxfp8_e4m3", "nvfp4": "nvfp4",
              "mxfp8_e4m3": "mxfp8_e4m3"}


#: expert popularity of the prefill cases ~ rank^-ZIPF (ranks shuffled): at E=128 the busiest expert is drawn
#: ~4x as often as the mean and the idlest ~0.5x, a trained router's imbalance rather than a uniform draw
ZIPF = 0.4


def _routing(t: int, e: int, top_k: int, ctx: Context) -> torch.Tensor:
    """Expert ids ``[T, top_k]``, distinct within a token. While ``T * top_k <= E`` (decode) all distinct: a
    step touches as many experts as it can, the most bytes. Beyond, each token draws ``top_k`` experts without
    replacement from a skewed popularity (:data:`ZIPF`)."""
    if t * top_k <= e:
        return torch.randperm(e, generator=ctx.generator, device=ctx.device)[:t * top_k].reshape(t, top_k)
    rank = torch.randperm(e, generator=ctx.generator, device=ctx.device)
    pop = (rank + 1).to(torch.float32).pow(-ZIPF)
    return torch.multinomial(pop.expand(t, e), top_k, replacement=False, generator=ctx.generator)


def _bf16_experts(x, wgu, wd, idx, wts):
    """The dense bf16 experts forward as transformers runs it: a Python loop over the touched experts."""
    out = torch.zeros(x.shape[0], wd.shape[1], dtype=torch.float32, device=x.device)
    i = wd.shape[2]
    for ex in torch.unique(idx).tolist():
        tok, slot = torch.where(idx == ex)
        h = x[tok] @ wgu[ex].T
        a = torch.nn.functional.silu(h[:, :i]) * h[:, i:]
        out.index_add_(0, tok, (a @ wd[ex].T).float() * wts[tok, slot, None].float())
    return out.to(x.dtype)


def _grouped_bf16(x, wgu, wd, idx, wts):
    """The dense bf16 experts forward over ``torch._grouped_mm`` (one grouped GEMM per projection)."""
    e, i = wgu.shape[0], wd.shape[2]
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=e), 0).to(torch.int32)
    tok = order // idx.shape[1]
    h = torch._grouped_mm(x[tok], wgu.transpose(-2, -1), offs=offs)
    a = torch.nn.functional.silu(h[:, :i]) * h[:, i:]
    y = torch._grouped_mm(a, wd.transpose(-2, -1), offs=offs).float() * wts.reshape(-1)[order, None].float()
    return torch.zeros(x.shape[0], wd.shape[1], dtype=torch.float32, device=x.device).index_add_(0, tok, y).to(x.dtype)


def _experts_f64(w, used: torch.Tensor) -> torch.Tensor:
    """Experts ``used`` of a 3-D QTensor ``w`` decoded in float64 on the CPU from the QTensor's own bytes (not
    the packed copy the op reads, so a repacking error shows)."""
    from ..qtensor import QTensor

    i = used.to(w.data.device)
    sub = QTensor(w.data[i], w.scales[i], w.fmt, torch.Size((int(used.numel()), *w.shape[1:])), w.dtype,
                  w.global_scale, None if w.zero_points is None else w.zero_points[i], dict(w.meta))
    return sub.to("cpu").dequantize(torch.float64)


def _check_row_count(idx: torch.Tensor) -> int:
    """How many leading tokens of ``idx`` [T, top_k] a check covers: at most :data:`_CHECK_ROWS`, and no more
    than use :data:`_CHECK_EXPERTS` distinct experts (at least one token)."""
    rows = idx[:_CHECK_ROWS].cpu()
    seen: set[int] = set()
    for r, ids in enumerate(rows.tolist()):
        seen.update(ids)
        if len(seen) > _CHECK_EXPERTS:
            return max(r, 1)
    return rows.shape[0]


def _check_rows(inputs: tuple, y: torch.Tensor, experts, **act) -> Check:
    """The first tokens of a ``moe`` case (:func:`_check_row_count`) against float64 over only the experts
    they use (``experts(w, used)``: those experts' weights in float64 on the CPU)."""
    from ..moe import moe_experts_reference

    x, wgu, wd, idx, wts = inputs
    r = _check_row_count(idx)
    sub = idx[:r].cpu()
    used = torch.unique(sub)
    remap = torch.full((int(sub.max()) + 1 if sub.numel() else 1,), -1, dtype=torch.long)
    remap[used] = torch.arange(used.numel())
    ref = moe_experts_reference(x[:r].cpu().double(), experts(wgu, used), experts(wd, used), remap[sub],
                                wts[:r].cpu().double(), **act)
    err = rel_fro(y[:r].cpu(), ref)
    return Check(err < _TOL, "rel_fro", err, f"rel Frobenius error {err:.3g} over the first {r} tokens "
                                             f"(tolerance {_TOL:g})")


def _chain_peer_name() -> str:
    from ..moe import tuning as moe_tuning

    return ("microscale decode chain, plain launches" if moe_tuning.DECODE_PDL
            else "microscale decode chain, programmatic launches")


def build_moe(spec: CaseSpec, ctx: Context) -> Case:
    """``ms.moe_experts`` (plain SwiGLU, concatenated gate/up) on QTensor weights already packed, checked
    against the float64 reference; bytes: the touched experts' weights + x + out; flops 6*T*top_k*H*I.
    Peers: the same forward on dense bf16 weights as transformers' loop over touched experts, and over
    ``torch._grouped_mm`` (the bf16 grouped GEMM); microscale's other prefill route at the shapes one of them
    serves (the Gluon prefill path of :mod:`microscale.moe.prefill` switched on for the call below its threshold,
    the grouped kernel with it switched off above); at decode, the op with the decode chain's programmatic launches
    (``microscale.moe.tuning.DECODE_PDL``) switched the other way; and, where it imports,
    OpenAI's ``triton_kernels`` ``matmul_ogs`` on the same MXFP4 experts (gpt-oss's clamped SwiGLU on interleaved
    gate/up, its own routing from the same ids; checked against that forward in float64)."""
    moe_experts = _lookup("moe_experts")
    quantize = _lookup("quantize")
    _format(spec.format)
    from ..moe import cached_prepare_experts
    from ..moe.decode import decode_eligible

    t, e, h, i, top_k = spec.shape

    def make() -> tuple:
        x = random_input((t, h), ctx)
        # QTensors, as users pass them (eager calls replay call plans kept with them), repacked ahead
        wgu = quantize(random_input((e, 2 * i, h), ctx) * 0.05, spec.format)
        wd = quantize(random_input((e, h, i), ctx) * 0.05, spec.format)
        cached_prepare_experts(wgu), cached_prepare_experts(wd)
        idx = _routing(t, e, top_k, ctx)
        wts = torch.softmax(random_input((t, top_k), ctx, torch.float32), -1).to(x.dtype)
        return (x, wgu, wd, idx, wts)

    def fn(x, wgu, wd, idx, wts):
        return moe_experts(x, wgu, wd, idx, wts)

    def check(inputs: tuple, y) -> Check:
        return _check_rows(inputs, y, _experts_f64)

    def dense_inputs() -> tuple:
        return (random_input((t, h), ctx), random_input((e, 2 * i, h), ctx, torch.bfloat16) * 0.05,
                random_input((e, h, i), ctx, torch.bfloat16) * 0.05, _routing(t, e, top_k, ctx),
                torch.softmax(random_input((t, top_k), ctx, torch.float32), -1).to(torch.bfloat16))

    def dense_check(inputs: tuple, y) -> Check:
        return _check_rows(inputs, y, lambda w, used: w[used.to(w.device)].cpu().double())

    dense_bytes = e * 3 * h * i * 2

    def loop_peer() -> Peer:
        if ctx.cpu:
            raise Skip("dense peers are timed on CUDA")
        return Peer("bf16 experts (transformers loop)", _bf16_experts, dense_check, make_inputs=dense_inputs,
                    set_bytes=dense_bytes)

    def grouped_peer() -> Peer:
        if ctx.cpu:
            raise Skip("dense peers are timed on CUDA")
        if not hasattr(torch, "_grouped_mm"):
            raise Skip("torch._grouped_mm is not in this torch")
        return Peer("torch._grouped_mm bf16", _grouped_bf16, dense_check, make_inputs=dense_inputs,
                    set_bytes=dense_bytes)

    def _switched(least):
        """The op with ``microscale.moe.tuning.PREFILL_WS_MIN_PER_EXPERT`` = ``least`` for the call only."""
        from ..moe import tuning as moe_tuning

        def run(x, wgu, wd, idx, wts):
            saved, moe_tuning.PREFILL_WS_MIN_PER_EXPERT = moe_tuning.PREFILL_WS_MIN_PER_EXPERT, least
            try:
                return moe_experts(x, wgu, wd, idx, wts)
            finally:
                moe_tuning.PREFILL_WS_MIN_PER_EXPERT = saved
        return run

    def _probe_prefill(least) -> bool:
        """Whether the op's gate/up GEMM takes the Gluon prefill path at this shape with the switch at ``least``."""
        from ..moe import tuning as moe_tuning
        from ..moe.prefill import prefill_takes

        saved, moe_tuning.PREFILL_WS_MIN_PER_EXPERT = moe_tuning.PREFILL_WS_MIN_PER_EXPERT, least
        try:  # (the op's own weights)
            return prefill_takes(cached_prepare_experts(wgu0), random_input((1, h), ctx), t * top_k)
        finally:
            moe_tuning.PREFILL_WS_MIN_PER_EXPERT = saved

    def prefill_peer() -> Peer:
        from ..moe import tuning as moe_tuning

        if ctx.cpu:
            raise Skip("the Gluon prefill path is CUDA only")
        if decode_eligible(cached_prepare_experts(wgu0), random_input((1, h), ctx), t * top_k):
            raise Skip("the decode path serves this shape, whatever the prefill switch")
        if _probe_prefill(moe_tuning.PREFILL_WS_MIN_PER_EXPERT):
            raise Skip("the Gluon prefill path is microscale's own route here")
        if not _probe_prefill(1):
            raise Skip("the Gluon prefill path does not take this format or GPU")
        return Peer("microscale Gluon prefill path", _switched(1), check)

    def grouped_kernel_peer() -> Peer:
        from ..moe import tuning as moe_tuning

        if ctx.cpu:
            raise Skip("the grouped kernel's peer is timed on CUDA")
        if not _probe_prefill(moe_tuning.PREFILL_WS_MIN_PER_EXPERT):
            raise Skip("the grouped kernel (or the decode path) is microscale's own route here")
        return Peer("microscale grouped kernel", _switched(None), check)

    def chain_peer() -> Peer:
        """The op with the decode chain's programmatic launches switched the other way for the call."""
        from ..moe import tuning as moe_tuning

        if ctx.cpu:
            raise Skip("programmatic launches are CUDA only")
        from ..moe.op import decode_chain_pdl

        if not decode_chain_pdl(cached_prepare_experts(wgu0), cached_prepare_experts(wd0), random_input((1, h), ctx),
                                t * top_k):
            raise Skip("no decode chain of programmatic launches here (path, rows or GPU)")

        def run(x, wgu, wd, idx, wts):
            saved, moe_tuning.DECODE_PDL = moe_tuning.DECODE_PDL, not moe_tuning.DECODE_PDL
            try:
                return moe_experts(x, wgu, wd, idx, wts)
            finally:
                moe_tuning.DECODE_PDL = saved
        return Peer(chain_name, run, check)

    def matmul_ogs_peer() -> Peer:
        if ctx.cpu:
            raise Skip("triton_kernels runs on CUDA")
        _peers.require_triton_kernels()
        if spec.format != "mxfp4":
            raise Skip("matmul_ogs takes MXFP4 experts here (gpt-oss's)")

        def tk_inputs() -> tuple:
            x, wgu, wd, idx, wts = make()
            w1, pc1 = _peers.matmul_ogs_experts(wgu)
            w2, pc2 = _peers.matmul_ogs_experts(wd)
            logits = torch.zeros((t, e), dtype=x.dtype, device=x.device)
            logits.scatter_(1, idx, wts.float().log().to(x.dtype))
            return (x, w1, pc1, w2, pc2, logits, idx.to(torch.int16), wgu, wd, idx, wts)

        def tk_check(inputs: tuple, y) -> Check:  # (gpt-oss's clamped SwiGLU on interleaved gate/up, as it runs)
            x, *_, wgu, wd, idx, wts = inputs
            return _check_rows((x, wgu, wd, idx, wts), y, _experts_f64, activation="swiglu_clamped",
                               layout="interleaved", alpha=1.702, limit=7.0)
        return Peer("triton_kernels matmul_ogs", lambda *a: _peers.matmul_ogs_moe(*a[:7]), tk_check,
                    make_inputs=tk_inputs)

    chain_name = _chain_peer_name()
    _, wgu0, wd0, idx0, _ = make()
    touched = int(torch.unique(idx0).numel())
    per_expert = cached_prepare_experts(wgu0).nbytes_per_expert + cached_prepare_experts(wd0).nbytes_per_expert
    nbytes = touched * per_expert + 2 * t * h * 2
    return Case(spec, fn, make, check, nbytes=nbytes, flops=6 * t * top_k * h * i, compute_kind="bf16_mm",
                set_bytes=e * per_expert + 2 * t * h * 2,
                peers=[("bf16 experts (transformers loop)", loop_peer), ("torch._grouped_mm bf16", grouped_peer),
                       ("microscale Gluon prefill path", prefill_peer),
                       ("microscale grouped kernel", grouped_kernel_peer), (chain_name, chain_peer),
                       ("triton_kernels matmul_ogs", matmul_ogs_peer)])


def build_scaled_mm(spec: CaseSpec, ctx: Context) -> Case:
    """``ms.scaled_mm(a, b)`` with a quantized on the fly outside the timing (the activation format of
    :data:`ACT_FORMAT`), checked against the float64 product of both dequantized operands; bytes:
    both operands' codes and scales + out; flops 2*M*N*K. Peers: cuBLAS bf16 on dense operands,
    ``torch._scaled_mm`` on e4m3 operands with per-tensor scales, and microscale's own
    ``fast_accum=True`` where its fp8 kernel takes the pair."""
    scaled_mm = _lookup("scaled_mm")
    quantize = _lookup("quantize")
    _format(spec.format)
    afmt = ACT_FORMAT.get(spec.format, spec.format)
    ref_dequantize = _ref("dequantize")
    m, n, k = spec.shape

    def make() -> tuple:
        return (quantize(random_input((m, k), ctx), afmt), quantize(random_input((n, k), ctx), spec.format))

    def fn(a, b):
        return scaled_mm(a, b)

    def check(inputs: tuple, y) -> Check:
        a, b = inputs
        return check_matmul(ref_dequantize(a, torch.float32), ref_dequantize(b, torch.float32), y)

    def cublas_peer() -> Peer:
        if ctx.cpu:
            raise Skip("cuBLAS is CUDA only")

        def make_dense() -> tuple:
            return (random_input((m, k), ctx, torch.bfloat16), random_input((n, k), ctx, torch.bfloat16))
        dense = models.linear_bytes(m, n, k, 2 * n * k)
        return Peer("cuBLAS bf16", _peers.cublas_linear, lambda inputs, y: check_matmul(inputs[0], inputs[1], y),
                    make_inputs=make_dense, set_bytes=dense, nbytes=dense)

    def tensorwise_peer() -> Peer:
        if ctx.cpu or not hasattr(torch, "_scaled_mm"):
            raise Skip("torch._scaled_mm is CUDA only")
        if torch.cuda.get_device_capability() < (8, 9):
            raise Skip("fp8 GEMMs need sm_89 or newer")

        def make_fp8() -> tuple:
            x, w = random_input((m, k), ctx, torch.bfloat16), random_input((n, k), ctx, torch.bfloat16)
            sx, sw = (t.abs().amax().float().clamp_min(1e-12) / 448 for t in (x, w))
            return (x.div(sx).to(torch.float8_e4m3fn), w.div(sw).to(torch.float8_e4m3fn), sx, sw)

        def check_fp8(inputs: tuple, y) -> Check:
            x8, w8, sx, sw = inputs
            return check_matmul(x8.float() * sx, w8.float() * sw, y)

        fp8_bytes = m * k + n * k + 2 * m * n
        return Peer("torch._scaled_mm fp8 per-tensor", _peers.scaled_mm_fp8_tensorwise, check_fp8,
                    make_inputs=make_fp8, set_bytes=fp8_bytes, nbytes=fp8_bytes)

    def fast_accum_peer() -> Peer:
        from ..formats import get_format
        from ..linear.backends.scaled_fp8 import fast_accum_takes

        if ctx.cpu or not fast_accum_takes(get_format(afmt), get_format(spec.format), m):
            raise Skip("CUDA only" if ctx.cpu else "fast_accum keeps this pair on its exact kernels")
        return Peer("microscale fast_accum", lambda a, b: scaled_mm(a, b, fast_accum=True), check)

    def fold_peer(block_rows: int = 1) -> Peer:
        from ..quant.fold import FOLD_FORMAT, FOLD_FORMAT_2D, fold_fp8

        if ctx.cpu:
            raise Skip("CUDA only")
        try:  # (a trial fold on a block of rows: formats whose random weights do not fold exactly are skipped)
            fold_fp8(quantize(random_input((128, k), ctx), spec.format), block_rows=block_rows)
        except ValueError as e:
            raise Skip(str(e)) from None

        def make_folded() -> tuple:  # (fold outside the timing: it is a load-time step)
            return (quantize(random_input((m, k), ctx), FOLD_FORMAT),
                    fold_fp8(quantize(random_input((n, k), ctx), spec.format), block_rows=block_rows))

        def check_folded(inputs: tuple, y) -> Check:
            a, b = inputs
            return check_matmul(ref_dequantize(a, torch.float32), ref_dequantize(b, torch.float32), y)

        fold_bytes = (m + n) * k * 132 // 128 + 2 * m * n  # (a byte an element, a float32 scale per 128; out)
        what = FOLD_FORMAT if block_rows == 1 else FOLD_FORMAT_2D
        return Peer(f"microscale fold_fp8 x {what}, fast_accum", lambda a, b: scaled_mm(a, b, fast_accum=True),
                    check_folded, make_inputs=make_folded, set_bytes=fold_bytes, nbytes=fold_bytes)

    a0, b0 = make()
    nbytes = a0.nbytes + b0.nbytes + 2 * m * n
    return Case(spec, fn, make, check, nbytes=nbytes, flops=models.linear_flops(m, n, k), compute_kind="bf16_mm",
                set_bytes=nbytes, peers=[("cuBLAS bf16", cublas_peer), ("torch._scaled_mm fp8 per-tensor", tensorwise_peer),
                                         ("microscale fast_accum", fast_accum_peer),
                                         ("microscale fold_fp8 fast_accum", fold_peer),
                                         ("microscale fold_fp8 128x128 fast_accum", lambda: fold_peer(128))])

