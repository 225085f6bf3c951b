"""Checkpoint conventions, streaming conversion and inspection.

Use::

    from microscale import io as msio
    msio.save({"w": q, "b": bias}, "out_dir", convention="modelopt")
    tensors = msio.load("out_dir")                 # convention detected
    msio.convert("llama-bf16/", "llama-nvfp4/", fmt="nvfp4", convention="compressed-tensors")
    conv, rows = msio.inspect("llama-nvfp4/")
"""
from .._paths import UnsafePathError
from .checkpoint import DEFAULT_SKIP, Checkpoint, convert, inspect, load, open_checkpoint, save, should_quantize
from .conventions import CONVENTIONS, Convention, get_convention, register_convention
from .._safetensors import SafetensorsError, SafetensorsReader, SafetensorsWriter

__all__ = ["DEFAULT_SKIP", "Checkpoint", "convert", "inspect", "load", "open_checkpoint", "save", "should_quantize",
           "CONVENTIONS", "Convention", "get_convention", "register_convention", "SafetensorsError",
           "SafetensorsReader", "SafetensorsWriter", "UnsafePathError"]
