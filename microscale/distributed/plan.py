"""``parallelize(model, plan)``: apply a tensor-parallel plan to a quantized model.

A plan maps module-name patterns (``fnmatch`` globs on the fully qualified name, first match wins)
to a style, as ``torch.distributed.tensor.parallel.parallelize_module`` plans do:

* ``"colwise"`` — :class:`ColumnParallelQuantLinear`, output left sharded (feeds a rowwise layer);
* ``"colwise_gather"`` — column-parallel with the output all-gathered;
* ``"rowwise"`` — :class:`RowParallelQuantLinear` taking the sharded input of a colwise layer;
* ``"rowwise_full"`` — row-parallel taking the full input (sliced on each rank).

torch's own ``ColwiseParallel()`` / ``RowwiseParallel()`` objects are accepted as ``"colwise"`` /
``"rowwise"``. The targets must be :class:`~microscale.nn.QuantLinear` modules (quantize first with
:func:`microscale.nn.quantize_model`). Attention modules whose projections go colwise have their head
counts (``num_heads``, ``num_attention_heads``, ``num_key_value_heads``, ``all_head_size``) divided by
the world size, and a head count that does not divide is an error (a shard would split a head).

Expert-parallel MoE (experts split across ranks) plugs in through :data:`EXPERT_PARALLEL_HOOKS`:
a callable ``(module, group) -> module | None`` tried on every module before the plan; it is empty
until a quantized MoE module exists to shard (a 3-D expert QTensor already shards along its expert
dim with ``shard(q, 0, world, rank)``).
"""
from __future__ import annotations

import fnmatch
from typing import Callable

import torch.distributed as dist
from torch import nn

from .layers import ColumnParallelQuantLinear, RowParallelQuantLinear, world_and_rank

__all__ = ["parallelize", "DEFAULT_PLAN", "STYLES", "EXPERT_PARALLEL_HOOKS"]

#: Llama-family (q/k/v/o, gate/up/down) and BERT-family (query/key/value, intermediate/output) names.
DEFAULT_PLAN: dict[str, str] = {
    "*q_proj": "colwise", "*k_proj": "colwise", "*v_proj": "colwise", "*o_proj": "rowwise",
    "*gate_proj": "colwise", "*up_proj": "colwise", "*down_proj": "rowwise",
    "*attention.self.query": "colwise", "*attention.self.key": "colwise", "*attention.self.value": "colwise",
    "*attention.output.dense": "rowwise", "*intermediate.dense": "colwise", "*output.dense": "rowwise",
}

STYLES = ("colwise", "colwise_gather", "rowwise", "rowwise_full")

#: Callables ``(module, group) -> replacement | None`` for expert-parallel MoE layers.
EXPERT_PARALLEL_HOOKS: list[Callable[[nn.Module, dist.ProcessGroup | None], nn.Module | None]] = []

_HEAD_ATTRS = ("num_heads", "num_attention_heads", "num_key_value_heads", "num_kv_heads", "all_head_size")


def _style(v, name: str) -> str:
    if isinstance(v, str):
        if v not in STYLES:
            raise ValueError(f"parallelize: plan entry {name!r} has style {v!r}; expected one of {', '.join(STYLES)}")
        return v
    kind = type(v).__name__
    if kind == "ColwiseParallel":
        return "colwise"
    if kind == "RowwiseParallel":
        return "rowwise"
    raise TypeError(f"parallelize: plan entry {name!r} is {kind}; expected a style name ({', '.join(STYLES)}) or "
                    "torch's ColwiseParallel / RowwiseParallel")


def _match(name: str, plan: dict) -> str | None:
    for pat, style in plan.items():
        if fnmatch.fnmatchcase(name, pat):
            return _style(style, pat)
    return None


def _set(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def parallelize(model: nn.Module, plan: dict | None = None, group: dist.ProcessGroup | None = None,
                pad: bool = False) -> nn.Module:
    """Replace, in place, the :class:`~microscale.nn.QuantLinear` modules of ``model`` named by ``plan``
    (default :data:`DEFAULT_PLAN`) with this rank's column-/row-parallel layers over ``group``, adjust
    the head counts of the attention modules above colwise projections, and return ``model``.

    Every rank calls it on the same full model (see :mod:`microscale.distributed.loading` to build
    one from a checkpoint reading only the rank's slices). ``pad`` is passed to :func:`shard`."""
    from ..nn import QuantLinear

    plan = DEFAULT_PLAN if plan is None else dict(plan)
    world, _ = world_and_rank(group)
    if EXPERT_PARALLEL_HOOKS:
        for name, mod in list(model.named_modules()):
            for hook in EXPERT_PARALLEL_HOOKS:
                new = hook(mod, group)
                if new is not None and name:
                    _set(model, name, new)
                    break
    parents: set[str] = set()
    done = 0
    for name, mod in list(model.named_modules()):
        style = _match(name, plan) if name else None
        if style is None:
            continue
        if not isinstance(mod, QuantLinear):
            if isinstance(mod, nn.Linear):
                raise TypeError(f"parallelize: {name!r} is an nn.Linear; quantize the model first "
                                "(microscale.nn.quantize_model)")
            continue
        if style.startswith("colwise"):
            new = ColumnParallelQuantLinear.from_quant_linear(mod, group, gather_output=style == "colwise_gather",
                                                              pad=pad, name=name)
            if style == "colwise":
                parents.add(name.rpartition(".")[0])
        else:
            new = RowParallelQuantLinear.from_quant_linear(mod, group, input_is_parallel=style == "rowwise",
                                                           pad=pad, name=name)
        _set(model, name, new)
        done += 1
    if plan and not done:
        raise ValueError(f"parallelize: no QuantLinear module matched the plan's patterns ({', '.join(plan)})")
    for p in sorted(parents):
        mod = model.get_submodule(p) if p else model
        for attr in _HEAD_ATTRS:
            v = getattr(mod, attr, None)
            if isinstance(v, int) and not isinstance(v, bool):
                if v % world:
                    raise ValueError(f"parallelize: {p or 'model'}.{attr}={v} does not split over world size {world} "
                                     "(a shard would cut a head)")
                setattr(mod, attr, v // world)
    return model
