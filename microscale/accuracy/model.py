"""``quantize_model`` with the accuracy methods: MSE / 4-over-6 scales, GPTQ with
calibration data, and block Hadamard rotation, composable.

Rotation (``rotate="hadamard"``) replaces each quantized Linear by a
:class:`~microscale.accuracy.hadamard.HadamardLinear` whose weight is ``W R`` (rotated
offline, then quantized) and whose input is rotated online, ``x R``; with no quantization
the outputs equal the original ones up to float rounding.

GPTQ (``method="gptq"``) collects each Linear's input Hessian in one pass of the float
model over ``calibration`` (forward hooks; rotated inputs when rotating), then quantizes
every layer with :func:`~microscale.accuracy.gptq.gptq_quantize`. All layers see float
inputs (no layer-by-layer propagation of the quantized model's activations).
"""
from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from .._names import skip_matches
from ..formats import Format, get_format
from ..nn import QuantLinear
from .gptq import gptq_quantize
from .hadamard import HadamardLinear, block_hadamard, check_block

__all__ = ["quantize_model", "run_calibration"]

_MODEL_METHODS = ("rtn", "mse", "4over6", "gptq")


def run_calibration(model: nn.Module, calibration) -> None:
    """Run ``model`` over ``calibration``: a callable ``f(model)``, or an iterable of batches,
    each a dict (``model(**b)``), a tuple/list (``model(*b)``) or one tensor (``model(b)``)."""
    with torch.no_grad():
        if callable(calibration):
            calibration(model)
            return
        if isinstance(calibration, torch.Tensor):
            calibration = [calibration]
        for b in calibration:
            if isinstance(b, dict):
                model(**b)
            elif isinstance(b, (tuple, list)):
                model(*b)
            else:
                model(b)


