"""``QuantExperts``: MoE experts whose projections are 3-D QTensors, run by :func:`microscale.moe_experts`.

transformers (>= 5) keeps the experts of its MoE models (``GptOssExperts``, ``Qwen3MoeExperts``,
``MixtralExperts``, ``Qwen2MoeExperts`` and the ~70 others decorated with
``@use_experts_implementation``) as one module holding 3-D parameters ``gate_up_proj`` and
``down_proj`` (``[E, out, in]``, or ``[E, in, out]`` where the class says ``is_transposed``), and
dispatches their forward through ``transformers.integrations.moe.ExpertsInterface`` by
``config._experts_implementation`` (``"grouped_mm"``, ``"batched_mm"``, ``"deepgemm"``, ...).

* :func:`register` adds ``"microscale"`` to that registry (``ExpertsInterface.register``, the way
  its own ``grouped_mm`` / ``deepgemm`` entries are made), so ``model.set_experts_implementation
  ("microscale")`` and ``from_pretrained(..., experts_implementation="microscale")`` are accepted.
* :class:`QuantExperts` replaces such a module (:func:`microscale.nn.quantize_model`, or
  :func:`microscale.nn.load_quantized_state` from a checkpoint, e.g. gpt-oss's MXFP4
  ``*_blocks``/``*_scales``). It keeps the experts as QTensors ``[E, N, K]`` (out x in, blocks along
  ``in``, as the grouped kernel takes them) and follows the registry too: under ``"microscale"``
  (set by those two functions) or ``"eager"`` its forward is :func:`microscale.moe_experts`; under
  any other registered name it hands itself to that implementation, which then reads
  ``gate_up_proj``/``down_proj`` as the dequantized weights in transformers' layout (slow: a
  comparison peer, not a serving path).

The activation is learnt by probing the module's own ``_apply_gate`` on random float64 inputs
against microscale's ``swiglu`` variants (plain SwiGLU concatenated or interleaved; gpt-oss's
clamped SwiGLU with the module's ``alpha``/``limit``). Experts that match none, that have no gate
(``has_gate=False``), a post-expert norm, or shapes that are not whole blocks are left as they are
(``quantize_model`` warns). Nothing here imports transformers at module level.
"""
from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from ..formats import Format, get_format, packed_len
from ..moe.reference import swiglu
from ..qtensor import QTensor

__all__ = ["QuantExperts", "EXPERTS_NAME", "register", "use_microscale", "microscale_experts_forward",
           "experts_spec", "is_experts_module"]

EXPERTS_NAME = "microscale"
PROJS = ("gate_up_proj", "down_proj")
_ROLES = ("data", "scales", "global_scale", "zero_points")
_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64)}
_X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


# ---------------------------------------------------------------------------------------
# transformers' experts registry
# ---------------------------------------------------------------------------------------
def register() -> None:
    """Register ``"microscale"`` with ``transformers.integrations.moe.ExpertsInterface`` (idempotent)."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(EXPERTS_NAME, microscale_experts_forward)


def microscale_experts_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                               top_k_weights: torch.Tensor) -> torch.Tensor:
    """The registry's ``"microscale"`` entry (signature of transformers' experts forwards).

    On a :class:`QuantExperts`: :func:`microscale.moe_experts` (the grouped kernel on CUDA, the
    float64 reference elsewhere). On a float experts module of the same model (one
    ``quantize_model`` skipped or could not quantize): transformers' ``grouped_mm`` forward."""
    if isinstance(self, QuantExperts):
        return self.microscale_forward(hidden_states, top_k_index, top_k_weights)
    from transformers.integrations.moe import grouped_mm_experts_forward

    return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)


def _use_microscale(config) -> None:
    """Point ``config`` (a transformers config, or None) at the ``"microscale"`` experts implementation."""
    if config is not None and hasattr(config, "_experts_implementation"):
        register()
        if config._experts_implementation != EXPERTS_NAME:
            config._experts_implementation = EXPERTS_NAME


