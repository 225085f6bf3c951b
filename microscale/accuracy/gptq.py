"""GPTQ for block-scaled formats: quantize a weight column by column and push each
column's error onto the columns not yet quantized, weighted by the inverse Hessian of the
layer's inputs (Frantar et al., GPTQ, 2022), so the layer's *output* error is what is
minimized, not the weight error.

For a Linear ``y = x W^T`` with ``W`` ``[N, K]`` and calibration inputs ``X`` ``[n, K]``,
``H = 2/n X^T X``. Damping: ``H + damp * mean(diag H) * I`` (``damp=0.01`` by default;
raise it when the Cholesky factorization fails), input features never seen (``H_ii = 0``)
get ``H_ii = 1`` and a zero weight column.

Block scales are the format's own (``ms.quantize`` with ``scale_method``: ``"rtn"``, ``"mse"``
or ``"4over6"``), and every column is encoded with round-to-nearest-even under them. With
``static_scales=True`` (the default) all block scales are computed up front from the
*original* weight, as GPTQ's ``static_groups`` does; with ``scale_method="mse"`` each block
keeps the scale code of least squared error on the original weights, among the rtn code and
its neighbours. The error compensation then moves weights within fixed scales. With
``static_scales=False`` a block's scales are computed when the walk reaches its first column,
from the *current* (error-compensated) columns; for formats with power-of-two scales (E8M0)
a compensated block whose maximum crosses a power of two doubles its scale, which is how
GPTQ alone lowered MXFP4's MiniLM embedding cosine from 0.965 (rtn) to 0.82
(docs/accuracy.md). ``act_order=True`` (columns by decreasing ``H_ii``) always uses static
scales (a block's columns are no longer visited together). Two-level formats (NVFP4) keep
the tensor's global scale from the original weight. The result is an ordinary QTensor in the
canonical layout.
"""
from __future__ import annotations

import torch

from ..formats import Format, NonFinite, Overflow, Rounding, get_format, pack_codes
from ..qtensor import QTensor
from .methods import _check

__all__ = ["gptq_quantize", "hessian"]


def hessian(x: torch.Tensor) -> torch.Tensor:
    """``2/n X^T X`` (float64) of inputs ``x`` ``[..., K]`` (all leading dims are samples)."""
    x2 = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
    return (2.0 / max(x2.shape[0], 1)) * (x2.T @ x2)


