"""The public op ``conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1)`` on a
block-scaled weight in the canonical conv layout (:mod:`.layout`), and its ``torch.library``
registration (``torch.ops.microscale.conv2d``).

CPU tensors run the reference: ``F.conv2d`` in float64 on the dequantized weight, rounded once
to x's dtype. CUDA tensors run a Triton kernel (:mod:`._kernels.conv`): an implicit GEMM
(im2col in the loads, the weight decoded once per K step for a tile of pixels) for any groups,
and a direct per-channel kernel for depthwise convolutions (``C_in/groups == 1``).
"""
from __future__ import annotations

import dataclasses
import functools
import json

import torch
import torch.nn.functional as F

from ..formats import Format
from ..qtensor import QTensor
from ..runtime import target
from .layout import ConvLayout, conv_layout

__all__ = ["conv2d", "conv2d_reference", "conv2d_triton", "Conv2dArgs", "conv2d_config"]

OP = "conv2d"
_X_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32",
                torch.float64: "float64"}


@functools.cache
def _device():
    """The launcher, the kernels and the format constexprs: they import Triton, so on first use."""
    from ..linear.packed import format_constexprs
    from ..linear.weight_state import INT_VIEW
    from ..runtime import launch
    from ._kernels import conv

    return launch, conv, format_constexprs, INT_VIEW


@dataclasses.dataclass(frozen=True)
class Conv2dArgs:
    """A checked call: the weight's layout, and stride / padding (top, bottom, left, right) /
    dilation / groups resolved to ints; the input and output spatial sizes."""

    layout: ConvLayout
    stride: tuple[int, int]
    padding: tuple[int, int, int, int]
    dilation: tuple[int, int]
    groups: int
    batch: int
    c_in: int
    h: int
    w: int
    oh: int
    ow: int

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.layout.c_out, self.oh, self.ow)


def _pair(v, name: str, least: int) -> tuple[int, int]:
    vals = (v, v) if isinstance(v, int) else tuple(v) if isinstance(v, (tuple, list)) else None
    if (vals is None or len(vals) != 2 or not all(isinstance(i, int) and not isinstance(i, bool) for i in vals)
            or min(vals) < least):
        raise ValueError(f"{OP}: {name}={v!r} must be an int or a pair of ints >= {least}")
    return vals


