"""``fold_fp8_layers``: a model's MXFP4 / MXFP6 :class:`QuantLinear` layers refolded, losslessly, into fp8
E4M3 weights with float32 scales per 128 elements (:func:`microscale.fold_fp8`) that run with fp8 block-128
activations on Hopper's fp8 tensor cores (``act_format="fp8_e4m3_block128"``, ``fast_accum=True``).

For a checkpoint that ships MXFP4 weights: load it as usual, then fold the layers whose prefill matters. The
folded weights are 8.25 bits an element (MXFP4: 4.25), so at decode they stream 1.94x the bytes
(docs/scaled-mm.md).
"""
from __future__ import annotations

from collections.abc import Iterable

import torch.nn as nn
from tqdm import tqdm

from .._names import skip_matches
from ..quant.fold import FOLD_FORMAT, fold_fp8
from .experts import QuantExperts
from .quant_linear import QuantLinear

__all__ = ["fold_fp8_layers"]


def fold_fp8_layers(model: nn.Module, *, skip: Iterable[str] = (), allow_lossy: bool = False,
                    progress: bool = True, block_rows: int = 1) -> dict[str, str]:
    """Replace, in place, each :class:`QuantLinear` of ``model`` whose weight folds exactly into
    ``fp8_e4m3_block128`` by one holding the folded weight, with ``act_format="fp8_e4m3_block128"`` and
    ``fast_accum=True`` (its bias and the weight's meta kept). With ``block_rows=128``, a weight that folds
    exactly into 128 x 128 blocks (``fp8_e4m3_block128x128``, the faster form at prefill) takes that form,
    the others the per-row one.

    Args:
        model: any module holding QuantLinear layers (from :func:`quantize_model` or a loaded checkpoint).
        skip: patterns on the layer's qualified name, as :func:`quantize_model`'s ``skip``.
        allow_lossy: fold layers with chunks that are not exact too, rounding those chunks (their count is in
            the result); by default such a layer is left as it is.
        progress: a tqdm bar over the layers (shown once a run passes one second).
        block_rows: 1 or 128 (see :func:`microscale.fold_fp8`); 128 falls back to 1 per layer where a block
            would not be exact (before ``allow_lossy`` rounds anything).

    Returns:
        For every QuantLinear (and every MoE experts module, which stays as it is), by qualified name:
        ``"folded"`` (``"folded (128 x 128 blocks)"``), ``"folded, N chunks rounded"``, or why it was left as it
        is (skipped, a format that does not fold, chunks that are not exact, already activation-quantized).
    """
    if block_rows not in (1, 128) or isinstance(block_rows, bool):
        raise ValueError(f"fold_fp8_layers: block_rows={block_rows!r}; expected 1 or 128")
    skip = tuple(skip)
    out: dict[str, str] = {name: "left: MoE experts (the MoE kernels take no fp8 activations)"
                           for name, m in model.named_modules() if isinstance(m, QuantExperts)}
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, QuantLinear)]
    for name, layer in tqdm(layers, desc="fold_fp8", unit="layer", delay=1.0, leave=False, disable=not progress):
        if skip_matches(name, skip):
            out[name] = "skipped"
            continue
        if layer.act_format is not None:
            out[name] = f"left: its input is quantized already ({layer.act_format.name})"
            continue
        f = None
        if block_rows != 1:  # (the 128-row form where every block is exact; else the per-row form below)
            try:
                f = fold_fp8(layer.qweight, name=name, block_rows=block_rows)
            except ValueError:
                pass
        try:  # (a format that does not fold, or chunks that are not exact: left, with fold_fp8's reason)
            f = f if f is not None else fold_fp8(layer.qweight, allow_lossy=allow_lossy, name=name)
        except ValueError as e:
            out[name] = f"left: {e}"
            continue
        new = QuantLinear.from_qtensor(f, None if layer.bias is None else layer.bias.detach(), FOLD_FORMAT, True)
        new.train(layer.training)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
        n = f.meta["inexact_chunks"]
        out[name] = f"folded, {n} chunks rounded" if n else ("folded" if f.fmt.block_rows == 1 else
                                                              "folded (128 x 128 blocks)")
    return out