def _block_scales(w: torch.Tensor, fmt: Format, method: str, gscale, nblk: int = 1
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw scales and multipliers of ``w`` ``[N, nblk * B]``: ``[N]`` each for one block,
    ``[N, nblk]`` for several."""
    from ..ops import quantize

    kw = {"global_scale": gscale} if gscale is not None else {}
    q = quantize(w.contiguous(), fmt, method=method, **kw)
    raw = q.scales.reshape(-1) if nblk == 1 else q.scales.reshape(w.shape[0], nblk)
    mult = fmt.scale.decode(raw)
    if gscale is not None:
        mult = mult * gscale
    return raw, mult


def _encode_col(w: torch.Tensor, mult: torch.Tensor, fmt: Format) -> tuple[torch.Tensor, torch.Tensor]:
    safe = torch.where(mult > 0, mult, torch.ones_like(mult))
    codes = fmt.element.encode(w / safe, Rounding.NEAREST_EVEN, Overflow.SATURATE, NonFinite.PROPAGATE)
    return codes, fmt.element.decode(codes) * mult


def gptq_quantize(weight: torch.Tensor, H: torch.Tensor, fmt: str | Format, *, damp: float = 0.01,
                  act_order: bool = False, scale_method: str = "rtn", lazy_block: int = 128,
                  static_scales: bool = True) -> QTensor:
    """GPTQ-quantize ``weight`` ``[N, K]`` given the input Hessian ``H`` ``[K, K]`` (see the
    module doc); 1-D block, non-affine formats. A ``K`` that is not a multiple of the block
    size is padded with zero columns, as ``ms.quantize(..., pad=True)`` pads. ``lazy_block``
    columns are updated together (rounded up to whole blocks).

    Args:
        damp: added to the diagonal as ``damp * mean(diag H)``; with few calibration tokens
            (fewer than input features, so ``H`` is singular) ``0.1`` generalized better on
            MiniLM than the default ``0.01``.
        act_order: visit columns by decreasing ``H_ii`` (implies static scales).
        scale_method: the block-scale rule, ``"rtn"``, ``"mse"`` or ``"4over6"``.
        static_scales: compute every block scale from the original weight before the walk
            (default); ``False``: from the error-compensated columns when the walk reaches
            the block.
    """
    fmt = get_format(fmt)
    op = "gptq"
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.dtype.is_floating_point:
        raise ValueError(f"{op}: weight must be a 2-D floating tensor [N, K], got "
                         f"{getattr(weight, 'shape', type(weight))}")
    n, k = weight.shape
    if not isinstance(H, torch.Tensor) or tuple(H.shape) != (k, k):
        raise ValueError(f"{op}: H must be [K, K] = [{k}, {k}], got {tuple(getattr(H, 'shape', ()))}")
    _check(fmt, "gptq")
    b = fmt.block_size
    if not isinstance(static_scales, bool) or not isinstance(act_order, bool):
        raise TypeError(f"{op}: static_scales and act_order must be bool, got {static_scales!r}, {act_order!r}")
    if not (isinstance(damp, (int, float)) and damp >= 0):
        raise ValueError(f"{op}: damp={damp!r} must be a float >= 0")
    dev = weight.device
    W = weight.detach().to(torch.float32).clone()
    H = H.detach().to(device=dev, dtype=torch.float64).clone()
    if k % b:  # zero columns up to a whole block: dead inputs, stored as the canonical padding
        kp = -(-k // b) * b
        W = torch.nn.functional.pad(W, (0, kp - k))
        H = torch.nn.functional.pad(H, (0, kp - k, 0, kp - k))
        k = kp
    gscale = None
    if fmt.global_scale:
        from ..ops import quantize

        gscale = quantize(weight.detach().float(), fmt, pad=True).global_scale  # the tensor's own, from the original
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    perm = torch.argsort(torch.diag(H), descending=True) if act_order else torch.arange(k, device=dev)
    nblk = k // b
    raws = [None] * nblk
    mults = torch.zeros((n, nblk), dtype=torch.float32, device=dev)
    static = act_order or static_scales
    if static:  # block scales from the original weight, all at once
        raw_all, mult_all = _block_scales(W, fmt, scale_method, gscale, nblk)
        raws = [raw_all[:, j] for j in range(nblk)]
        mults = mult_all.to(torch.float32).contiguous()
    Wp = W[:, perm]
    Hp = H[perm][:, perm]
    Hp += damp * torch.mean(torch.diag(Hp)) * torch.eye(k, dtype=torch.float64, device=dev)
    L = torch.linalg.cholesky(Hp)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(L), upper=True).to(torch.float32)
    codes = torch.zeros((n, k), dtype=torch.uint8, device=dev)
    step = max(b, -(-lazy_block // b) * b)
    for i1 in range(0, k, step):
        i2 = min(i1 + step, k)
        W1 = Wp[:, i1:i2].clone()
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = int(perm[i1 + i])
            j = col // b
            if not static and col % b == 0:  # (the block lies inside W1: its columns are up to date)
                raws[j], mults[:, j] = _block_scales(W1[:, i:i + b], fmt, scale_method, gscale)
            w = W1[:, i]
            c, q = _encode_col(w, mults[:, j], fmt)
            codes[:, col] = c
            err = (w - q) / Hinv1[i, i]
            W1[:, i:] -= err.unsqueeze(1) * Hinv1[i, i:].unsqueeze(0)
            Err1[:, i] = err
        Wp[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]
    scales = torch.stack([r.view(torch.uint8) if r.dtype == torch.float8_e4m3fn else r for r in raws], dim=1)
    if raws[0].dtype == torch.float8_e4m3fn:
        scales = scales.view(torch.float8_e4m3fn)
    meta = {"two_level": fmt.two_level.value} if fmt.global_scale else {}
    return QTensor(pack_codes(codes, fmt.element.bits), scales.contiguous(), fmt, weight.shape, weight.dtype,
                   gscale, None, meta)
