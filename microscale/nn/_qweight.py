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
