"""The embedding family: ``embedding(ids, table)`` gathers rows of a quantized ``[V, D]`` table
and dequantizes them in the same kernel (:mod:`.op`)."""
from .op import embedding, embedding_reference, embedding_triton

__all__ = ["embedding", "embedding_reference", "embedding_triton"]
