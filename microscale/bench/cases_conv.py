"""Bench builder of the conv2d family: ``ms.conv2d(x, w)`` on a quantized conv weight vs
``F.conv2d`` in bf16 on a dense weight of the same shape (cuDNN), both checked against float64
``F.conv2d`` on their weights before timing.

Shape ``(batch, C_in, H, W, C_out, k, stride, groups)``: a square ``k x k`` kernel, padding
``(k - 1) // 2`` at stride 1 (a "same" conv, e.g. ConvNeXt's depthwise 7x7) and 0 otherwise
(a patch embedding, kernel == stride)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .cases import Case, Context, Peer, _format, _lookup, random_input
from .checks import LINEAR_TOL, Check, rel_fro
from .suites import CaseSpec

__all__ = ["build_conv2d", "conv_geometry"]


def conv_geometry(shape: tuple[int, ...]) -> dict:
    """The conv arguments a conv2d bench shape stands for (see the module docstring)."""
    n, c_in, h, w, c_out, k, stride, groups = shape
    pad = (k - 1) // 2 if stride == 1 else 0
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    return dict(n=n, c_in=c_in, h=h, w=w, c_out=c_out, k=k, stride=stride, groups=groups, padding=pad, ho=ho, wo=wo)


def _check(x: torch.Tensor, w4d: torch.Tensor, y: torch.Tensor, g: dict) -> Check:
    want = F.conv2d(x.double().cpu(), w4d.double().cpu(), None, g["stride"], g["padding"], 1, g["groups"])
    err = rel_fro(y.cpu(), want)
    return Check(err < LINEAR_TOL, "rel_fro", err,
                 f"rel Frobenius error vs float64 F.conv2d {err:.3g} (tolerance {LINEAR_TOL:g})")


def build_conv2d(spec: CaseSpec, ctx: Context) -> Case:
    """``ms.conv2d(x, q)`` with x bf16 NCHW and q from ``quantize_conv_weight`` (K order "hwc",
    K padded to a whole block); checked against float64 ``F.conv2d`` on the dequantized weight.
    Bytes: weight codes + scales, x and the output (bf16) once; flops
    ``2 * N * C_out * OH * OW * (C_in / groups) * k * k``. Peer: ``F.conv2d`` in bf16 on a dense
    bf16 weight (cuDNN)."""
    conv2d = _lookup("conv2d")
    from ..conv import dequantize_conv_weight, quantize_conv_weight

    _format(spec.format)
    g = conv_geometry(spec.shape)
    if g["c_in"] % g["groups"] or g["c_out"] % g["groups"] or min(g["ho"], g["wo"]) < 1:
        raise ValueError(f"conv2d bench shape {spec.shape}: channels must be multiples of groups and the "
                         "output non-empty")
    wshape = (g["c_out"], g["c_in"] // g["groups"], g["k"], g["k"])
    xshape = (g["n"], g["c_in"], g["h"], g["w"])
    dt = torch.bfloat16

    def make() -> tuple:
        w = random_input(wshape, ctx, torch.float32) * (wshape[1] * g["k"] ** 2) ** -0.5
        return (random_input(xshape, ctx, dt), quantize_conv_weight(w, spec.format))

    def fn(x, q):
        return conv2d(x, q, None, g["stride"], g["padding"], 1, g["groups"])

    def check(inputs: tuple, y) -> Check:
        x, q = inputs
        return _check(x, dequantize_conv_weight(q.to("cpu"), torch.float64), y, g)

    x0, q0 = make()
    out_bytes = g["n"] * g["c_out"] * g["ho"] * g["wo"] * 2
    x_bytes = x0.numel() * 2
    flops = 2 * g["n"] * g["c_out"] * g["ho"] * g["wo"] * wshape[1] * g["k"] ** 2
    dense_w = wshape[0] * wshape[1] * g["k"] ** 2 * 2

    def cudnn_peer() -> Peer:
        def make_dense() -> tuple:
            w = random_input(wshape, ctx, torch.float32) * (wshape[1] * g["k"] ** 2) ** -0.5
            return (random_input(xshape, ctx, dt), w.to(dt))

        return Peer("F.conv2d bf16", lambda x, w: F.conv2d(x, w, None, g["stride"], g["padding"], 1, g["groups"]),
                    lambda inputs, y: _check(inputs[0], inputs[1], y, g), make_inputs=make_dense,
                    set_bytes=x_bytes + dense_w + out_bytes, nbytes=x_bytes + dense_w + out_bytes)

    nbytes = q0.nbytes + x_bytes + out_bytes
    return Case(spec, fn, make, check, nbytes=nbytes, flops=flops,
                compute_kind="bf16_mm" if wshape[1] > 1 else None, set_bytes=nbytes,
                peers=[("F.conv2d bf16", cudnn_peer)])
