"""Block Hadamard rotation: ``x -> x R`` with ``R = diag(H_b, H_b, ...)``, ``H_b`` the
normalized (orthonormal, symmetric) Sylvester Hadamard matrix of size ``b``.

Rotating a Linear's weight offline (``W R``) and its input online (``x R``) leaves the
output unchanged in exact arithmetic, ``(x R)(W R)^T = x W^T``, while spreading each
block's outliers over the block, which lowers the quantization error of block formats.
``b`` is the format's block size or a multiple of it (a power of two).

:func:`block_hadamard` runs the Triton fast Walsh-Hadamard kernel on CUDA tensors
(:mod:`microscale.accuracy._hadamard_kernel`) and the matrix product elsewhere.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

__all__ = ["hadamard_matrix", "block_hadamard", "block_hadamard_reference", "HadamardLinear", "check_block"]


def check_block(block: int, k: int, what: str = "block_hadamard") -> int:
    """``block`` validated: a power of two >= 2 that divides ``k``."""
    if isinstance(block, bool) or not isinstance(block, int):
        raise TypeError(f"{what}: block must be an int, got {block!r}")
    if block < 2 or block & (block - 1):
        raise ValueError(f"{what}: block={block} must be a power of two >= 2")
    if k % block:
        raise ValueError(f"{what}: the last dim K={k} is not a multiple of block={block}")
    return block


@functools.lru_cache(maxsize=16)
def _hadamard64(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n ** 0.5


def hadamard_matrix(n: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The normalized Sylvester Hadamard matrix ``H_n`` (``H_n @ H_n = I``), ``n`` a power of two."""
    check_block(n, n, "hadamard_matrix")
    return _hadamard64(n).to(dtype=dtype, device=device)


def block_hadamard_reference(x: torch.Tensor, block: int) -> torch.Tensor:
    """``x R`` by the matrix product (float32, float64 for float64 input), cast back to x's dtype."""
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise TypeError(f"block_hadamard: x must be a floating torch.Tensor, got {getattr(x, 'dtype', type(x))}")
    check_block(block, x.shape[-1])
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = hadamard_matrix(block, ct, x.device)
    xb = x.to(ct).reshape(*x.shape[:-1], x.shape[-1] // block, block)
    return (xb @ h).reshape(x.shape).to(x.dtype)


def block_hadamard(x: torch.Tensor, block: int) -> torch.Tensor:
    """``x R`` along the last dim: the Triton kernel for CUDA float32/16/bf16 tensors,
    :func:`block_hadamard_reference` elsewhere."""
    if isinstance(x, torch.Tensor) and x.is_cuda and x.dtype != torch.float64:
        from ._hadamard_kernel import block_hadamard_triton

        return block_hadamard_triton(x, block)
    return block_hadamard_reference(x, block)


class HadamardLinear(nn.Module):
    """``inner(x R)``: the online half of a rotation whose offline half (``W R``) is in
    ``inner``'s weight (an ``nn.Linear`` or :class:`~microscale.nn.QuantLinear`)."""

    def __init__(self, inner: nn.Module, block: int):
        super().__init__()
        self.inner = inner
        self.block = check_block(block, inner.in_features, "HadamardLinear")
        self.in_features, self.out_features = inner.in_features, inner.out_features

    @classmethod
    def rotate(cls, linear: nn.Linear, block: int) -> "HadamardLinear":
        """A float rotated copy of ``linear``: weight ``W R``, same bias, same outputs."""
        check_block(block, linear.in_features, "HadamardLinear")
        lin = nn.Linear(linear.in_features, linear.out_features, linear.bias is not None,
                        device=linear.weight.device, dtype=linear.weight.dtype)
        with torch.no_grad():
            lin.weight.copy_(block_hadamard_reference(linear.weight.detach().double(), block))
            if linear.bias is not None:
                lin.bias.copy_(linear.bias.detach())
        return cls(lin, block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(block_hadamard(x, self.block))

    def extra_repr(self) -> str:
        return f"block={self.block}"