def _padding(padding, st: tuple[int, int], dl: tuple[int, int], lay: ConvLayout) -> tuple[int, int, int, int]:
    """``padding`` as F.conv2d takes it -> (top, bottom, left, right)."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding == "same":
            if st != (1, 1):
                raise ValueError(f"{OP}: padding='same' needs stride=1, got stride={st}")
            th, tw = dl[0] * (lay.kh - 1), dl[1] * (lay.kw - 1)  # as torch: the odd pixel goes after
            return (th // 2, th - th // 2, tw // 2, tw - tw // 2)
        raise ValueError(f"{OP}: padding={padding!r} must be 'valid', 'same', an int or a pair of ints >= 0")
    ph, pw = _pair(padding, "padding", 0)
    return (ph, ph, pw, pw)


def _geometry(x_shape: tuple[int, ...], lay: ConvLayout, st: tuple[int, int], pad: tuple[int, int, int, int],
              dl: tuple[int, int], groups: int) -> Conv2dArgs:
    if len(x_shape) != 4:
        raise ValueError(f"{OP}: x must be [N, C_in, H, W] (or [C_in, H, W]), got shape {tuple(x_shape)}")
    n, c_in, h, w = (int(d) for d in x_shape)
    if c_in != lay.c_per_group * groups:
        raise ValueError(f"{OP}: x has C_in={c_in} channels but the weight takes C_in/groups={lay.c_per_group} "
                         f"with groups={groups} ({lay.c_per_group * groups} channels)")
    if lay.c_out % groups:
        raise ValueError(f"{OP}: the weight's C_out={lay.c_out} is not a multiple of groups={groups}")
    oh = (h + pad[0] + pad[1] - dl[0] * (lay.kh - 1) - 1) // st[0] + 1
    ow = (w + pad[2] + pad[3] - dl[1] * (lay.kw - 1) - 1) // st[1] + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"{OP}: x's H x W = {h} x {w} padded by {pad} (top, bottom, left, right) is smaller than "
                         f"the dilated kernel {dl[0] * (lay.kh - 1) + 1} x {dl[1] * (lay.kw - 1) + 1}: no output")
    return Conv2dArgs(lay, st, pad, dl, groups, n, c_in, h, w, oh, ow)


def _check(x: torch.Tensor, w: QTensor, bias: torch.Tensor | None, stride, padding, dilation, groups,
           op: str = OP) -> Conv2dArgs:
    lay = conv_layout(w, op)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (*_X_DTYPES, torch.float64):
        raise TypeError(f"{op}: x must be float32, float16 or bfloat16 (float64 on the CPU), got {x.dtype}")
    if x.device != w.device:
        raise ValueError(f"{op}: x is on {x.device} but the weight is on {w.device}")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"{op}: groups={groups!r} must be an int >= 1")
    st = _pair(stride, "stride", 1)
    dl = _pair(dilation, "dilation", 1)
    a = _geometry(tuple(x.shape), lay, st, _padding(padding, st, dl, lay), dl, groups)
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (lay.c_out,):
            got = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise ValueError(f"{op}: bias has shape {got}; expected ({lay.c_out},) (C_out)")
        if bias.device != x.device or not bias.dtype.is_floating_point:
            raise ValueError(f"{op}: bias must be a float tensor on {x.device}, got {bias.dtype} on {bias.device}")
    return a


def conv2d_reference(x: torch.Tensor, w: QTensor, bias: torch.Tensor | None = None, stride=1, padding=0,
                     dilation=1, groups: int = 1) -> torch.Tensor:
    """``F.conv2d`` in float64 on the dequantized 4-D weight (and x, bias in float64), rounded
    once to x's dtype. Any device; arguments as :func:`conv2d`."""
    unbatched = isinstance(x, torch.Tensor) and x.dim() == 3
    xb = x.unsqueeze(0) if unbatched else x
    a = _check(xb, w, bias, stride, padding, dilation, groups, "conv2d_reference")
    y = _reference_run(xb, w, bias, a)
    return y.squeeze(0) if unbatched else y


def _reference_run(x: torch.Tensor, w: QTensor, bias: torch.Tensor | None, a: Conv2dArgs) -> torch.Tensor:
    wd = a.layout.unflatten(w.dequantize(torch.float64))
    xd = x.to(torch.float64)
    pt, pb, pl, pr = a.padding
    if (pt, pl) != (pb, pr):  # asymmetric ('same' with an even dilated kernel): pad explicitly
        xd, pad = F.pad(xd, (pl, pr, pt, pb)), (0, 0)
    else:
        pad = (pt, pl)
    y = F.conv2d(xd, wd, None if bias is None else bias.to(torch.float64), a.stride, pad, a.dilation, a.groups)
    return y.to(x.dtype).contiguous()


@dataclasses.dataclass(frozen=True)
class Conv2dConfig:
    """Tiles of the Triton path: ``depthwise`` (the per-channel kernel: ``block_m`` pixels x
    ``block_n`` channels) or the implicit GEMM (``block_m`` pixels x ``block_n`` output channels,
    ``block_k`` reduction elements per step)."""

    depthwise: bool
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 2


def conv2d_config(a: Conv2dArgs, fmt: Format) -> Conv2dConfig:
    """The kernel and tiles for a call: the per-channel kernel when ``C_in/groups == 1``, else the
    implicit GEMM with 64-pixel tiles, up to 64 output channels and 32-element K steps (64 for
    K >= 512)."""
    from ..runtime.launch import next_pow2

    lay = a.layout
    if lay.c_per_group == 1:
        return Conv2dConfig(True, 64, min(32, max(16, next_pow2(lay.c_out))), 0)
    npg = lay.c_out // a.groups
    bk = 64 if lay.k >= 512 else 32
    return Conv2dConfig(False, 64, min(64, max(16, next_pow2(npg))), bk, num_stages=3)


