"""Column- and row-parallel quantized linears over a ``torch.distributed`` process group.

Both hold one rank's :func:`~microscale.distributed.shard.shard` of the weight and run
:func:`microscale.linear` on it for bf16/fp16 activations (``F.linear`` on the dequantized shard for
float32 ones, as :class:`~microscale.nn.QuantLinear` does); the same code runs over gloo (CPU) and
NCCL (GPU).

* :class:`ColumnParallelQuantLinear` — weight cut along N (output features). Each rank computes
  its output columns; with ``gather_output=True`` they are all-gathered (and world padding
  stripped), so the output equals the single-process ``ms.linear`` bit for bit (each output
  column is the same dot product on the same bytes).
* :class:`RowParallelQuantLinear` — weight cut along K (input features). Each rank multiplies its
  slice of the input and the partial outputs are all-reduced (summed in float32), then the bias is
  added once; the result equals the single-process output within float32 summation order.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..qtensor import QTensor
from .shard import ShardSpec, shard

__all__ = ["ColumnParallelQuantLinear", "RowParallelQuantLinear", "world_and_rank"]


def world_and_rank(group: dist.ProcessGroup | None = None) -> tuple[int, int]:
    """(world size, rank) of ``group`` (the default group when None); raises if torch.distributed is
    not initialized."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("tensor parallel layers need torch.distributed initialized "
                           "(torch.distributed.init_process_group('gloo' or 'nccl'))")
    return dist.get_world_size(group), dist.get_rank(group)


def _linear(x: torch.Tensor, q: QTensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The local product, routed as :class:`~microscale.nn.QuantLinear` routes it: ``ms.linear`` for
    bf16/fp16 activations, ``F.linear`` on the dequantized shard otherwise (float32 inputs)."""
    if x.dtype in (torch.bfloat16, torch.float16):
        from ..linear import linear  # the op family loads on first use (layer below)

        return linear(x, q, bias)
    return F.linear(x, q.dequantize(x.dtype), None if bias is None else bias.to(x.dtype))


def _weight_of(src, name: str) -> tuple[QTensor, torch.Tensor | None]:
    from ..nn import QuantLinear

    if isinstance(src, QuantLinear):
        return src.qweight, None if src.bias is None else src.bias.detach()
    if isinstance(src, QTensor):
        return src, None
    raise TypeError(f"{name}: expected a QTensor or a QuantLinear, got {type(src).__name__}")


class _ParallelQuantLinear(nn.Module):
    dim = "n"

    def __init__(self, weight: QTensor, bias: torch.Tensor | None, group: dist.ProcessGroup | None, spec: ShardSpec,
                 in_features: int, out_features: int):
        super().__init__()
        self.weight = weight  # this rank's shard (a QTensor; its meta holds the shard record)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.group = group
        self.spec = spec
        self.in_features, self.out_features = in_features, out_features

    @classmethod
    def _build(cls, src, bias, group, pad, name, **kw):
        q, b = _weight_of(src, cls.__name__)
        if bias is None:
            bias = b
        if len(q.shape) != 2:
            raise ValueError(f"{cls.__name__}({name}): weight must be 2-D [out, in], got shape {tuple(q.shape)}")
        world, rank = world_and_rank(group)
        local = shard(q, cls.dim, world, rank, pad=pad, name=name)
        spec = ShardSpec(**local.meta["shard"])
        return cls(local, cls._local_bias(bias, spec), group, spec, int(q.shape[1]), int(q.shape[0]), **kw)

    @staticmethod
    def _local_bias(bias, spec):
        return bias

    def _apply(self, fn, recurse=True):
        self.weight = self.weight.to(fn(torch.empty(0, device=self.weight.device)).device)
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.weight.fmt.name}, "
                f"rank={self.spec.rank}/{self.spec.world_size}, local={self.spec.local}")


class ColumnParallelQuantLinear(_ParallelQuantLinear):
    """``y = x @ W^T + b`` with ``W``'s output rows split over the ranks of ``group``.

    ``gather_output=True`` all-gathers the full output on every rank; False keeps this rank's
    ``out_features / world_size`` columns (what the next row-parallel layer takes as input)."""

    dim = "n"

    def __init__(self, weight, bias, group, spec, in_features, out_features, gather_output: bool = True):
        super().__init__(weight, bias, group, spec, in_features, out_features)
        self.gather_output = gather_output

    @classmethod
    def from_qtensor(cls, q: QTensor, bias: torch.Tensor | None = None, group: dist.ProcessGroup | None = None,
                     gather_output: bool = True, pad: bool = False, name: str = "weight") -> "ColumnParallelQuantLinear":
        """This rank's column-parallel layer from the full weight ``q`` ``[out, in]`` (every rank passes
        the same ``q``; see :mod:`microscale.distributed.loading` to read only the shard)."""
        return cls._build(q, bias, group, pad, name, gather_output=gather_output)

    @classmethod
    def from_quant_linear(cls, m, group: dist.ProcessGroup | None = None, gather_output: bool = True,
                          pad: bool = False, name: str = "weight") -> "ColumnParallelQuantLinear":
        """This rank's column-parallel layer from a :class:`~microscale.nn.QuantLinear` (its bias too)."""
        return cls._build(m, None, group, pad, name, gather_output=gather_output)

    @staticmethod
    def _local_bias(bias, spec):
        if bias is None:
            return None
        out = bias.new_zeros(spec.local)
        n = max(spec.real_stop - spec.start, 0)
        out[:n] = bias[spec.start:spec.start + n]
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _linear(x, self.weight, self.bias)
        if not self.gather_output:
            return y
        parts = [torch.empty_like(y) for _ in range(self.spec.world_size)]
        dist.all_gather(parts, y.contiguous(), group=self.group)
        return torch.cat(parts, -1).narrow(-1, 0, self.out_features)


