"""Device code of the linear op (Triton and Gluon; private). Importing it needs a supported
Triton release (:func:`microscale.runtime.target.require_triton`)."""
from ...runtime.target import require_triton

require_triton("the linear op's GPU kernels")
