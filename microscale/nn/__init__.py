"""Modules: :class:`QuantLinear`, :class:`QuantExperts` (MoE experts as 3-D QTensors) and :func:`quantize_model`.

Use::

    import microscale as ms
    from microscale.nn import quantize_model
    model = quantize_model(model, "nvfp4", skip=["lm_head"])   # any nn.Module, HF included
    model = quantize_model(model, "mxfp4", method="gptq", calibration=batches, rotate="hadamard")
    model = quantize_model(model, "nvfp4", fuse=True)   # + RMSNorm folded into q/k/v and gate/up (fuse.py)
    fold_fp8_layers(model)   # MXFP4 / MXFP6 layers as fp8 weights x fp8 activations (fp8 tensor cores)
    sd = model.state_dict()                                      # plain tensors + format extra state
    msio.save(quantized_state(model), "ckpt", convention="modelopt")   # any convention
    load_quantized_state(fresh_float_model, msio.load("ckpt"))         # Linear -> QuantLinear
"""
from .experts import QuantExperts
from .quant_linear import QuantLinear, load_quantized_state, quantize_model, quantized_state
from .quant_conv import QuantConv2d
from .quant_embedding import QuantEmbedding
from .fuse import fuse_projections, unfuse_projections
from .fold import fold_fp8_layers

__all__ = ["QuantLinear", "QuantExperts", "QuantConv2d", "QuantEmbedding", "quantize_model", "quantized_state",
           "load_quantized_state", "fuse_projections", "unfuse_projections", "fold_fp8_layers"]