def _triton_run(x: torch.Tensor, w: QTensor, bias: torch.Tensor | None, a: Conv2dArgs, interp: bool,
                config: Conv2dConfig | None = None) -> torch.Tensor:
    """Launch the kernel for a checked call (no device check: the compile cases call it with CPU
    tensors standing in for CUDA ones)."""
    rl, k, format_constexprs, INT_VIEW = _device()
    fmt = w.fmt
    cfg = config or conv2d_config(a, fmt)
    lay = a.layout
    el = fmt.element
    cons = format_constexprs(fmt, bool(el.has_nan or el.has_inf))  # NaN / Inf codes always honoured
    from ..quant import params as _p  # (no Triton import)

    out = _p._empty(a.out_shape, x.dtype, x.device)
    m = a.batch * a.oh * a.ow
    if m == 0 or lay.c_out == 0:
        return out
    data = w.data.contiguous()
    scales = w.scales.contiguous()
    scales = scales.view(INT_VIEW[scales.element_size()])
    scales2 = scales.reshape(-1, scales.shape[-1])
    zp = w.zero_points.contiguous() if fmt.zero_point else scales
    gs = w.global_scale.reshape(1).to(device=x.device, dtype=torch.float32) if fmt.global_scale else scales
    b = bias.contiguous() if bias is not None else scales
    common = dict(BITS=cons["BITS"], IS_FLOAT=cons["IS_FLOAT"], MBITS=cons["MBITS"], SIGNED=cons["SIGNED"],
                  ELEM_C=cons["ELEM_C"], SPECIALS=cons["SPECIALS"], INF_MAG=cons["INF_MAG"],
                  NAN_MAG=cons["NAN_MAG"], SCALE_KIND=cons["SCALE_KIND"], SB=cons["SB"], B=fmt.block_size,
                  BR=fmt.block_rows, HAS_ZP=fmt.zero_point, HAS_GS=fmt.global_scale, HAS_BIAS=bias is not None)
    geo = (a.h, a.w, a.oh, a.ow, *x.stride(), *out.stride(), data.stride(0), scales2.stride(0),
           a.stride[0], a.stride[1], a.padding[0], a.padding[2], a.dilation[0], a.dilation[1])
    if cfg.depthwise:
        rl.launch(k._conv2d_depthwise_kernel, (rl.cdiv(m, cfg.block_m), rl.cdiv(lay.c_out, cfg.block_n)),
                  x, data, scales2, zp, gs, b, out, m, lay.c_out, lay.c_out // a.groups, *geo,
                  KH=lay.kh, KW=lay.kw, **common, BLOCK_M=cfg.block_m, BLOCK_C=cfg.block_n,
                  num_warps=cfg.num_warps)
    else:
        npg = lay.c_out // a.groups
        rl.launch(k._conv2d_igemm_kernel, (rl.cdiv(m, cfg.block_m), rl.cdiv(npg, cfg.block_n), a.groups),
                  x, data, scales2, zp, gs, b, out, m, npg, *geo, CG=lay.c_per_group, KH=lay.kh, KW=lay.kw, HWC=lay.order == "hwc", **common, BLOCK_M=cfg.block_m,
                  BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, INTERP=interp, IEEE=x.dtype == torch.float32,
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


def conv2d_triton(x: torch.Tensor, w: QTensor, bias: torch.Tensor | None = None, stride=1, padding=0,
                  dilation=1, groups: int = 1, *, config: Conv2dConfig | None = None) -> torch.Tensor:
    """The GPU path of :func:`conv2d` (CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``),
    without the custom op; ``config`` overrides :func:`conv2d_config`'s choice."""
    unbatched = isinstance(x, torch.Tensor) and x.dim() == 3
    xb = x.unsqueeze(0) if unbatched else x
    a = _check(xb, w, bias, stride, padding, dilation, groups, "conv2d_triton")
    if xb.dtype not in _X_DTYPES:
        raise TypeError(f"conv2d_triton: x must be float32, float16 or bfloat16, got {xb.dtype}")
    if w.device.type != "cuda" and not target.interpreting():
        raise ValueError(f"conv2d_triton: the weight is on {w.device}; this is the GPU kernel's entry point "
                         "(ms.conv2d takes CPU tensors through the reference; TRITON_INTERPRET=1 emulates the kernel)")
    from ..quant import params as _p  # (no Triton import)

    why = _p.unsupported_reason(w.fmt)
    if why:
        raise NotImplementedError(f"conv2d_triton: {why}")
    y = _triton_run(xb, w, bias, a, target.interpreting(), config)
    return y.squeeze(0) if unbatched else y


# ---- torch.library registration ---------------------------------------------------------------
def _meta(w: QTensor) -> str:
    return json.dumps({"fmt": w.fmt.to_dict(), "shape": list(w.shape), "dtype": str(w.dtype).removeprefix("torch."),
                       "meta": w.meta})


def _rebuild(data, scales, gs, zp, meta: str) -> QTensor:
    d = json.loads(meta)
    return QTensor(data, scales, Format.from_dict(d["fmt"]), torch.Size(d["shape"]), getattr(torch, d["dtype"]),
                   gs, zp, d["meta"])


def _args(x_shape, meta: str, stride, padding, dilation, groups) -> Conv2dArgs:
    d = json.loads(meta)["meta"]["conv2d"]
    lay = ConvLayout(*d["shape"], d["order"])
    return _geometry(tuple(x_shape), lay, tuple(stride), tuple(padding), tuple(dilation), groups)


@torch.library.custom_op("microscale::conv2d", mutates_args=())
def _conv2d_op(x: torch.Tensor, data: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor | None,
               zero_points: torch.Tensor | None, w_meta: str, bias: torch.Tensor | None, stride: list[int],
               padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
    w = _rebuild(data, scales, global_scale, zero_points, w_meta)
    a = _args(x.shape, w_meta, stride, padding, dilation, groups)
    if x.device.type == "cuda":
        return _triton_run(x, w, bias, a, False)
    return _reference_run(x, w, bias, a)


@_conv2d_op.register_fake
def _(x, data, scales, global_scale, zero_points, w_meta, bias, stride, padding, dilation, groups):
    a = _args(x.shape, w_meta, stride, padding, dilation, groups)
    return x.new_empty(a.out_shape)


def conv2d(x: torch.Tensor, w: QTensor, bias: torch.Tensor | None = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> torch.Tensor:
    """``F.conv2d(x, dequantize_conv_weight(w), bias, stride, padding, dilation, groups)`` on a
    block-scaled weight, without materializing the dequantized weight on CUDA.

    Args:
        x: ``[N, C_in, H, W]`` or unbatched ``[C_in, H, W]``; float32, float16 or bfloat16 (CPU:
            float64 too); any strides (NCHW or channels_last).
        w: a conv QTensor ``[C_out, (C_in/groups)*kh*kw]`` from
            :func:`microscale.conv.quantize_conv_weight` (any registry format; layout in its meta).
        bias: optional ``[C_out]`` float tensor (added in float32 on CUDA).
        stride, dilation: int or pair of ints >= 1.
        padding: int or pair of ints >= 0 (zeros), or ``"valid"`` / ``"same"`` (stride 1) as in
            ``F.conv2d``.
        groups: as in ``F.conv2d``; ``C_in = groups * (C_in/groups)`` and ``groups`` divides C_out.

    Returns:
        ``[N, C_out, OH, OW]`` (contiguous) in x's dtype. CUDA: the Triton kernels, float32
        accumulation (float32 x: full-precision products, no TF32); CPU: the float64 reference
        rounded to x's dtype.

    Raises:
        TypeError / ValueError naming the argument: a weight without a conv layout, shapes or
        channel counts that disagree, bad stride / padding / dilation / groups, a bias of the
        wrong shape, tensors on different devices.
    """
    unbatched = isinstance(x, torch.Tensor) and x.dim() == 3
    xb = x.unsqueeze(0) if unbatched else x
    a = _check(xb, w, bias, stride, padding, dilation, groups)
    if xb.is_cuda and xb.dtype not in _X_DTYPES:
        raise TypeError(f"{OP}: x must be float32, float16 or bfloat16 on CUDA, got {xb.dtype}")
    y = torch.ops.microscale.conv2d(xb, w.data, w.scales, w.global_scale, w.zero_points, _meta(w), bias,
                                    list(a.stride), list(a.padding), list(a.dilation), a.groups)
    return y.squeeze(0) if unbatched else y
