"""``QuantLinear``: a Linear whose weight is a :class:`~microscale.QTensor`."""
from __future__ import annotations

from typing import Iterable

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .._names import skip_matches
from ..formats import Format, get_format
from ..qtensor import QTensor
from . import experts as _experts
from ._qweight import DTYPES as _DTYPES, QuantWeightModule

__all__ = ["QuantLinear", "quantize_model"]


def _kernel_linear():
    """``microscale.linear.linear`` if that module imports, else None (checked once)."""
    global _LINEAR
    if _LINEAR is _UNSET:
        try:
            from ..linear import linear as fn
        except Exception:  # not landed yet, or its import failed: use the dequantize path
            fn = None
        _LINEAR = fn
    return _LINEAR


_UNSET = object()
_LINEAR = _UNSET


class QuantLinear(QuantWeightModule):
    """``y = x @ dequant(W)^T + b`` with ``W`` stored as a QTensor ``[out, in]``.

    The QTensor's fields are buffers (``weight_data``, ``weight_scales`` and, when the
    format has them, ``weight_global_scale`` / ``weight_zero_points``), so ``.to()``,
    ``state_dict`` and ``load_state_dict`` work as for any module; the format, shape,
    dtype and QTensor meta travel as the module's extra state (a JSON-able dict).

    ``forward`` calls :func:`microscale.linear.linear` (the fused kernel on CUDA, its
    reference elsewhere) for bf16/fp16 inputs and weights it accepts; otherwise (float32
    input, padded K, or linear.py unavailable) ``F.linear(x, W.dequantize(x.dtype), b)``.

    ``act_format`` (a preset name or Format): the input is quantized on the fly to it and both
    operands run through :func:`microscale.scaled_mm` (``linear(x, W, b, act_format=...)``:
    dynamic block scales; for NVFP4 the static ``input_scale`` the weight carries, as a ModelOpt
    W4A4 checkpoint does). It travels in the extra state, as does ``fast_accum`` (scaled_mm's opt-in
    to fp8 tensor cores with Hopper's accumulation for fp8-code pairs such as fp8 block-128 W8A8).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, fmt: str | Format = "nvfp4",
                 device=None, dtype: torch.dtype = torch.float32, meta: dict | None = None,
                 act_format: str | Format | None = None, fast_accum: bool = False):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.fmt = get_format(fmt)
        self.act_format = None if act_format is None else get_format(act_format)
        if fast_accum and self.act_format is None:
            raise ValueError("QuantLinear: fast_accum=True needs act_format (it is scaled_mm's allowance)")
        self.fast_accum = bool(fast_accum)
        self.weight_dtype = dtype
        self.meta = dict(meta or {})
        self._init_weight(self.out_features, self.in_features, self.fmt, device)
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None
        self._q = None

    # ---- construction ----------------------------------------------------------------
    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str | Format = "nvfp4", act_format: str | Format | None = None,
                    fast_accum: bool = False, **quantize_kwargs) -> "QuantLinear":
        """Quantize ``linear.weight`` (K padded to a whole block when needed)."""
        from ..ops import quantize

        w = linear.weight.detach()
        q = quantize(w, fmt, pad=True, **quantize_kwargs)
        return cls.from_qtensor(q, None if linear.bias is None else linear.bias.detach(), act_format, fast_accum)

    @classmethod
    def from_qtensor(cls, q: QTensor, bias: torch.Tensor | None = None,
                     act_format: str | Format | None = None, fast_accum: bool = False) -> "QuantLinear":
        if len(q.shape) != 2:
            raise ValueError(f"QuantLinear: weight must be 2-D [out, in], got shape {tuple(q.shape)}")
        m = cls(q.shape[1], q.shape[0], bias is not None, q.fmt, device="meta", dtype=q.dtype, meta=q.meta,
                act_format=act_format, fast_accum=fast_accum)
        m.bias = None if bias is None else nn.Parameter(bias.clone(), requires_grad=False)
        m._set_weight(q)
        return m

    # ---- the weight ------------------------------------------------------------------
    def weight_shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.qweight
        if self.act_format is not None:  # both operands quantized
            from ..linear import linear

            return linear(x, q, self.bias, act_format=self.act_format, fast_accum=self.fast_accum)
        fn = _kernel_linear()
        if (fn is not None and x.dtype in (torch.bfloat16, torch.float16)
                and tuple(q.padded_shape) == tuple(q.shape)):
            return fn(x, q, self.bias)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, q.dequantize(x.dtype), bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"fmt={self.fmt.name}" + ("" if self.act_format is None else f", act_format={self.act_format.name}")
                + (", fast_accum=True" if self.fast_accum else ""))

    # ---- state dict --------------------------------------------------------------------
    def get_extra_state(self) -> dict:
        return {"format": self.fmt.to_dict(), "in_features": self.in_features, "out_features": self.out_features,
                "dtype": str(self.weight_dtype).removeprefix("torch."), "meta": dict(self.meta),
                "act_format": None if self.act_format is None else self.act_format.to_dict(),
                "fast_accum": self.fast_accum}

    def set_extra_state(self, state: dict) -> None:
        fmt = Format.from_dict(state["format"])
        if fmt != self.fmt or (state["in_features"], state["out_features"]) != (self.in_features, self.out_features):
            raise ValueError(f"QuantLinear: state is {fmt.name} [{state['out_features']}, {state['in_features']}] but "
                             f"this module is {self.fmt.name} [{self.out_features}, {self.in_features}]; build the "
                             "module with the same format (quantize_model) before load_state_dict")
        self.weight_dtype = _DTYPES[state["dtype"]]
        self.meta = dict(state.get("meta", {}))
        if "act_format" in state:
            self.act_format = None if state["act_format"] is None else Format.from_dict(state["act_format"])
        self.fast_accum = bool(state.get("fast_accum", False)) and self.act_format is not None
        self._q = None


#: Options that only the calibrated quantizer (microscale.accuracy.quantize_model) takes.
_ACCURACY_OPTIONS = frozenset({"calibration", "rotate", "rotate_block", "scale_method", "act_order", "damp"})
_ACCURACY_OPTIONS |= {"static_scales"}


def quantize_model(model: nn.Module, fmt: str | Format = "nvfp4", *, skip: Iterable[str] = (),
                   inplace: bool = True, method: str = "rtn", experts: bool = True,
                   act_format: str | Format | None = None, fast_accum: bool = False, conv2d=False, embedding=False,
                   tied_embeddings: bool = False, fuse: bool = False,
                   **quantize_kwargs) -> nn.Module:
    """Replace every ``nn.Linear`` in ``model`` by a :class:`QuantLinear` in ``fmt``, and (``experts``)
    every MoE experts module holding 3-D ``gate_up_proj``/``down_proj`` parameters (transformers'
    ``GptOssExperts``, ``Qwen3MoeExperts``, ``MixtralExperts``, ...) by a
    :class:`~microscale.nn.experts.QuantExperts` run by :func:`microscale.moe_experts`, with the
    model's experts implementation set to ``"microscale"`` (transformers' ``ExpertsInterface``).
    Experts it cannot run (another activation, no gate, K or N not whole blocks) stay float, named
    in a warning. When asked, ``nn.Conv2d`` / ``nn.Embedding`` become ``QuantConv2d`` /
    ``QuantEmbedding``.

    Args:
        model: any module (HF transformers models included).
        fmt: preset name or Format.
        skip: patterns on the module's qualified name, in the dialect checkpoint conversion
            uses too (:mod:`microscale._names`): ``"lm_head"`` matches ``lm_head`` and
            ``model.lm_head``, ``"*attention*"`` any attention Linear, ``"*experts"`` every experts module.
        inplace: modify ``model`` (default) or a deep copy.
        method: ``"rtn"`` (round-to-nearest, the default), ``"mse"``, ``"4over6"`` or
            ``"gptq"``; with ``method`` other than ``"rtn"`` or any of ``calibration=``,
            ``rotate="hadamard"``, ``rotate_block=``, ``scale_method=``, ``act_order=``,
            ``damp=``, the call goes to :func:`microscale.accuracy.quantize_model` (GPTQ with
            calibration data, block Hadamard rotation; docs/accuracy.md), which quantizes
            ``nn.Linear`` layers only (experts stay float there).
        experts: also quantize MoE experts (default; round-to-nearest path).
        act_format: quantize each layer's input on the fly to this format too (see
            :class:`QuantLinear`); None (default): weight-only.
        fast_accum: with ``act_format``, let each layer's :func:`microscale.scaled_mm` take fp8 tensor
            cores with Hopper's accumulation where the pair allows (fp8 block-128 W8A8; about 1e-4
            relative from the exact result; docs/scaled-mm.md). Off by default.
        conv2d: also quantize ``nn.Conv2d`` layers (True, or a predicate ``(name, module) -> bool``);
            off by default: a vision stem / patch embedding is often the most sensitive layer.
        embedding: also quantize ``nn.Embedding`` tables (True or a predicate, as ``conv2d``); one
            whose weight another module shares (tied to ``lm_head``) only with ``tied_embeddings``.
        fuse: then fuse each transformers decoder layer's RMSNorms into its projections
            (:func:`microscale.nn.fuse.fuse_projections`: norm + q/k/v and norm + gate/up as one
            ``rmsnorm_linear`` each); off by default.
        **quantize_kwargs: passed to :func:`microscale.quantize` (``scale_rule``,
            ``block_size``, ``convention``, ...).

    Returns:
        The model, its Linear layers (and experts) replaced (on their original device). Every
        layer is quantized before any is replaced, so on error the model is unchanged.
    """
    import copy

    if fast_accum and act_format is None:
        raise ValueError("quantize_model: fast_accum=True needs act_format (it is scaled_mm's allowance for layers "
                         "whose activations are quantized)")
    if method != "rtn" or _ACCURACY_OPTIONS & set(quantize_kwargs):
        from ..accuracy.model import quantize_model as calibrated  # (same layer; loaded on use)

        asked = {k: v for k, v in (("act_format", act_format), ("fast_accum", fast_accum), ("conv2d", conv2d),
                                   ("embedding", embedding)) if v}
        if asked:
            raise ValueError(f"quantize_model(method={method!r}, {', '.join(f'{k}={v!r}' for k, v in asked.items())}): "
                             "the calibrated quantizer makes weight-only Linear layers; use method='rtn' for these")
        moe = [n for n, m in model.named_modules() if n and _experts.is_experts_module(m) and not skip_matches(n, skip)]
        if experts and moe:
            warnings.warn(f"quantize_model(method={method!r}, ...): the calibrated quantizer covers nn.Linear only; "
                          f"experts left in float: {', '.join(moe)} (quantize them with method='rtn')", stacklevel=2)
        out = calibrated(model, fmt, method=method, skip=skip, inplace=inplace, **quantize_kwargs)
        return _fused(out) if fuse else out
    fmt = get_format(fmt)
    skip = list(skip)
    if not inplace:
        model = copy.deepcopy(model)
    targets = [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear and n and not skip_matches(n, skip)]
    if type(model) is nn.Linear and not skip_matches("", skip):
        return QuantLinear.from_linear(model, fmt, act_format, fast_accum, **quantize_kwargs)
    new = [(name, QuantLinear.from_linear(lin, fmt, act_format, fast_accum, **quantize_kwargs)) for name, lin in targets]
    from ._qweight import extra_targets  # the conv2d / embedding opt-ins

    new += extra_targets(model, fmt, skip, conv2d, embedding, tied_embeddings, quantize_kwargs)
    if new and new[-1][0] == "":  # the model itself is a Conv2d / Embedding
        return new[-1][1]
    moe = _experts.quantize_experts(model, fmt, lambda n: skip_matches(n, skip), quantize_kwargs) if experts else []
    for name, q in new:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, q)
    for name, q in moe:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, q)
    _experts.use_microscale(q for _, q in moe)
    return _fused(model) if fuse else model


def _fused(model: nn.Module) -> nn.Module:
    from .fuse import fuse_projections  # (imports this module)

    return fuse_projections(model)


def quantized_state(model: nn.Module) -> dict:
    """The model's tensors for a checkpoint: ``<module>.weight`` is the QTensor of each
    QuantLinear, ``<module>.gate_up_proj`` / ``<module>.down_proj`` those (``[E, out, in]``) of each
    QuantExperts, ``<module>.weight`` that of each QuantConv2d / QuantEmbedding (a conv weight's meta
    holds its 4-D shape and K order), everything else as in ``state_dict`` (pass to
    ``microscale.io.save``)."""
    out: dict = {}
    qnames = {n for n, m in model.named_modules() if isinstance(m, (QuantLinear, _experts.QuantExperts))}
    for n, m in model.named_modules():
        if isinstance(m, QuantLinear):
            out[(n + "." if n else "") + "weight"] = m.qweight
    out.update(_experts.quantized_tensors(model))
    from . import _qweight  # QuantConv2d / QuantEmbedding weights

    xq = _qweight.quantized_tensors(model)
    out.update(xq)
    qnames |= {k.rpartition(".")[0] for k in xq}
    for k, v in model.state_dict().items():
        mod, _, leaf = k.rpartition(".")
        if mod in qnames and leaf not in ("bias", "gate_up_proj_bias", "down_proj_bias"):
            continue
        if isinstance(v, torch.Tensor):
            out[k] = v
    return out


def _nonpersistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Buffers a module registered with ``persistent=False`` (e.g. BERT's ``position_ids``)."""
    out = {}
    for n, m in model.named_modules():
        for b in getattr(m, "_non_persistent_buffers_set", ()):
            t = m._buffers.get(b)
            if t is not None:
                out[(n + "." if n else "") + b] = t
    return out


