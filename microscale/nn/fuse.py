"""Opt-in fusion of transformers decoder layers: each layer's input RMSNorm and its q/k/v
projections run as one :func:`microscale.rmsnorm_linear` over ``[q, k, v]``, its post-attention
RMSNorm and gate/up as one over ``[gate, up]``; the normalized activations never go to memory.

It works by module replacement, never by patching transformers: the norm becomes a
:class:`FusedRMSNorm` that records its weight and epsilon and passes its input through, and
each projection becomes a :class:`FusedQuantLinear` (a :class:`QuantLinear`, the same buffers
and state-dict names). The first projection called with the very tensor object the norm passed
through computes every projection of the group from it and hands the others their results for
that object; a projection called with any other tensor computes as a plain QuantLinear. The
norm passes its input through only while the fusion is sound (group intact, no hooks that would
see the un-normalized tensor, no autograd, not under ``torch.compile``, a dtype and device the
fused op runs); otherwise it normalizes as the original module does, and nothing fuses.
"""
from __future__ import annotations

import warnings
import weakref

import torch
from torch import nn

from ..linear import batched as _batched
from ..linear import norm_linear as _norm_linear
from .quant_linear import QuantLinear

__all__ = ["FusedRMSNorm", "FusedQuantLinear", "fuse_projections", "unfuse_projections"]

#: transformers module -> (class-name prefix, eps attribute, norm weight offset): the decoder layers
#: whose forward sends the norm's output only to the attention / MLP below, which send it only to
#: their projections. Gemma's RMSNorm multiplies by ``1 + weight``.
FAMILIES = {
    "transformers.models.llama.modeling_llama": ("Llama", "variance_epsilon", 0.0),
    "transformers.models.mistral.modeling_mistral": ("Mistral", "variance_epsilon", 0.0),
    "transformers.models.qwen2.modeling_qwen2": ("Qwen2", "variance_epsilon", 0.0),
    "transformers.models.qwen3.modeling_qwen3": ("Qwen3", "variance_epsilon", 0.0),
    "transformers.models.gemma.modeling_gemma": ("Gemma", "eps", 1.0),
}
#: (norm attribute, owner attribute, owner class suffix, projections) of each fused group of a layer
GROUPS = (("input_layernorm", "self_attn", "Attention", ("q_proj", "k_proj", "v_proj")),
          ("post_attention_layernorm", "mlp", "MLP", ("gate_proj", "up_proj")))

_KERNEL_DTYPES = (torch.bfloat16, torch.float16)


def _version(t: torch.Tensor) -> int:
    return -1 if t.is_inference() else t._version  # inference tensors keep no version counter


def _hooked(m: nn.Module, pre_only: bool = False) -> bool:
    if m._forward_pre_hooks:
        return True
    return not pre_only and bool(m._forward_hooks or m._backward_hooks or m._backward_pre_hooks)


def _global_hooks() -> bool:
    mm = torch.nn.modules.module
    return bool(mm._global_forward_pre_hooks or mm._global_forward_hooks)


