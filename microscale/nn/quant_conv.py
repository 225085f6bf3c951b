"""``QuantConv2d``: a Conv2d whose weight is a conv QTensor (:mod:`microscale.conv.layout`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..conv import ConvLayout, conv2d, conv_layout, quantize_conv_weight
from ..formats import Format, get_format
from ..qtensor import QTensor
from ._qweight import DTYPES, QuantWeightModule

__all__ = ["QuantConv2d"]

_PAD_MODES = ("zeros", "reflect", "replicate", "circular")


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(int(i) for i in v)


class QuantConv2d(QuantWeightModule):
    """``F.conv2d(x, dequant(W), b, stride, padding, dilation, groups)`` with ``W`` a conv
    QTensor ``[C_out, (C_in/groups)*kh*kw]`` run by :func:`microscale.conv2d` (the Triton kernels
    on CUDA, the float64 reference elsewhere); ``padding_mode`` as in ``nn.Conv2d``.

    The QTensor's fields are buffers as in :class:`~microscale.nn.QuantLinear`; the format, the
    4-D shape and K order, the convolution's geometry and the QTensor meta travel as extra state.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int], stride=1,
                 padding: int | tuple[int, int] | str = 0, dilation=1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", fmt: str | Format = "nvfp4", order: str = "hwc", device=None,
                 dtype: torch.dtype = torch.float32, meta: dict | None = None):
        super().__init__()
        kh, kw = _pair(kernel_size)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"QuantConv2d: in_channels={in_channels} and out_channels={out_channels} must be "
                             f"multiples of groups={groups}")
        if padding_mode not in _PAD_MODES:
            raise ValueError(f"QuantConv2d: padding_mode={padding_mode!r} must be one of {_PAD_MODES}")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = (kh, kw)
        self.stride, self.dilation, self.groups = _pair(stride), _pair(dilation), int(groups)
        self.padding = padding if isinstance(padding, str) else _pair(padding)
        self.padding_mode = padding_mode
        self.fmt = get_format(fmt)
        self.weight_dtype = dtype
        self.layout = ConvLayout(self.out_channels, self.in_channels // self.groups, kh, kw, order)
        self.meta = {**(meta or {}), "conv2d": self.layout.to_meta()}
        self._init_weight(self.layout.c_out, self.layout.k, self.fmt, device)
        self.bias = nn.Parameter(torch.zeros(out_channels, dtype=dtype, device=device)) if bias else None

    def weight_shape(self) -> tuple[int, int]:
        return (self.layout.c_out, self.layout.k)

    # ---- construction ----------------------------------------------------------------
    @classmethod
    def from_conv(cls, conv: nn.Conv2d, fmt: str | Format = "nvfp4", *, order: str = "hwc",
                  **quantize_kwargs) -> "QuantConv2d":
        """Quantize ``conv.weight`` (:func:`microscale.conv.quantize_conv_weight`; K padded to a
        whole block) and copy the geometry and bias."""
        q = quantize_conv_weight(conv.weight.detach(), fmt, order=order, **quantize_kwargs)
        return cls.from_qtensor(q, None if conv.bias is None else conv.bias.detach(), stride=conv.stride,
                                padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                                padding_mode=conv.padding_mode)

    @classmethod
    def from_qtensor(cls, q: QTensor, bias: torch.Tensor | None = None, *, stride=1, padding=0, dilation=1,
                     groups: int = 1, padding_mode: str = "zeros") -> "QuantConv2d":
        """A module holding ``q`` (a conv QTensor) and ``bias``."""
        lay = conv_layout(q, "QuantConv2d", "q")
        m = cls(lay.c_per_group * groups, lay.c_out, (lay.kh, lay.kw), stride, padding, dilation, groups,
                bias is not None, padding_mode, q.fmt, lay.order, device="meta", dtype=q.dtype, meta=q.meta)
        m._set_weight(q)
        m.bias = None if bias is None else nn.Parameter(bias.clone(), requires_grad=False)
        return m

    # ---- forward -----------------------------------------------------------------------
    def _explicit_padding(self) -> tuple[int, int, int, int]:
        """(left, right, top, bottom) for F.pad (non-zero padding modes), as nn.Conv2d pads."""
        if self.padding == "valid":
            return (0, 0, 0, 0)
        if self.padding == "same":
            out = []
            for d, k in ((self.dilation[1], self.kernel_size[1]), (self.dilation[0], self.kernel_size[0])):
                total = d * (k - 1)
                out += [total // 2, total - total // 2]
            return tuple(out)
        ph, pw = self.padding
        return (pw, pw, ph, ph)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        padding = self.padding
        if self.padding_mode != "zeros":
            x = F.pad(x, self._explicit_padding(), mode=self.padding_mode)
            padding = 0
        bias = None if self.bias is None else self.bias.to(x.device)
        return conv2d(x, self.qweight, bias, self.stride, padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
             f"padding={self.padding}")
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s + f", bias={self.bias is not None}, fmt={self.fmt.name}, order={self.layout.order}"

    # ---- state dict --------------------------------------------------------------------
    def _geometry(self) -> dict:
        return {"in_channels": self.in_channels, "out_channels": self.out_channels,
                "kernel_size": list(self.kernel_size), "stride": list(self.stride),
                "padding": self.padding if isinstance(self.padding, str) else list(self.padding),
                "dilation": list(self.dilation), "groups": self.groups, "padding_mode": self.padding_mode,
                "order": self.layout.order}

    def get_extra_state(self) -> dict:
        return {"format": self.fmt.to_dict(), **self._geometry(),
                "dtype": str(self.weight_dtype).removeprefix("torch."), "meta": dict(self.meta)}

    def set_extra_state(self, state: dict) -> None:
        fmt = Format.from_dict(state["format"])
        theirs = {k: state.get(k) for k in self._geometry()}
        if fmt != self.fmt or theirs != self._geometry():
            raise ValueError(f"QuantConv2d: state is {fmt.name} {theirs} but this module is {self.fmt.name} "
                             f"{self._geometry()}; build the module the same way (quantize_model) before "
                             "load_state_dict")
        self.weight_dtype = DTYPES[state["dtype"]]
        self.meta = {**state.get("meta", {}), "conv2d": self.layout.to_meta()}
        self._q = None