def _find_prefix(qkeys: list[str], wkeys: set[str]) -> tuple[str, str] | None:
    """``(mode, prefix)`` that maps every quantized key onto a Linear weight key: ``("add", p)``
    when the model's names are ``p + key`` (e.g. a SentenceTransformer's ``0.auto_model.``),
    ``("strip", p)`` when the keys are ``p + name``; None when none or several fit."""
    if all(k in wkeys for k in qkeys):
        return ("add", "")
    k0 = qkeys[0]
    cands = {("add", w[: -len(k0)]) for w in wkeys if w.endswith("." + k0)}
    cands |= {("strip", k0[: -len(w)]) for w in wkeys if k0.endswith("." + w)}
    fits = [c for c in cands if all(_mapped(k, c) in wkeys for k in qkeys)]
    return fits[0] if len(fits) == 1 else None


def _mapped(key: str, how: tuple[str, str]) -> str | None:
    mode, p = how
    if mode == "add":
        return p + key
    return key[len(p):] if key.startswith(p) else None


def load_quantized_state(model: nn.Module, tensors: dict, strict: bool = True, fast_accum: bool = False) -> nn.Module:
    """Load ``tensors`` (e.g. ``microscale.io.load(path)``) into ``model``: every
    ``nn.Linear``/``QuantLinear`` whose ``<name>.weight`` is a QTensor becomes a
    QuantLinear holding it, every MoE experts module (transformers' 3-D ``gate_up_proj`` /
    ``down_proj``, or a QuantExperts) whose ``<name>.gate_up_proj`` and ``<name>.down_proj`` are
    QTensors ``[E, out, in]`` a QuantExperts holding them (a gpt-oss MXFP4 checkpoint's
    ``*_blocks``/``*_scales`` read by ``microscale.io.load`` are such QTensors: the experts are
    never decoded), every ``nn.Conv2d`` / ``nn.Embedding`` whose ``<name>.weight`` is a QTensor a
    QuantConv2d (geometry from the module, 4-D shape and K order from the QTensor's conv2d meta) /
    QuantEmbedding; the remaining tensors go through ``load_state_dict``. A weight whose meta
    names an ``act_format`` (a W4A4 checkpoint, e.g. ModelOpt NVFP4 with ``input_scale``) makes
    its QuantLinear quantize activations to it; ``fast_accum=True`` lets those layers take
    :func:`microscale.scaled_mm`'s fp8 allowance (an fp8 block-128 checkpoint such as DeepSeek-V3's
    runs W8A8 on fp8 tensor cores).

    Everything is checked before the model is touched (names, shapes, missing and
    unexpected tensors), so on error the model is unchanged. Names may differ from the
    model's by one prefix (the checkpoint of a ``SentenceTransformer``'s transformer loaded
    into the ``SentenceTransformer``, whose names start with ``0.auto_model.``, or the
    reverse): the prefix that maps every quantized tensor onto a Linear is found and used.
    Tensors naming a non-persistent buffer (``position_ids``, which transformers recomputes
    and does not save) are checked for shape and otherwise ignored.

    Raises:
        ValueError: a quantized tensor with no Linear (or experts module) of its shape, a
            prefix that fits no or several ways, an experts module with one projection
            quantized, a shape mismatch, or (``strict``) missing/unexpected tensors.
    """
    linears = {n: m for n, m in model.named_modules() if isinstance(m, (nn.Linear, QuantLinear))}
    wkeys = {(n + "." if n else "") + "weight": n for n in linears}
    eslots = _experts.slots(model)
    wkeys.update({k: None for k in eslots})
    from . import _qweight  # nn.Conv2d / nn.Embedding slots

    xslots = {k: n for k, n in _qweight.slots(model).items() if k not in wkeys}
    wkeys.update({k: None for k in xslots})
    xfound: dict = {}  # conv / embedding module name -> (key, QTensor)
    qkeys = [k for k, v in tensors.items() if isinstance(v, QTensor)]
    how = ("add", "")
    if qkeys:
        found = _find_prefix(qkeys, set(wkeys))
        if found is None:
            example = sorted(wkeys)[:2]
            raise ValueError(f"load_quantized_state: no Linear module (nor experts module) for quantized tensors "
                             f"{qkeys[:3]}; the model's weights are named like {example} (no single prefix to add "
                             "or strip maps every quantized tensor onto a Linear or experts weight of the model)")
        how = found
    # ---- plan (no change to the model yet) ----------------------------------------------
    plan = []  # (module name, QTensor, bias or None)
    efound: dict = {}  # experts module name -> proj -> (key, QTensor)
    rest: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for k, v in tensors.items():
        mk = _mapped(k, how)
        if mk is None:
            unexpected.append(k)
        elif not isinstance(v, QTensor):
            rest[mk] = v
    for k in qkeys:
        mk = _mapped(k, how)
        if mk in eslots:
            ename, proj = eslots[mk]
            efound.setdefault(ename, {})[proj] = (k, tensors[k])
            continue
        if mk in xslots:
            xfound[xslots[mk]] = (k, tensors[k])
            continue
        name = wkeys[mk]
        m, q = linears[name], tensors[k]
        if tuple(q.shape) != (m.out_features, m.in_features):
            raise ValueError(f"load_quantized_state: {k!r} has shape {tuple(q.shape)}, the module {name!r} expects "
                             f"{(m.out_features, m.in_features)}")
        bias = _qweight.take_bias(rest, name, m, m.out_features, strict, "load_quantized_state")
        plan.append((name, q, bias))
    eplan = _experts.plan_load(model, efound, rest, strict)
    eplan += _qweight.plan_load(model, xfound, rest, strict)
    replaced = {name for name, _, _ in plan} | {name for name, _ in eplan}
    expected = {}
    for k, t in model.state_dict().items():
        mod = k.rpartition(".")[0]
        if mod in replaced or (k.endswith("_extra_state") and k not in rest):
            continue
        expected[k] = t
    transient = _nonpersistent_buffers(model)
    for k in list(rest):
        if k in expected:
            if isinstance(expected[k], torch.Tensor) and tuple(rest[k].shape) != tuple(expected[k].shape):
                raise ValueError(f"load_quantized_state: {k!r} has shape {tuple(rest[k].shape)}, the model expects "
                                 f"{tuple(expected[k].shape)}")
        elif k in transient:
            if tuple(rest[k].shape) != tuple(transient[k].shape):
                raise ValueError(f"load_quantized_state: buffer {k!r} has shape {tuple(rest[k].shape)}, the model "
                                 f"expects {tuple(transient[k].shape)}")
            del rest[k]  # not part of the state dict: the module recomputes it
        else:
            unexpected.append(k)
            del rest[k]
    missing = [k for k in expected if k not in rest]
    if strict and (unexpected or missing):
        hint = f" (names mapped with {how[0]} prefix {how[1]!r})" if how[1] else ""
        raise ValueError(f"load_quantized_state: missing {missing[:5]}{' ...' if len(missing) > 5 else ''}, unexpected "
                         f"{unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}{hint}; the model is unchanged")
    # ---- apply -----------------------------------------------------------------------------
    undo = []
    try:
        for name, q, bias in plan:
            m = linears[name]
            dev = m.weight_data.device if isinstance(m, QuantLinear) else m.weight.device
            act = q.meta.get("act_format")  # (set by checkpoint import)
            new = QuantLinear.from_qtensor(q.to(dev), bias, act, fast_accum and act is not None)
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            undo.append((parent, child, getattr(parent, child)))
            setattr(parent, child, new)
        enew = [(name, make()) for name, make in eplan]
        for name, new in enew:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            undo.append((parent, child, getattr(parent, child)))
            setattr(parent, child, new)
        model.load_state_dict(rest, strict=False)
        _experts.use_microscale(new for _, new in enew if isinstance(new, _experts.QuantExperts))
    except BaseException:
        for parent, child, old in reversed(undo):
            setattr(parent, child, old)
        raise
    return model