class _Group:
    """What a group's norm and projections share: the projections in order, the module that calls
    them, the input the norm passed through (held weakly), and results not yet handed out."""

    def __init__(self, owner: nn.Module, names: tuple[str, ...], members: list["FusedQuantLinear"],
                 norm: "FusedRMSNorm | None"):
        self.owner = owner  # (a reference cycle through the modules; deepcopy maps it to the copy)
        self.names = names
        self.members = members
        self.norm = norm
        self.armed = None  # (weakref to the un-normalized input, its version)
        self.results = None  # (weakref to the input, version, {member index: output})

    # ---- the norm's side --------------------------------------------------------------------
    def can_pass_through(self, x: torch.Tensor) -> bool:
        """Whether the norm may hand ``x`` un-normalized to its consumers (only these projections
        will see it, as fused inputs, and the fused op runs for it)."""
        owner = self.owner
        if any(getattr(owner, n, None) is not m for n, m in zip(self.names, self.members)):
            return False  # a projection was replaced: it would read the un-normalized tensor
        if _hooked(self.norm) or _hooked(owner, pre_only=True) or any(_hooked(m) for m in self.members) \
                or _global_hooks() or torch.compiler.is_compiling():
            return False
        if torch.is_grad_enabled() and (x.requires_grad or self.norm.weight.requires_grad
                                        or any(m.bias is not None and m.bias.requires_grad for m in self.members)):
            return False  # the fused op has no backward
        if any(m.act_format is not None or m.weight_data.device != x.device for m in self.members) \
                or self.norm.weight.device != x.device:
            return False
        return x.dtype in _KERNEL_DTYPES or (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64))

    def arm(self, x: torch.Tensor) -> None:
        self.armed = (weakref.ref(x), _version(x))
        self.results = None

    def disarm(self) -> None:
        self.armed = None
        self.results = None

    # ---- the projections' side --------------------------------------------------------------
    def _is_armed(self, x: torch.Tensor) -> bool:
        return self.armed is not None and self.armed[0]() is x

    def _take(self, x: torch.Tensor, i: int) -> torch.Tensor | None:
        r = self.results
        if r is not None and r[0]() is x and r[1] == _version(x) and i in r[2]:
            return r[2].pop(i)
        return None

    def _store(self, x: torch.Tensor, outs: list[torch.Tensor], i: int) -> None:
        self.results = (weakref.ref(x), _version(x), {j: o for j, o in enumerate(outs) if j != i})

    def output(self, member: "FusedQuantLinear", x: torch.Tensor) -> torch.Tensor:
        """``member``'s output for input ``x`` (see the module docstring)."""
        i = self.members.index(member)
        if self.norm is not None and not self._is_armed(x):
            return QuantLinear.forward(member, x)  # an ordinary input
        hit = self._take(x, i)
        if hit is not None:
            return hit
        qs = [m.qweight for m in self.members]
        bs = [m.bias for m in self.members]
        if self.norm is not None:
            outs = _fused_norm_linear(x, self.norm.norm_weight(), qs, bs, self.norm.eps)
        else:
            if x.dtype not in _KERNEL_DTYPES or torch.compiler.is_compiling() or any(
                    m.act_format is not None or m.weight_data.device != x.device for m in self.members) or (
                    torch.is_grad_enabled() and x.requires_grad):
                return QuantLinear.forward(member, x)
            outs = _batched.linear_batched(x, qs, bs)
        self._store(x, outs, i)
        return outs[i]


def _fused_norm_linear(x, norm_weight, qs, bs, eps) -> list[torch.Tensor]:
    """``rmsnorm_linear(x, norm_weight, qs, bs)``; float32/float64 inputs (CPU only) take its
    float64 composition directly (the op itself serves bf16/fp16)."""
    if x.dtype in _KERNEL_DTYPES:
        return _norm_linear.rmsnorm_linear(x, norm_weight, qs, bs, eps=eps)
    return [_norm_linear.rmsnorm_linear_reference(x, norm_weight, q, b, eps=eps) for q, b in zip(qs, bs)]