# ---------------------------------------------------------------------------------------
# what a transformers experts module computes
# ---------------------------------------------------------------------------------------
@dataclass
class ExpertsSpec:
    """What :class:`QuantExperts` needs to know of a float experts module."""

    num_experts: int
    hidden: int
    intermediate: int
    is_transposed: bool
    has_bias: bool
    activation: str
    layout: str
    alpha: float | None
    limit: float | None
    dtype: torch.dtype
    config: object


def is_experts_module(m: nn.Module) -> bool:
    """A module holding 3-D ``gate_up_proj`` and ``down_proj`` parameters (transformers' experts layout)."""
    p = getattr(m, "_parameters", {})
    gu, dn = p.get("gate_up_proj"), p.get("down_proj")
    return isinstance(gu, torch.Tensor) and isinstance(dn, torch.Tensor) and gu.dim() == 3 and dn.dim() == 3


def _number(v) -> float | None:
    return float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else None


def _probe_activation(m: nn.Module, two_i: int) -> tuple[str, str, float | None, float | None] | None:
    """(activation, layout, alpha, limit) that reproduce ``m._apply_gate``, or None."""
    gate = getattr(m, "_apply_gate", None)
    if not callable(gate):
        return None
    cfg = getattr(m, "config", None)
    alphas = {a for a in (_number(getattr(m, "alpha", None)), _number(getattr(m, "swiglu_alpha", None)),
                          _number(getattr(cfg, "swiglu_alpha", None))) if a is not None}
    limits = {v for v in (_number(getattr(m, "limit", None)), _number(getattr(m, "swiglu_limit", None)),
                          _number(getattr(cfg, "swiglu_limit", None))) if v is not None}
    cands = [("swiglu", "concat", None, None), ("swiglu", "interleaved", None, None)]
    cands += [("swiglu_clamped", lay, a, lim) for a in sorted(alphas) for lim in sorted(limits)
              for lay in ("interleaved", "concat")]
    g = torch.Generator().manual_seed(0)
    h = torch.randn(16, two_i, generator=g, dtype=torch.float64) * 6  # reaches past gpt-oss's clamp at 7
    try:
        with torch.no_grad():
            got = gate(h)
    except Exception:  # a gate that cannot run on a float64 CPU tensor is not one we know
        return None
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (16, two_i // 2):
        return None
    for act, lay, a, lim in cands:
        want = swiglu(h, act, a, lim, lay)
        if got.dtype == torch.float64 and torch.allclose(got, want, rtol=1e-12, atol=1e-12):
            return act, lay, a, lim
    return None


def experts_spec(m: nn.Module) -> tuple[ExpertsSpec | None, str]:
    """``(spec, "")`` for a float experts module :class:`QuantExperts` can replace, else ``(None, why)``."""
    if not is_experts_module(m):
        return None, "no 3-D gate_up_proj/down_proj parameters"
    if not getattr(m, "has_gate", True):
        return None, "experts without a gate (has_gate=False)"
    if getattr(m, "has_post_expert_norm", False):
        return None, "a post-expert norm"
    if getattr(m, "_is_expert_parallel", False):
        return None, "expert parallelism"
    gu, dn = m.gate_up_proj, m.down_proj
    tr = bool(getattr(m, "is_transposed", False))
    e = gu.shape[0]
    n2, h = (gu.shape[2], gu.shape[1]) if tr else (gu.shape[1], gu.shape[2])
    dh, di = (dn.shape[2], dn.shape[1]) if tr else (dn.shape[1], dn.shape[2])
    if n2 % 2 or dn.shape[0] != e or dh != h or di != n2 // 2:
        return None, (f"gate_up_proj {tuple(gu.shape)} and down_proj {tuple(dn.shape)} do not form [E, 2I, H] and "
                      f"[E, H, I]{' (transposed)' if tr else ''}")
    act = _probe_activation(m, n2)
    if act is None:
        return None, ("an activation (_apply_gate) that is neither SwiGLU (concatenated or interleaved) nor "
                      "gpt-oss's clamped SwiGLU")
    bu, bd = getattr(m, "gate_up_proj_bias", None), getattr(m, "down_proj_bias", None)
    has_bias = isinstance(bu, torch.Tensor) and isinstance(bd, torch.Tensor)
    if has_bias and (tuple(bu.shape) != (e, n2) or tuple(bd.shape) != (e, h)):
        return None, f"biases {tuple(bu.shape)} / {tuple(bd.shape)} are not [E, 2I] / [E, H]"
    return ExpertsSpec(int(e), int(h), int(n2 // 2), tr, has_bias, act[0], act[1], act[2], act[3], gu.dtype,
                       getattr(m, "config", None)), ""


def _fits(fmt: Format, n: int, k: int) -> bool:
    return k % fmt.block_size == 0 and n % fmt.block_rows == 0


# ---------------------------------------------------------------------------------------
# the module
# ---------------------------------------------------------------------------------------
class QuantExperts(nn.Module):
    """MoE experts ``out[t] = sum_j w[t,j] * down_e(act(gate_up_e(x[t])))`` with both projections held as
    3-D QTensors ``[E, N, K]`` (``gate_up_proj`` ``[E, 2I, H]``, ``down_proj`` ``[E, H, I]``: out x in,
    blocks along ``in``).

    The QTensors' fields are buffers (``gate_up_proj_data``, ``gate_up_proj_scales`` and, when the
    format has them, ``..._global_scale`` / ``..._zero_points``; the same for ``down_proj``), the
    biases parameters ``gate_up_proj_bias`` / ``down_proj_bias``; formats, shapes, dtypes, the
    activation and the gate layout travel as extra state. ``forward(hidden_states [T, H],
    top_k_index [T, k], top_k_weights [T, k])`` as transformers' experts modules.

    ``activation``: ``"swiglu"`` or ``"swiglu_clamped"`` (gpt-oss; ``alpha``/``limit``); ``layout``:
    ``"concat"`` (gate rows then up rows) or ``"interleaved"`` (gpt-oss). ``is_transposed`` only
    says how the dequantized ``gate_up_proj``/``down_proj`` views present the weights to
    transformers' own implementations (``[E, in, out]`` as gpt-oss's parameters); the QTensors are
    ``[E, out, in]`` either way.
    """

    def __init__(self, num_experts: int, hidden_dim: int, intermediate_dim: int,
                 fmt: str | Format | tuple = "mxfp4", *, has_bias: bool = False, activation: str = "swiglu",
                 layout: str = "concat", alpha: float | None = None, limit: float | None = None,
                 is_transposed: bool = False, config=None, device=None, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.num_experts, self.hidden_dim, self.intermediate_dim = int(num_experts), int(hidden_dim), \
            int(intermediate_dim)
        fmts = fmt if isinstance(fmt, tuple) else (fmt, fmt)
        self.fmts = {p: get_format(f) for p, f in zip(PROJS, fmts)}
        self.weight_dtypes = {p: dtype for p in PROJS}
        self.metas: dict = {p: {} for p in PROJS}
        self.activation, self.layout = activation, layout
        self.alpha = None if alpha is None else float(alpha)
        self.limit = None if limit is None else float(limit)
        self.is_transposed = bool(is_transposed)
        self.config = config
        # the flags transformers' experts implementations read
        self.has_gate, self.has_bias, self.has_post_expert_norm = True, bool(has_bias), False
        self.is_concatenated = layout == "concat"
        self._is_expert_parallel = False
        e = self.num_experts
        for p in PROJS:
            f = self.fmts[p]
            n, k = self._nk(p)
            if not _fits(f, n, k):
                raise ValueError(f"QuantExperts: {p} [{e}, {n}, {k}] is not whole {f.name} blocks "
                                 f"({f.block_rows}x{f.block_size})")
            self.register_buffer(p + "_data", torch.zeros((e, n, packed_len(k, f.element.bits)), dtype=torch.uint8,
                                                          device=device))
            self.register_buffer(p + "_scales", torch.zeros((e, n // f.block_rows, k // f.block_size),
                                                            dtype=f.scale.storage, device=device))
            self.register_buffer(p + "_global_scale", torch.ones((), dtype=torch.float32, device=device)
                                 if f.global_scale else None)
            self.register_buffer(p + "_zero_points", torch.zeros((e, n, k // f.block_size), dtype=torch.uint8,
                                                                 device=device) if f.zero_point else None)
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(e, 2 * self.intermediate_dim, dtype=dtype, device=device),
                                              requires_grad=False) if has_bias else None
        self.down_proj_bias = nn.Parameter(torch.zeros(e, self.hidden_dim, dtype=dtype, device=device),
                                           requires_grad=False) if has_bias else None
        self._q: dict = {}

    def _nk(self, proj: str) -> tuple[int, int]:
        return (2 * self.intermediate_dim, self.hidden_dim) if proj == "gate_up_proj" else \
            (self.hidden_dim, self.intermediate_dim)

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def from_qtensors(cls, gate_up: QTensor, down: QTensor, gate_up_bias: torch.Tensor | None = None,
                      down_bias: torch.Tensor | None = None, *, activation: str = "swiglu", layout: str = "concat",
                      alpha: float | None = None, limit: float | None = None, is_transposed: bool = False,
                      config=None) -> "QuantExperts":
        """Wrap two 3-D QTensors (``[E, 2I, H]`` and ``[E, H, I]``; used as they are, no copy)."""
        for name, q in (("gate_up", gate_up), ("down", down)):
            if not isinstance(q, QTensor) or len(q.shape) != 3:
                raise ValueError(f"QuantExperts: {name} must be a 3-D QTensor [E, N, K], got "
                                 f"{tuple(q.shape) if isinstance(q, QTensor) else type(q).__name__}")
        e, n2, h = (int(s) for s in gate_up.shape)
        if n2 % 2 or tuple(down.shape) != (e, h, n2 // 2):
            raise ValueError(f"QuantExperts: gate_up {tuple(gate_up.shape)} and down {tuple(down.shape)} do not form "
                             f"[E, 2I, H] and [E, H, I]")
        if (gate_up_bias is None) != (down_bias is None):
            raise ValueError("QuantExperts: give both biases or neither")
        m = cls(e, h, n2 // 2, (gate_up.fmt, down.fmt), has_bias=gate_up_bias is not None, activation=activation,
                layout=layout, alpha=alpha, limit=limit, is_transposed=is_transposed, config=config, device="meta",
                dtype=gate_up.dtype)
        for p, q in zip(PROJS, (gate_up, down)):
            if tuple(q.padded_shape) != tuple(q.shape):
                raise ValueError(f"QuantExperts: {p} {tuple(q.shape)} was padded to {tuple(q.padded_shape)}")
            for r in _ROLES:
                setattr(m, f"{p}_{r}", getattr(q, r))
            m.weight_dtypes[p] = q.dtype
            m.metas[p] = dict(q.meta)
            m._q[p] = (m._key(p), q)
        if gate_up_bias is not None:
            m.gate_up_proj_bias = nn.Parameter(gate_up_bias.detach().clone(), requires_grad=False)
            m.down_proj_bias = nn.Parameter(down_bias.detach().clone(), requires_grad=False)
        return m

    @classmethod
    def from_module(cls, m: nn.Module, fmt: str | Format = "mxfp4", **quantize_kwargs) -> "QuantExperts":
        """Quantize a transformers experts module (``[E, in, out]`` weights transposed first). The
        module shares the float module's ``config`` and leaves it alone: it runs ``ms.moe_experts``
        once that config names ``"microscale"`` (``quantize_model`` and ``load_quantized_state`` set
        it; by hand: :func:`use_microscale`)."""
        from ..ops import quantize

        spec, why = experts_spec(m)
        if spec is None:
            raise ValueError(f"QuantExperts: cannot replace {type(m).__name__}: {why}")
        fmt = get_format(fmt)
        quantize_kwargs.pop("pad", None)  # experts are never padded: the kernel takes whole blocks
        qs = []
        for p in PROJS:
            w = getattr(m, p).detach()
            if spec.is_transposed:
                w = w.transpose(-1, -2)
            if not _fits(fmt, w.shape[1], w.shape[2]):
                raise ValueError(f"QuantExperts: {type(m).__name__}.{p} [E, N, K] = {tuple(w.shape)} is not whole "
                                 f"{fmt.name} blocks ({fmt.block_rows}x{fmt.block_size})")
            qs.append(quantize(w.contiguous(), fmt, **quantize_kwargs))
        bu = m.gate_up_proj_bias.detach() if spec.has_bias else None
        bd = m.down_proj_bias.detach() if spec.has_bias else None
        return cls.from_qtensors(qs[0], qs[1], bu, bd, activation=spec.activation, layout=spec.layout,
                                 alpha=spec.alpha, limit=spec.limit, is_transposed=spec.is_transposed,
                                 config=spec.config)

    # ---- the weights ------------------------------------------------------------------------
    def _key(self, proj: str) -> tuple:
        return tuple((t.data_ptr(), t.device) if t is not None else None
                     for t in (getattr(self, f"{proj}_{r}") for r in _ROLES))

    def qweight(self, proj: str) -> QTensor:
        """``proj``'s QTensor ``[E, N, K]`` (the same object while the buffers are unchanged, so the
        grouped kernel's repack, kept on the QTensor, is made once)."""
        key = self._key(proj)
        kept = self._q.get(proj)
        if kept is None or kept[0] != key:
            n, k = self._nk(proj)
            q = QTensor(getattr(self, proj + "_data"), getattr(self, proj + "_scales"), self.fmts[proj],
                        torch.Size((self.num_experts, n, k)), self.weight_dtypes[proj],
                        getattr(self, proj + "_global_scale"), getattr(self, proj + "_zero_points"),
                        dict(self.metas[proj]))
            kept = (key, q)
            self._q[proj] = kept
        return kept[1]

    def _dense(self, proj: str) -> torch.Tensor:
        w = self.qweight(proj).dequantize(self.weight_dtypes[proj])
        return w.transpose(-1, -2) if self.is_transposed else w

    # transformers' own implementations (grouped_mm, batched_mm, ...) read these: the decoded
    # weights in the float module's layout, made on every access
    @property
    def gate_up_proj(self) -> torch.Tensor:
        return self._dense("gate_up_proj")

    @property
    def down_proj(self) -> torch.Tensor:
        return self._dense("down_proj")

    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        return swiglu(gate_up, self.activation, self.alpha, self.limit, self.layout)

    # ---- forward ------------------------------------------------------------------------------
    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        impl = getattr(self.config, "_experts_implementation", None) if self.config is not None else None
        if impl in (None, "eager", EXPERTS_NAME):
            return self.microscale_forward(hidden_states, top_k_index, top_k_weights)
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        fn = ALL_EXPERTS_FUNCTIONS.get_interface(impl, microscale_experts_forward)
        return fn(self, hidden_states, top_k_index, top_k_weights)

    def microscale_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                           top_k_weights: torch.Tensor) -> torch.Tensor:
        """:func:`microscale.moe_experts` on the QTensors (inputs of another dtype run in float32)."""
        from ..moe import moe_experts

        x = hidden_states if hidden_states.dtype in _X_DTYPES else hidden_states.float()
        y = moe_experts(x, self.qweight("gate_up_proj"), self.qweight("down_proj"), top_k_index, top_k_weights,
                        activation=self.activation, gate_up_bias=self.gate_up_proj_bias,
                        down_bias=self.down_proj_bias, alpha=self.alpha, limit=self.limit, layout=self.layout)
        return y.to(hidden_states.dtype)

    def extra_repr(self) -> str:
        f = {p: self.fmts[p].name for p in PROJS}
        fs = f["gate_up_proj"] if f["gate_up_proj"] == f["down_proj"] else f"{f['gate_up_proj']}/{f['down_proj']}"
        return (f"num_experts={self.num_experts}, hidden_dim={self.hidden_dim}, "
                f"intermediate_dim={self.intermediate_dim}, fmt={fs}, activation={self.activation}, "
                f"layout={self.layout}, bias={self.has_bias}")

    # ---- state dict ---------------------------------------------------------------------------
    def get_extra_state(self) -> dict:
        return {"projs": {p: {"format": self.fmts[p].to_dict(), "shape": [self.num_experts, *self._nk(p)],
                              "dtype": str(self.weight_dtypes[p]).removeprefix("torch."), "meta": dict(self.metas[p])}
                          for p in PROJS},
                "activation": self.activation, "layout": self.layout, "alpha": self.alpha, "limit": self.limit,
                "is_transposed": self.is_transposed}

    def set_extra_state(self, state: dict) -> None:
        for p in PROJS:
            s = state["projs"][p]
            fmt = Format.from_dict(s["format"])
            want = [self.num_experts, *self._nk(p)]
            if fmt != self.fmts[p] or list(s["shape"]) != want:
                raise ValueError(f"QuantExperts: state {p} is {fmt.name} {s['shape']} but this module is "
                                 f"{self.fmts[p].name} {want}; build the module with the same format "
                                 "(quantize_model) before load_state_dict")
        if (state["activation"], state["layout"]) != (self.activation, self.layout):
            raise ValueError(f"QuantExperts: state computes {state['activation']}/{state['layout']}, this module "
                             f"{self.activation}/{self.layout}")
        for p in PROJS:
            self.weight_dtypes[p] = _DTYPES[state["projs"][p]["dtype"]]
            self.metas[p] = dict(state["projs"][p].get("meta", {}))
        self.alpha, self.limit = state["alpha"], state["limit"]
        self._q = {}

    def _apply(self, fn, recurse=True):
        """``.to(device)`` moves the quantized buffers; ``.to(dtype)`` casts only the biases."""
        saved = {}
        for p in PROJS:
            for r in _ROLES:
                name = f"{p}_{r}"
                t = self._buffers.get(name)
                if t is not None:
                    moved = fn(t)
                    saved[name] = moved if moved.dtype == t.dtype else t.to(moved.device)
                    self._buffers[name] = None
        try:
            super()._apply(fn, recurse)
        finally:
            for name, t in saved.items():
                self._buffers[name] = t
        self._q = {}
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self._q = {}
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


# ---------------------------------------------------------------------------------------
# the hooks quantize_model / quantized_state / load_quantized_state call
# ---------------------------------------------------------------------------------------
def quantize_experts(model: nn.Module, fmt: Format, skip_fn, quantize_kwargs: dict) -> list[tuple[str, nn.Module]]:
    """``(name, QuantExperts)`` for every experts module of ``model`` not skipped (``skip_fn(name)``);
    the ones that cannot be replaced are named in one warning and left as they are."""
    out, left = [], []
    for name, m in model.named_modules():
        if not name or not is_experts_module(m) or skip_fn(name):
            continue
        spec, why = experts_spec(m)
        if spec is not None:
            for p in PROJS:
                w = getattr(m, p)
                n, k = (w.shape[2], w.shape[1]) if spec.is_transposed else (w.shape[1], w.shape[2])
                if not _fits(fmt, n, k):
                    spec, why = None, f"{p} [E, N, K] = [{w.shape[0]}, {n}, {k}] is not whole {fmt.name} blocks"
                    break
        if spec is None:
            left.append(f"{name} ({type(m).__name__}: {why})")
            continue
        out.append((name, QuantExperts.from_module(m, fmt, **quantize_kwargs)))
    if left:
        warnings.warn("quantize_model: experts left in float: " + "; ".join(left), stacklevel=3)
    return out


def use_microscale(modules) -> None:
    """Point the configs of these QuantExperts at the ``"microscale"`` experts implementation."""
    for q in modules:
        _use_microscale(q.config)


def quantized_tensors(model: nn.Module) -> dict[str, QTensor]:
    """``<module>.gate_up_proj`` / ``<module>.down_proj`` QTensors ``[E, out, in]`` of every QuantExperts."""
    out = {}
    for n, m in model.named_modules():
        if isinstance(m, QuantExperts):
            for p in PROJS:
                out[(n + "." if n else "") + p] = m.qweight(p)
    return out


def slots(model: nn.Module) -> dict[str, tuple[str, str]]:
    """Tensor name -> (module name, projection) of each experts weight a QTensor can load into:
    ``<experts>.<proj>``, and ``<experts>.<proj>.weight`` as the conventions that name a quantized
    tensor ``<module>.weight*`` (modelopt, compressed-tensors) read it back."""
    out = {}
    for n, m in model.named_modules():
        if isinstance(m, QuantExperts) or is_experts_module(m):
            for p in PROJS:
                out[(n + "." if n else "") + p] = (n, p)
                out[(n + "." if n else "") + p + ".weight"] = (n, p)
    return out


def plan_load(model: nn.Module, found: dict[str, dict[str, tuple[str, QTensor]]], rest: dict, strict: bool,
              op: str = "load_quantized_state") -> list[tuple[str, callable]]:
    """Check the quantized experts weights ``found`` (module name -> proj -> (key, QTensor)) against
    the model, take their biases from ``rest``; returns ``(module name, make)`` pairs whose
    ``make()`` builds the QuantExperts (nothing in the model is changed here)."""
    plan = []
    for name, got in found.items():
        m = model.get_submodule(name)
        missing = [p for p in PROJS if p not in got]
        if missing:
            raise ValueError(f"{op}: {name!r} has a quantized {next(iter(got))} but {missing[0]} is "
                             f"{'not in the checkpoint' if missing[0] not in rest else 'not quantized'}: both "
                             "projections of an experts module must be quantized")
        if isinstance(m, QuantExperts):
            kw = dict(activation=m.activation, layout=m.layout, alpha=m.alpha, limit=m.limit,
                      is_transposed=m.is_transposed, config=m.config)
            e, h, i, has_bias, dev = m.num_experts, m.hidden_dim, m.intermediate_dim, m.has_bias, \
                m.gate_up_proj_data.device
        else:
            spec, why = experts_spec(m)
            if spec is None:
                raise ValueError(f"{op}: {name!r} ({type(m).__name__}) cannot hold quantized experts: {why}")
            kw = dict(activation=spec.activation, layout=spec.layout, alpha=spec.alpha, limit=spec.limit,
                      is_transposed=spec.is_transposed, config=spec.config)
            e, h, i, has_bias, dev = spec.num_experts, spec.hidden, spec.intermediate, spec.has_bias, \
                m.gate_up_proj.device
        want = {"gate_up_proj": (e, 2 * i, h), "down_proj": (e, h, i)}
        for p in PROJS:
            key, q = got[p]
            if tuple(q.shape) != want[p]:
                raise ValueError(f"{op}: {key!r} has shape {tuple(q.shape)}, the experts {name!r} expect "
                                 f"{want[p]} ([E, out, in])")
        biases = []
        for p, shape in (("gate_up_proj", (e, 2 * i)), ("down_proj", (e, h))):
            bkey = (name + "." if name else "") + p + "_bias"
            b = rest.pop(bkey, None)
            if b is not None and (not has_bias or tuple(b.shape) != shape):
                raise ValueError(f"{op}: bias {bkey!r} of shape {tuple(b.shape)} does not fit {name!r} "
                                 f"({shape if has_bias else 'no bias'})")
            if b is None and has_bias:
                if strict:
                    raise ValueError(f"{op}: missing [{bkey!r}] (a bias of quantized experts {name!r}); the model "
                                     "is unchanged")
                b = getattr(m, p + "_bias").detach()
            biases.append(b)

        def make(gu=got["gate_up_proj"][1], dn=got["down_proj"][1], biases=biases, kw=kw, dev=dev):
            if dev.type == "meta":
                dev = gu.device
            bs = [None if b is None else b.to(dev) for b in biases]
            return QuantExperts.from_qtensors(gu.to(dev), dn.to(dev), bs[0], bs[1], **kw)

        plan.append((name, make))
    return plan
