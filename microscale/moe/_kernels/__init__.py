"""Device code of the MoE ops (Triton; private). Importing it needs a supported Triton release."""
from ...runtime.target import require_triton

require_triton("the MoE op's GPU kernels")