class FusedRMSNorm(nn.Module):
    """Stands in for a transformers RMSNorm whose output only feeds a fused group of projections:
    it holds the same ``weight`` parameter (same state-dict name), records ``eps`` and the weight
    offset (1 for Gemma's ``1 + weight``), and passes its input through while the group can fuse;
    otherwise it returns what the original module returns."""

    def __init__(self, norm: nn.Module, eps: float, offset: float):
        super().__init__()
        self.weight = norm.weight
        self.eps = float(eps)
        self.offset = float(offset)
        self.__dict__["original"] = norm  # kept out of the module tree (its weight is ours)
        self.__dict__["group"] = None

    def norm_weight(self) -> torch.Tensor:
        """The factor the normalized activations are multiplied by."""
        return self.weight if self.offset == 0 else self.weight.float() + self.offset

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """The original module's output for ``x``."""
        orig = self.original
        if orig.weight is not self.weight:
            orig.weight = self.weight
        return orig(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.group
        if g is not None and g.can_pass_through(x):
            g.arm(x)
            return x
        if g is not None:
            g.disarm()
        return self.normalize(x)

    def extra_repr(self) -> str:
        off = "" if self.offset == 0 else f", weight offset {self.offset:g}"
        return f"{tuple(self.weight.shape)}, eps={self.eps}{off}, fused into its projections"


class FusedQuantLinear(QuantLinear):
    """A :class:`QuantLinear` in a fused group (same buffers, state dict and ``quantized_state``
    names); called with the tensor its group's norm passed through it returns its projection of
    the normalized input, computed with the rest of the group in one op."""

    group: _Group | None = None

    @classmethod
    def of(cls, m: QuantLinear) -> "FusedQuantLinear":
        new = cls.from_qtensor(m.qweight, None, m.act_format, m.fast_accum)
        new.bias = m.bias  # the same parameter
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.__dict__.get("group")
        return QuantLinear.forward(self, x) if g is None else g.output(self, x)


def _exact(m: object, module: str, name: str) -> bool:
    t = type(m)
    return t.__module__ == module and t.__name__ == name and "forward" not in vars(m) \
        and getattr(t.forward, "__module__", None) == module


def _projections_reason(owner: nn.Module, names: tuple[str, ...]) -> str | None:
    ps = [getattr(owner, n, None) for n in names]
    for n, p in zip(names, ps):
        if type(p) is not QuantLinear:
            return f"{n} is {type(p).__name__}, not QuantLinear"
        if p.act_format is not None:
            return f"{n} quantizes its activations ({p.act_format.name}); the fused op is weight-only"
        q = p.qweight
        if tuple(q.padded_shape) != tuple(q.shape):
            return f"{n} has a padded weight {tuple(q.shape)} -> {tuple(q.padded_shape)}"
        if _hooked(p):
            return f"{n} has hooks"
    k = {p.in_features for p in ps}
    devs = {p.weight_data.device for p in ps}
    if len(k) > 1 or len(devs) > 1:
        return f"the projections differ in K {sorted(k)} or device {sorted(map(str, devs))}"
    return None


def _norm_reason(layer: nn.Module, norm_name: str, module: str, prefix: str, eps_attr: str, k: int) -> str | None:
    norm = getattr(layer, norm_name, None)
    if not _exact(norm, module, prefix + "RMSNorm"):
        return f"{norm_name} is {type(norm).__name__}, not {prefix}RMSNorm as transformers defines it"
    w, eps = getattr(norm, "weight", None), getattr(norm, eps_attr, None)
    if not isinstance(w, nn.Parameter) or tuple(w.shape) != (k,) or not isinstance(eps, (int, float)):
        return f"{norm_name} has no weight of shape ({k},) or no float {eps_attr}"
    if _hooked(norm):
        return f"{norm_name} has hooks"
    return None


def _set(parent: nn.Module, name: str, new: nn.Module) -> None:
    setattr(parent, name, new)


def fuse_projections(model: nn.Module, *, warn: bool = True) -> nn.Module:
    """Fuse each supported transformers decoder layer's RMSNorms into its projections.

    Every layer of a family in :data:`FAMILIES` (Llama, Mistral, Qwen2, Qwen3, Gemma) whose
    modules are exactly transformers' classes of that family (decoder layer, attention, MLP,
    RMSNorm; no hooks, no instance-level ``forward``) and whose q/k/v (gate/up) projections are
    :class:`QuantLinear` of one K, on one device, weight-only and unpadded (any registry formats;
    they may differ) is rewritten: ``input_layernorm`` + q/k/v run as one
    :func:`microscale.rmsnorm_linear`, ``post_attention_layernorm`` + gate/up as another. When the
    projections qualify but the norm does not, they run as one :func:`microscale.linear_batched`
    per input. Everything else stays as it was; the groups left unfused are named, with the
    reason, in one warning (``warn``).

    The rewrite replaces modules (state-dict names and ``quantized_state`` are unchanged) and
    keeps outputs: bf16/fp16 inputs run the fused op (CUDA: one kernel; CPU: its float64
    composition), float32/float64 inputs on the CPU the same composition; any other call runs
    unfused. The fused norm is computed in float32 without the bf16 rounding transformers
    applies between norm and projection, so bf16 outputs differ from unfused ones by that
    rounding. :func:`unfuse_projections` reverses it. Eager mode: under ``torch.compile``, with
    autograd, or with hooks on a norm, a projection or an attention/MLP's pre-hooks, the layer
    runs unfused. A forward hook on the attention/MLP module sees the un-normalized input in its
    ``args``.

    Returns:
        ``model`` (changed in place).
    """
    skipped: list[str] = []
    for lname, layer in list(model.named_modules()):
        fam = FAMILIES.get(type(layer).__module__)
        if fam is None or type(layer).__name__ != fam[0] + "DecoderLayer":
            continue
        module = type(layer).__module__
        prefix, eps_attr, offset = fam
        where = lname or type(layer).__name__
        if not _exact(layer, module, prefix + "DecoderLayer") or _hooked(layer, pre_only=True):
            skipped.append(f"{where}: the decoder layer's forward is replaced or pre-hooked")
            continue
        for norm_name, owner_name, suffix, names in GROUPS:
            norm, owner = getattr(layer, norm_name, None), getattr(layer, owner_name, None)
            if isinstance(norm, FusedRMSNorm) or any(isinstance(getattr(owner, n, None), FusedQuantLinear)
                                                     for n in names):
                continue  # fused already
            gname = f"{where}.{owner_name}"
            if not _exact(owner, module, prefix + suffix):
                skipped.append(f"{gname}: {type(owner).__name__} is not {prefix}{suffix}")
                continue
            why = _projections_reason(owner, names)
            if why is not None:
                skipped.append(f"{gname}: {why}")
                continue
            members = [FusedQuantLinear.of(getattr(owner, n)) for n in names]
            why_norm = _norm_reason(layer, norm_name, module, prefix, eps_attr, members[0].in_features)
            fnorm = None
            if why_norm is None:
                fnorm = FusedRMSNorm(norm, getattr(norm, eps_attr), offset)
            else:
                skipped.append(f"{gname}: {why_norm}; {'/'.join(names)} batched without the norm")
            group = _Group(owner, names, members, fnorm)
            for n, m in zip(names, members):
                m.__dict__["group"] = group
                _set(owner, n, m)
            if fnorm is not None:
                fnorm.__dict__["group"] = group
                _set(layer, norm_name, fnorm)
    if skipped and warn:
        warnings.warn(f"fuse_projections: {len(skipped)} group(s) not fused into one rmsnorm_linear: "
                      + "; ".join(skipped), stacklevel=2)
    return model


def unfuse_projections(model: nn.Module) -> nn.Module:
    """Undo :func:`fuse_projections`: each :class:`FusedRMSNorm` becomes its original module
    again (holding the current weight) and each :class:`FusedQuantLinear` a plain QuantLinear
    holding its current weight and bias. Returns ``model`` (changed in place)."""
    for name, m in list(model.named_modules()):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if isinstance(m, FusedRMSNorm):
            orig = m.original
            orig.weight = m.weight
            m.__dict__["group"] = None
            _set(parent, child, orig)
        elif isinstance(m, FusedQuantLinear):
            new = QuantLinear.from_qtensor(m.qweight, None, m.act_format, m.fast_accum)
            new.bias = m.bias
            m.__dict__["group"] = None
            _set(parent, child, new)
    return model
