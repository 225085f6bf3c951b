"""Tensor parallelism for block-scaled weights over ``torch.distributed`` (gloo on CPU, NCCL on GPUs).

* :func:`shard` / :func:`gather` — cut a QTensor along N or K on whole blocks (``pad=True`` for
  explicit, reversible padding); gather gives back the same bytes.
* :class:`ColumnParallelQuantLinear` / :class:`RowParallelQuantLinear` — one rank's layer.
* :func:`parallelize` — apply a tensor-parallel plan to a quantized model.
* :func:`load_sharded` — read only this rank's slice of each tensor from safetensors files.

Not imported by ``import microscale``; import ``microscale.distributed`` by name.
"""
from .layers import ColumnParallelQuantLinear, RowParallelQuantLinear, world_and_rank
from .plan import DEFAULT_PLAN, EXPERT_PARALLEL_HOOKS, parallelize
from .shard import ShardSpec, gather, gather_swizzled_scales, shard, shard_spec, shard_swizzled_scales

__all__ = ["shard", "gather", "shard_spec", "ShardSpec", "shard_swizzled_scales", "gather_swizzled_scales",
           "ColumnParallelQuantLinear", "RowParallelQuantLinear", "world_and_rank", "parallelize", "DEFAULT_PLAN",
           "EXPERT_PARALLEL_HOOKS"]
from .loading import DEFAULT_DIMS, ReadStats, load_sharded  # noqa: E402

__all__ += ["load_sharded", "ReadStats", "DEFAULT_DIMS"]