def _padding_mask(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """A call's 2-D ``attention_mask`` [batch, seq] (integer or bool, 0 at padding): a keyword,
    or a key of a mapping passed first (sentence-transformers' features); None otherwise."""
    m = kwargs.get("attention_mask")
    if m is None and args and isinstance(args[0], Mapping):  # transformers' BatchEncoding is no dict
        m = args[0].get("attention_mask")
    if isinstance(m, torch.Tensor) and m.dim() == 2 and not m.is_floating_point():
        return m
    return None


def _hessians(model: nn.Module, rots: dict[str, int | None], calibration) -> dict[str, torch.Tensor]:
    """``2/n X^T X`` (float64) of each named Linear's input (rotated by ``rots[name]``
    where not None) over the calibration run. Where a call carries a 2-D ``attention_mask``,
    token rows at padding positions are left out (inputs [batch, seq, K] of that call)."""
    acc: dict[str, list] = {n: [None, 0] for n in rots}
    mask: list[torch.Tensor | None] = [None]  # the latest 2-D padding mask seen in the calibration run
    hooks = []

    def see_mask(_mod, args, kwargs):
        m = _padding_mask(args, kwargs)
        if m is not None:
            mask[0] = m

    def hook(name):
        rot = rots[name]

        def f(_mod, args):
            x = args[0].detach()
            m = mask[0]
            if m is not None and x.dim() == 3 and tuple(x.shape[:2]) == tuple(m.shape):
                x = x[m.to(x.device) != 0]  # padding rows are no samples of the layer's input
            if rot:
                x = block_hadamard(x, rot)
            x2 = x.reshape(-1, x.shape[-1]).to(torch.float64)
            a = acc[name]
            a[0] = x2.T @ x2 if a[0] is None else a[0] + x2.T @ x2
            a[1] += x2.shape[0]
        return f

    targets = {model.get_submodule(n) for n in rots}
    for mod in model.modules():  # the mask arrives at whichever module the caller calls
        if mod not in targets:
            hooks.append(mod.register_forward_pre_hook(see_mask, with_kwargs=True))
    for n in rots:
        hooks.append(model.get_submodule(n).register_forward_pre_hook(hook(n)))
    try:
        run_calibration(model, calibration)
    finally:
        for h in hooks:
            h.remove()
    out = {}
    for n, (s, cnt) in acc.items():
        if s is None:
            raise ValueError(f"quantize_model: calibration never ran Linear {n!r}; pass inputs that reach it")
        out[n] = s * (2.0 / cnt)
    return out


def quantize_model(model: nn.Module, fmt: str | Format = "nvfp4", *, method: str = "rtn", calibration=None,
                   rotate: str | None = None, rotate_block: int | None = None, scale_method: str = "rtn",
                   act_order: bool = False, damp: float = 0.01, static_scales: bool = True, skip: Iterable[str] = (),
                   inplace: bool = True,
                   **quantize_kwargs) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` by a :class:`~microscale.nn.QuantLinear` in ``fmt``,
    with the accuracy methods. :func:`microscale.nn.quantize_model` calls this function
    whenever it is given ``method`` other than ``"rtn"``, ``calibration``, ``rotate`` or one
    of the GPTQ options, so either name serves.

    Args:
        method: ``rtn``, ``mse`` or ``4over6`` (per-tensor quantizers, see
            :func:`microscale.quantize`), or ``gptq`` (needs ``calibration``).
        calibration: inputs for GPTQ (see :func:`run_calibration`); only with ``method="gptq"``.
        rotate: ``None`` or ``"hadamard"`` (block Hadamard rotation of each Linear's input
            dimension; layers become :class:`HadamardLinear`). A Linear whose in-features
            the rotation block does not divide is quantized without rotation.
        rotate_block: rotation block size (default: the format's block size; a power of
            two, a multiple of the block size).
        scale_method: the block-scale rule inside GPTQ: ``rtn``, ``mse`` or ``4over6``.
        act_order, damp, static_scales: GPTQ options (:func:`~microscale.accuracy.gptq.gptq_quantize`);
            ``static_scales`` (default True) fixes every block scale from the original
            (rotated) weight before the error compensation.
        skip, inplace: as :func:`microscale.nn.quantize_model`.
        **quantize_kwargs: passed to :func:`microscale.quantize` (rtn/mse/4over6 only).

    Returns:
        The model (a :class:`QuantLinear` or :class:`HadamardLinear` when ``model`` is
        itself an ``nn.Linear``); on error it is left unchanged (every layer is built before
        any is replaced).
    """
    fmt = get_format(fmt)
    if method not in _MODEL_METHODS:
        raise ValueError(f"quantize_model: method={method!r} is not known; expected one of "
                         f"{', '.join(_MODEL_METHODS)}")
    if rotate not in (None, "hadamard"):
        raise ValueError(f"quantize_model: rotate={rotate!r}; expected None or 'hadamard'")
    if method == "gptq" and calibration is None:
        raise ValueError("quantize_model: method='gptq' needs calibration= (inputs to run the model on)")
    if method != "gptq" and calibration is not None:
        raise ValueError(f"quantize_model: calibration= is used by method='gptq' only; method={method!r} "
                         "quantizes each weight on its own")
    if method != "gptq" and (act_order or scale_method != "rtn" or damp != 0.01 or static_scales is not True):
        raise ValueError("quantize_model: act_order, scale_method, damp and static_scales are GPTQ options; "
                         f"method={method!r} (pass method='gptq', or method='mse'/'4over6' for better scales without GPTQ)")
    if method == "gptq" and quantize_kwargs:
        raise ValueError(f"quantize_model: method='gptq' takes no quantize options, got {sorted(quantize_kwargs)}")
    if rotate_block is not None and not rotate:
        raise ValueError("quantize_model: rotate_block= needs rotate='hadamard'")
    rot = None
    if rotate:
        rot = fmt.block_size if rotate_block is None else rotate_block
        check_block(rot, rot, "quantize_model")
        if rot % fmt.block_size:
            raise ValueError(f"quantize_model: rotate_block={rot} must be a multiple of the {fmt.name} block "
                             f"size {fmt.block_size}")
    skip = list(skip)
    if not inplace:
        model = copy.deepcopy(model)
    if type(model) is nn.Linear:
        targets = [] if skip_matches("", skip) else [("", model)]
    else:
        targets = [(n, m) for n, m in model.named_modules()
                   if type(m) is nn.Linear and n and not skip_matches(n, skip)]
    rots = {n: rot if rot and m.in_features % rot == 0 else None for n, m in targets}
    H = _hessians(model, rots, calibration) if method == "gptq" else {}
    new = []
    for name, lin in targets:
        w = lin.weight.detach()
        r = rots[name]
        if r:
            w = block_hadamard(w.double(), r).to(w.dtype)
        if method == "gptq":
            q = gptq_quantize(w, H[name], fmt, damp=damp, act_order=act_order, scale_method=scale_method,
                              static_scales=static_scales)
        else:
            from ..ops import quantize

            q = quantize(w, fmt, method=method, pad=True, **quantize_kwargs)
        m: nn.Module = QuantLinear.from_qtensor(q, None if lin.bias is None else lin.bias.detach())
        if r:
            m = HadamardLinear(m, r)
        new.append((name, m))
    for name, m in new:
        if not name:
            return m
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, m)
    return model
