"""Device code of the conv2d family (imports Triton; loaded on first GPU use)."""
from ...runtime.target import require_triton

require_triton("the conv2d op's GPU kernels")
