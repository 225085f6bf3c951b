"""``QuantEmbedding``: an Embedding whose table is a QTensor ``[V, D]``, gathered and dequantized
row by row by :func:`microscale.embedding`."""
from __future__ import annotations

import torch
from torch import nn

from ..embedding import embedding
from ..formats import Format, get_format
from ..qtensor import QTensor
from ._qweight import DTYPES, QuantWeightModule

__all__ = ["QuantEmbedding"]

_OUT = (torch.float32, torch.float16, torch.bfloat16)


class QuantEmbedding(QuantWeightModule):
    """``dequant(W)[ids]`` with the table ``W`` a QTensor ``[num_embeddings, embedding_dim]``:
    only the gathered rows are decoded (one Triton launch on CUDA; the reference elsewhere), equal
    bit for bit to ``dequantize(W)[ids]``.

    The output dtype is the table's original dtype and follows ``.to(dtype)`` / ``.half()``
    casts of the module, as an ``nn.Embedding``'s would (the codes and scales keep theirs).
    ``padding_idx`` is kept and checked; as in ``F.embedding`` it affects gradients only.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 fmt: str | Format = "nvfp4", device=None, dtype: torch.dtype = torch.float32,
                 meta: dict | None = None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        if padding_idx is not None and padding_idx < 0:
            padding_idx += self.num_embeddings
        self.padding_idx = padding_idx
        self.fmt = get_format(fmt)
        self.weight_dtype = dtype
        self.out_dtype = dtype
        self.meta = dict(meta or {})
        self._init_weight(self.num_embeddings, self.embedding_dim, self.fmt, device)

    def weight_shape(self) -> tuple[int, int]:
        return (self.num_embeddings, self.embedding_dim)

    @classmethod
    def from_embedding(cls, emb: nn.Embedding, fmt: str | Format = "nvfp4", **quantize_kwargs) -> "QuantEmbedding":
        """Quantize ``emb.weight`` (D padded to a whole block when needed). An embedding with
        ``max_norm`` (which rescales rows of its table in place at lookup) is refused."""
        from ..ops import quantize

        if emb.max_norm is not None:
            raise ValueError(f"QuantEmbedding: max_norm={emb.max_norm} renormalizes the table in place at every "
                             "lookup, which a quantized table cannot do; skip this module")
        quantize_kwargs.pop("pad", None)
        q = quantize(emb.weight.detach(), fmt, pad=True, **quantize_kwargs)
        return cls.from_qtensor(q, emb.padding_idx)

    @classmethod
    def from_qtensor(cls, q: QTensor, padding_idx: int | None = None) -> "QuantEmbedding":
        if len(q.shape) != 2:
            raise ValueError(f"QuantEmbedding: the table must be 2-D [V, D], got shape {tuple(q.shape)}")
        m = cls(q.shape[0], q.shape[1], padding_idx, q.fmt, device="meta", dtype=q.dtype, meta=q.meta)
        m._set_weight(q)
        return m

    def _applied(self, fn) -> None:
        self.out_dtype = fn(torch.empty(0, dtype=self.out_dtype)).dtype  # a cast changes it, a move does not

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        dt = self.out_dtype if self.out_dtype in _OUT else torch.float32
        return embedding(ids, self.qweight, self.padding_idx, dtype=dt).to(self.out_dtype)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s + f", fmt={self.fmt.name}"

    def get_extra_state(self) -> dict:
        return {"format": self.fmt.to_dict(), "num_embeddings": self.num_embeddings,
                "embedding_dim": self.embedding_dim, "dtype": str(self.weight_dtype).removeprefix("torch."),
                "out_dtype": str(self.out_dtype).removeprefix("torch."), "meta": dict(self.meta)}

    def set_extra_state(self, state: dict) -> None:
        fmt = Format.from_dict(state["format"])
        theirs = (state["num_embeddings"], state["embedding_dim"])
        if fmt != self.fmt or theirs != (self.num_embeddings, self.embedding_dim):
            raise ValueError(f"QuantEmbedding: state is {fmt.name} {list(theirs)} but this module is {self.fmt.name} "
                             f"{[self.num_embeddings, self.embedding_dim]}; build the module the same way "
                             "(quantize_model) before load_state_dict")
        self.weight_dtype = DTYPES[state["dtype"]]
        self.out_dtype = DTYPES[state.get("out_dtype", state["dtype"])]
        self.meta = dict(state.get("meta", {}))
        self._q = None
