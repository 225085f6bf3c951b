"""Layer 2: the quantize options, checked and resolved once.

Every quantizer (the reference, the Triton kernel, ``quantize_for_gemm``) takes the same options;
:meth:`QuantizeOptions.resolve` turns the user's arguments into one validated record, and the
quantizers also accept that record in place of the format (``reference.quantize(x, opts)``), so a
call that goes through :func:`microscale.quantize` resolves its options once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .formats import Format, NonFinite, Overflow, Rounding, ScaleRule, TwoLevel, get_format
from .formats.elements import _enum
from .formats.format import check_int

__all__ = ["QuantizeOptions", "resolve_format"]


def resolve_format(fmt: str | Format, block_size: int | None = None, scale_rule: str | ScaleRule | None = None,
                   convention: str | TwoLevel | None = None) -> Format:
    """Resolve a name and per-call overrides into one validated :class:`Format`."""
    f = get_format(fmt)
    changes = {}
    if block_size is not None:
        block_size = check_int(block_size, "block_size", "quantize")
        if block_size != f.block_size:
            changes["block_size"] = block_size
    if scale_rule is not None:
        rule = _enum(ScaleRule, scale_rule, "scale_rule")
        if rule.power_of_two != f.scale.power_of_two or (rule is ScaleRule.MINMAX) != f.zero_point:
            raise ValueError(f"scale_rule={rule.value!r} does not apply to format {f.name!r} "
                             f"({f.scale.name} scales, default rule {f.scale_rule.value!r})")
        changes["scale_rule"] = rule
    if convention is not None:
        conv = _enum(TwoLevel, convention, "convention")
        if not f.global_scale:
            raise ValueError(f"convention={conv.value!r} applies only to two-level formats, not {f.name!r}")
        changes["two_level"] = conv
    return f.replace(**changes) if changes else f


def _check_global_scale(g: object, fmt: Format, op: str) -> None:
    if g is None:
        return
    if not fmt.global_scale:
        raise ValueError(f"{op}: global_scale applies only to two-level formats, not {fmt.name!r}")
    if isinstance(g, bool) or not isinstance(g, (int, float, torch.Tensor)) or (
            isinstance(g, torch.Tensor) and (g.numel() != 1 or not g.dtype.is_floating_point)):
        raise TypeError(f"{op}: global_scale must be a float or a one-value float tensor, got {g!r}")
    if isinstance(g, torch.Tensor) and g.is_cuda:
        return  # (its value stays on the device: no host sync to check it)
    v = float(g)
    if not (0 < v < float("inf")):
        raise ValueError(f"{op}: global_scale={v} must be finite and > 0")


@dataclass(frozen=True)
class QuantizeOptions:
    """The options of one quantize call, resolved: see :func:`microscale.quantize` for each.

    Attributes:
        fmt: the format with the call's ``block_size`` / ``scale_rule`` / ``convention`` applied.
        rounding, overflow, nonfinite: the policies, as enums.
        global_scale: two-level formats' per-tensor decode scale (a float or a one-value float
            tensor, checked finite and > 0 unless it lives on a GPU), or None to compute it.
        pad: zero-pad K (and the rows of 2-D blocks) to whole blocks.
        generator: seeds stochastic rounding.
    """

    fmt: Format
    rounding: Rounding = Rounding.NEAREST_EVEN
    overflow: Overflow = Overflow.SATURATE
    nonfinite: NonFinite = NonFinite.PROPAGATE
    global_scale: float | torch.Tensor | None = None
    pad: bool = False
    generator: torch.Generator | None = None

    @classmethod
    def resolve(cls, fmt: str | Format | QuantizeOptions, *, scale_rule: str | ScaleRule | None = None,
                block_size: int | None = None, rounding: str | Rounding = Rounding.NEAREST_EVEN,
                overflow: str | Overflow = Overflow.SATURATE, nonfinite: str | NonFinite = NonFinite.PROPAGATE,
                global_scale: float | torch.Tensor | None = None, convention: str | TwoLevel | None = None,
                pad: bool = False, generator: torch.Generator | None = None,
                op: str = "quantize") -> QuantizeOptions:
        """Check and resolve a quantize call's arguments (``op`` names the caller in errors). A
        :class:`QuantizeOptions` passed as ``fmt`` is returned as it is; other options may then
        not be given."""
        if isinstance(fmt, QuantizeOptions):
            given = {k: v for k, v in (("scale_rule", scale_rule), ("block_size", block_size),
                                      ("global_scale", global_scale), ("convention", convention),
                                      ("generator", generator)) if v is not None}
            if pad is not False or rounding != Rounding.NEAREST_EVEN or overflow != Overflow.SATURATE \
                    or nonfinite != NonFinite.PROPAGATE or given:
                raise TypeError(f"{op}: options are given both as QuantizeOptions and as keyword arguments "
                                f"({', '.join(given) or 'pad/rounding/overflow/nonfinite'})")
            return fmt
        if not isinstance(pad, bool):
            raise TypeError(f"{op}: pad must be a bool, got {pad!r} ({type(pad).__name__})")
        f = resolve_format(fmt, block_size, scale_rule, convention)
        _check_global_scale(global_scale, f, op)
        return cls(f, _enum(Rounding, rounding, "rounding"), _enum(Overflow, overflow, "overflow"),
                   _enum(NonFinite, nonfinite, "nonfinite"), global_scale, pad, generator)
