"""Device code of the quant family (private): one kernel per module (:mod:`.quantize`,
:mod:`.dequantize`, :mod:`.amax`) and the Triton helpers they share (:mod:`.common`,
:mod:`.elements`, :mod:`.scales`). These modules import Triton; the host modules import
them on first GPU use only, never at package import."""