class RowParallelQuantLinear(_ParallelQuantLinear):
    """``y = x @ W^T + b`` with ``W``'s input columns split over the ranks of ``group``.

    ``input_is_parallel=True`` takes this rank's slice of ``x`` (``local`` columns, as a
    column-parallel layer without gather gives); otherwise the full ``x`` and slices it. Partial
    products are all-reduced in float32, the bias added once after the sum."""

    dim = "k"

    def __init__(self, weight, bias, group, spec, in_features, out_features, input_is_parallel: bool = False):
        super().__init__(weight, bias, group, spec, in_features, out_features)
        self.input_is_parallel = input_is_parallel

    @classmethod
    def from_qtensor(cls, q: QTensor, bias: torch.Tensor | None = None, group: dist.ProcessGroup | None = None,
                     input_is_parallel: bool = False, pad: bool = False,
                     name: str = "weight") -> "RowParallelQuantLinear":
        """This rank's row-parallel layer from the full weight ``q`` ``[out, in]``."""
        return cls._build(q, bias, group, pad, name, input_is_parallel=input_is_parallel)

    @classmethod
    def from_quant_linear(cls, m, group: dist.ProcessGroup | None = None, input_is_parallel: bool = False,
                          pad: bool = False, name: str = "weight") -> "RowParallelQuantLinear":
        """This rank's row-parallel layer from a :class:`~microscale.nn.QuantLinear` (its bias too)."""
        return cls._build(m, None, group, pad, name, input_is_parallel=input_is_parallel)

    def local_input(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's columns of the full input ``x`` (zero columns where the shard is padding)."""
        sp = self.spec
        if x.shape[-1] != self.in_features:
            raise ValueError(f"RowParallelQuantLinear: input has {x.shape[-1]} features, expected {self.in_features}")
        n = max(min(sp.stop, self.in_features) - sp.start, 0)
        part = x.narrow(-1, min(sp.start, self.in_features), n)
        if n == sp.local:
            return part
        out = x.new_zeros((*x.shape[:-1], sp.local))
        out[..., :n] = part
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_is_parallel:
            if x.shape[-1] != self.spec.local:
                raise ValueError(f"RowParallelQuantLinear: parallel input has {x.shape[-1]} features, expected this "
                                 f"rank's {self.spec.local}")
        else:
            x = self.local_input(x)
        y = _linear(x, self.weight, None).float()  # the partial sums meet in float32
        dist.all_reduce(y, group=self.group)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)
