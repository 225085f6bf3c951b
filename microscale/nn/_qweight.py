"""What the quantized conv and embedding modules share: the QTensor's fields as buffers (moved
by ``.to(device)``, never cast by ``.to(dtype)``), and the opt-in choice of the modules
:func:`microscale.nn.quantize_model` quantizes besides ``nn.Linear``."""
from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from .._names import skip_matches
from ..formats import Format, packed_len
from ..qtensor import QTensor

_ROLES = ("data", "scales", "global_scale", "zero_points")
DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64)}

#: ``conv2d=`` / ``embedding=`` of quantize_model: a bool, or a predicate on (qualified name, module)
OptIn = bool | Callable[[str, nn.Module], bool]


class QuantWeightModule(nn.Module):
    """A module whose weight is a 2-D QTensor ``[rows, cols]`` held as buffers ``weight_data``,
    ``weight_scales`` and, when the format has them, ``weight_global_scale`` /
    ``weight_zero_points``; subclasses set ``fmt``, ``weight_dtype``, ``meta`` and the 2-D
    :meth:`weight_shape`."""

    def _init_weight(self, rows: int, cols: int, fmt: Format, device) -> None:
        kp = -(-cols // fmt.block_size) * fmt.block_size
        npad = -(-rows // fmt.block_rows) * fmt.block_rows
        self.register_buffer("weight_data", torch.zeros((npad, packed_len(kp, fmt.element.bits)), dtype=torch.uint8,
                                                        device=device))
        self.register_buffer("weight_scales", torch.zeros((npad // fmt.block_rows, kp // fmt.block_size),
                                                          dtype=fmt.scale.storage, device=device))
        self.register_buffer("weight_global_scale", torch.ones((), dtype=torch.float32, device=device)
                             if fmt.global_scale else None)
        self.register_buffer("weight_zero_points", torch.zeros((npad, kp // fmt.block_size), dtype=torch.uint8,
                                                               device=device) if fmt.zero_point else None)
        self._q = None

    def _set_weight(self, q: QTensor) -> None:
        self.weight_data = q.data
        self.weight_scales = q.scales
        self.weight_global_scale = q.global_scale
        self.weight_zero_points = q.zero_points
        self._q = q

    def weight_shape(self) -> tuple[int, int]:
        raise NotImplementedError

    @property
    def qweight(self) -> QTensor:
        """The weight as a QTensor (the same object while the buffers are unchanged)."""
        key = (self.weight_data.data_ptr(), self.weight_scales.data_ptr(), self.weight_data.device,
               None if self.weight_global_scale is None else self.weight_global_scale.data_ptr())
        if self._q is None or getattr(self, "_qkey", None) != key:
            self._q = QTensor(self.weight_data, self.weight_scales, self.fmt, torch.Size(self.weight_shape()),
                              self.weight_dtype, self.weight_global_scale, self.weight_zero_points, dict(self.meta))
            self._qkey = key
        return self._q

    def _apply(self, fn, recurse=True):
        """``.to(device)`` moves the quantized buffers; ``.to(dtype)`` / ``.half()`` leave their
        storage dtypes alone (it casts float parameters such as a bias; see :meth:`_applied`)."""
        saved = {}
        for r in _ROLES:
            t = getattr(self, "weight_" + r)
            if t is not None:
                moved = fn(t)
                saved[r] = moved if moved.dtype == t.dtype else t.to(moved.device)
                self._buffers["weight_" + r] = None
        try:
            super()._apply(fn, recurse)
        finally:
            for r, t in saved.items():
                self._buffers["weight_" + r] = t
        self._applied(fn)
        self._q = None
        return self

    def _applied(self, fn) -> None:
        """``fn`` (a move or a cast) was applied to the module's tensors."""

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self._q = None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def _chosen(opt: OptIn, name: str, module: nn.Module) -> bool:
    return opt(name, module) if callable(opt) else bool(opt)


def _tied(model: nn.Module, module: nn.Module) -> bool:
    """Whether ``module.weight`` is also a parameter of another module (an LM head tied to it)."""
    w = module.weight
    return any(p is w for m in model.modules() if m is not module for p in m.parameters(recurse=False))


def extra_targets(model: nn.Module, fmt: Format, skip: Iterable[str], conv2d: OptIn, embedding: OptIn,
                  tied_embeddings: bool, quantize_kwargs: dict) -> list[tuple[str, nn.Module]]:
    """The ``nn.Conv2d`` / ``nn.Embedding`` modules of ``model`` that quantize_model's opt-ins
    choose, quantized: ``(qualified name, new module)``, the root as ``""``. An embedding whose
    weight another module shares (tied to an LM head) only with ``tied_embeddings``."""
    if not conv2d and not embedding:
        return []
    from .quant_conv import QuantConv2d
    from .quant_embedding import QuantEmbedding

    skip = list(skip)
    out = []
    for name, m in model.named_modules():
        if skip_matches(name, skip):
            continue
        if type(m) is nn.Conv2d and _chosen(conv2d, name, m):
            out.append((name, QuantConv2d.from_conv(m, fmt, **quantize_kwargs)))
        elif (type(m) is nn.Embedding and _chosen(embedding, name, m)
              and (tied_embeddings or not _tied(model, m))):
            out.append((name, QuantEmbedding.from_embedding(m, fmt, **quantize_kwargs)))
    return out


# ---- checkpoints: quantized_state / load_quantized_state ------------------------------------
def _quant_types():
    from .quant_conv import QuantConv2d
    from .quant_embedding import QuantEmbedding

    return QuantConv2d, QuantEmbedding


def quantized_tensors(model: nn.Module) -> dict[str, QTensor]:
    """``<module>.weight`` -> the QTensor of each QuantConv2d / QuantEmbedding (a conv weight's
    meta records its 4-D shape and K order, ``{"conv2d": {...}}``)."""
    return {(n + "." if n else "") + "weight": m.qweight for n, m in model.named_modules()
            if isinstance(m, _quant_types())}


def slots(model: nn.Module) -> dict[str, str]:
    """``<module>.weight`` -> module name of each ``nn.Conv2d`` / ``nn.Embedding`` (exactly these
    classes: a subclass may compute something else) or QuantConv2d / QuantEmbedding a quantized
    tensor can load into."""
    return {(n + "." if n else "") + "weight": n for n, m in model.named_modules()
            if type(m) in (nn.Conv2d, nn.Embedding) or isinstance(m, _quant_types())}


def _module_device(m: nn.Module) -> torch.device:
    return m.weight_data.device if isinstance(m, QuantWeightModule) else m.weight.device


def plan_load(model: nn.Module, found: dict[str, tuple[str, QTensor]], rest: dict, strict: bool,
              op: str = "load_quantized_state") -> list[tuple[str, Callable[[], nn.Module]]]:
    """Check the quantized conv / embedding weights ``found`` (module name -> (key, QTensor))
    against the model, take conv biases from ``rest``; returns ``(module name, make)`` pairs whose
    ``make()`` builds the QuantConv2d / QuantEmbedding (nothing in the model is changed here). A
    conv's geometry (stride, padding, dilation, groups, padding mode) comes from the model's
    module, its weight's 4-D shape and K order from the QTensor's meta."""
    from ..conv import conv_layout

    QuantConv2d, QuantEmbedding = _quant_types()
    plan = []
    for name, (key, q) in found.items():
        m = model.get_submodule(name)
        dev = _module_device(m)
        if isinstance(m, (nn.Conv2d, QuantConv2d)):
            want = (m.out_channels, m.in_channels // m.groups, *m.kernel_size)
            if "conv2d" not in q.meta:
                raise ValueError(f"{op}: {key!r} (shape {tuple(q.shape)}) is for the conv {name!r} but its meta has "
                                 "no conv2d layout (4-D shape and K order); save it from a QuantConv2d "
                                 "(quantized_state) or quantize it with microscale.conv.quantize_conv_weight")
            lay = conv_layout(q, op, key)
            if lay.shape != want:
                raise ValueError(f"{op}: {key!r} is a conv weight of shape {list(lay.shape)}, the module {name!r} "
                                 f"expects {list(want)} ([C_out, C_in/groups, kh, kw])")
            bias = take_bias(rest, name, m, m.out_channels, strict, op)
            geo = dict(stride=m.stride, padding=m.padding, dilation=m.dilation, groups=m.groups,
                       padding_mode=m.padding_mode)

            def make(q=q, bias=bias, geo=geo, dev=dev):
                dev = q.device if dev.type == "meta" else dev
                return QuantConv2d.from_qtensor(q.to(dev), None if bias is None else bias.to(dev), **geo)
        else:
            want = (m.num_embeddings, m.embedding_dim)
            if tuple(q.shape) != want:
                raise ValueError(f"{op}: {key!r} has shape {tuple(q.shape)}, the embedding {name!r} expects "
                                 f"{want}")
            if getattr(m, "max_norm", None) is not None:
                raise ValueError(f"{op}: the embedding {name!r} has max_norm={m.max_norm}, which renormalizes its "
                                 "table in place; a quantized table cannot")

            def make(q=q, pad=m.padding_idx, dev=dev):
                dev = q.device if dev.type == "meta" else dev
                return QuantEmbedding.from_qtensor(q.to(dev), pad)
        plan.append((name, make))
    return plan


def take_bias(rest: dict, name: str, m: nn.Module, n_out: int, strict: bool, op: str) -> torch.Tensor | None:
    """The bias of module ``name`` for a quantized replacement: popped from ``rest`` (checked against
    ``m`` and its ``n_out`` outputs), else ``m``'s own when not ``strict``; a missing one is an error."""
    bkey = (name + "." if name else "") + "bias"
    bias = rest.pop(bkey, None)
    if bias is not None and (m.bias is None or tuple(bias.shape) != (n_out,)):
        raise ValueError(f"{op}: bias {bkey!r} of shape {tuple(bias.shape)} does not fit {name!r} "
                         f"({'no bias' if m.bias is None else (n_out,)})")
    if bias is None and m.bias is not None:
        if strict:
            raise ValueError(f"{op}: missing [{bkey!r}] (the bias of quantized {name!r}); the model is unchanged")
        bias = m.bias.detach()
    return bias
