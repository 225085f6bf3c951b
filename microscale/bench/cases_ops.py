"""Bench builders of the fused op families: ``norm_qkv`` (RMSNorm + q/k/v projections: one
``rmsnorm_linear`` over the three weights vs RMSNorm then three ``ms.linear`` calls, the peer) and
``embedding`` (the quantized gather, bytes = gathered codes + scales read + rows written).

Shapes: ``norm_qkv`` ``(M, Nq, Nkv, K)`` (q: ``[Nq, K]``, k and v: ``[Nkv, K]``), ``embedding``
``(T, V, D)`` (T ids into a ``[V, D]`` table)."""
from __future__ import annotations

from typing import Any

import torch

from .cases import Case, Context, Peer, _format, _lookup, _ref, random_input
from .checks import Check, check_bits, rel_fro
from .suites import CaseSpec

__all__ = ["build_norm_qkv", "build_embedding", "split_rows"]

_TOL = 1e-2
_EPS = 1e-5


def split_rows(q: Any, ns: list[int]) -> list[Any]:
    """Row slices of a quantized ``[sum ns, K]`` weight as QTensors sharing its global scale
    (how q/k/v quantized together look)."""
    QTensor = _lookup("QTensor")
    out, r = [], 0
    for n in ns:
        zp = None if q.zero_points is None else q.zero_points[r:r + n]
        out.append(QTensor(q.data[r:r + n], q.scales[r:r + n], q.fmt, torch.Size((n, int(q.shape[1]))), q.dtype,
                           q.global_scale, zp, dict(q.meta)))
        r += n
    return out


def _check_list(x, nw, ws, ys) -> Check:
    ref_dequantize = _ref("dequantize")
    xd = x.double()
    h = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + _EPS) * nw.double()
    err = max(rel_fro(y, h @ ref_dequantize(w, torch.float64).T) for w, y in zip(ws, ys))
    return Check(err < _TOL, "rel_fro", err, f"max rel Frobenius error over q/k/v {err:.3g} (tolerance {_TOL:g})")


def build_norm_qkv(spec: CaseSpec, ctx: Context) -> Case:
    """One ``rmsnorm_linear(x, nw, [wq, wk, wv])`` (one launch) vs ``F.rms_norm`` + three
    ``ms.linear`` calls; both checked against the float64 composition."""
    rmsnorm_linear = _lookup("linear.norm_linear.rmsnorm_linear")
    linear = _lookup("linear")
    quantize = _lookup("quantize")
    _format(spec.format)
    m, nq, nkv, k = spec.shape
    ns = [nq, nkv, nkv]
    dt = ctx.act_dtype

    def make() -> tuple:
        x = random_input((m, k), ctx, dt)
        nw = (torch.rand(k, generator=ctx.generator, device=ctx.device) + 0.5).to(dt)
        ws = split_rows(quantize(random_input((sum(ns), k), ctx), spec.format), ns)
        return (x, nw, *ws)

    def fn(x, nw, wq, wk, wv):
        return rmsnorm_linear(x, nw, [wq, wk, wv], eps=_EPS)

    def check(inputs: tuple, ys) -> Check:
        return _check_list(inputs[0], inputs[1], inputs[2:], ys)

    def separate_peer() -> Peer:
        def sep(x, nw, wq, wk, wv):
            h = torch.nn.functional.rms_norm(x, (k,), nw, _EPS)
            return [linear(h, wq), linear(h, wk), linear(h, wv)]
        return Peer("rmsnorm + 3x ms.linear", sep, check)

    inputs = make()
    wbytes = sum(w.nbytes for w in inputs[2:])
    nbytes = wbytes + m * k * 2 + k * 2 + m * sum(ns) * 2
    return Case(spec, fn, make, check, nbytes=nbytes, flops=2 * m * sum(ns) * k, compute_kind="bf16_mm",
                set_bytes=nbytes, peers=[("rmsnorm + 3x ms.linear", separate_peer)])


def build_embedding(spec: CaseSpec, ctx: Context) -> Case:
    """``ms.embedding(ids, table)`` (bf16 rows), checked bit-exact against the reference
    dequantize of the gathered rows; bytes: the gathered rows' codes and scales + the rows written.
    Peer: ``F.embedding`` on a bf16 table (the unquantized gather)."""
    embedding = _lookup("embedding")
    quantize = _lookup("quantize")
    fmt = _format(spec.format)
    t, v, d = spec.shape

    def make() -> tuple:
        ids = torch.randint(0, v, (t,), generator=ctx.generator, device=ctx.device)
        return (ids, quantize(random_input((v, d), ctx), spec.format))

    def fn(ids, q):
        return embedding(ids, q, dtype=torch.bfloat16, check=False)

    def check(inputs: tuple, y) -> Check:
        ids, q = inputs
        from ..embedding import embedding_reference
        ref = embedding_reference(ids.cpu(), q.to("cpu"), torch.bfloat16)
        return check_bits(y.cpu(), ref)

    def dense_peer() -> Peer:
        def make_dense() -> tuple:
            return (torch.randint(0, v, (t,), generator=ctx.generator, device=ctx.device),
                    random_input((v, d), ctx, torch.bfloat16))
        dense = t * d * 2 * 2
        return Peer("F.embedding bf16", lambda ids, w: torch.nn.functional.embedding(ids, w),
                    lambda inputs, y: check_bits(y, inputs[1][inputs[0]]), make_inputs=make_dense,
                    set_bytes=v * d * 2, nbytes=dense)

    ids0, q0 = make()
    row_bytes = q0.nbytes / v  # codes + scales (+ zero points) per row
    nbytes = int(t * row_bytes) + t * d * 2 + t * 8
    del fmt
    return Case(spec, fn, make, check, nbytes=nbytes, flops=0, compute_kind=None, set_bytes=q0.nbytes + t * d * 2,
                peers=[("F.embedding bf16", dense_peer)])
