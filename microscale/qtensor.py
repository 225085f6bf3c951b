"""`QTensor`: a quantized tensor in its canonical (checkpoint) layout.

Blocks run along the last dimension (and, for 2-D block formats, over
``block_rows`` rows of the second-to-last). Fields:

* ``data`` — ``uint8`` packed codes ``[..., K*bits/8]`` (see :mod:`microscale.formats.layouts`).
* ``scales`` — raw block scales, row-major ``[..., K/block]`` (``[..., N/block_rows, K/block]``
  for 2-D blocks): ``uint8`` for E8M0, ``torch.float8_e4m3fn`` for UE4M3, else float16/32, bf16.
* ``global_scale`` — float32 0-d tensor, a decode *multiplier*, or ``None``.
* ``zero_points`` — ``uint8`` ``[..., K/block]`` for affine formats, else ``None``.
* ``shape`` / ``dtype`` — the original tensor's (``shape`` excludes any padding).

Files are safetensors (tensors + JSON metadata); pickles are never read or written.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field

import torch

from .formats import Format

__all__ = ["QTensor"]

_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64)}


@dataclass
class QTensor:
    """A tensor quantized to a block-scaled :class:`~microscale.formats.Format`."""

    data: torch.Tensor
    scales: torch.Tensor
    fmt: Format
    shape: torch.Size
    dtype: torch.dtype
    global_scale: torch.Tensor | None = None
    zero_points: torch.Tensor | None = None
    meta: dict = field(default_factory=dict)  # JSON-able extras (e.g. the two-level convention)

    # ---- size ----------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= int(s)
        return n

    @property
    def padded_shape(self) -> torch.Size:
        """Shape of the stored (block-padded) tensor."""
        k = self.data.shape[-1] * 8 // self.fmt.element.bits
        return torch.Size((*self.data.shape[:-1], k))

    @property
    def nbytes(self) -> int:
        """Bytes of storage: codes, scales, zero points and global scale."""
        t = [self.data, self.scales, self.global_scale, self.zero_points]
        return sum(x.numel() * x.element_size() for x in t if x is not None)

    @property
    def bits_per_element(self) -> float:
        """Actual storage bits per original element (padding and scales included)."""
        return 8.0 * self.nbytes / max(self.numel, 1)

    # ---- conversion ----------------------------------------------------------------
    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Decode to a dense tensor of ``dtype`` and the original shape.

        Runs the Triton kernel for CUDA tensors when available, the reference elsewhere.
        """
        from . import ops  # the ops layer dispatches by device

        return ops.dequantize(self, dtype)

    def to(self, device: torch.device | str) -> "QTensor":
        """A copy on ``device`` (the format and metadata are shared)."""
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return QTensor(mv(self.data), mv(self.scales), self.fmt, self.shape, self.dtype,
                       mv(self.global_scale), mv(self.zero_points), dict(self.meta))

    def __repr__(self) -> str:
        g = "" if self.global_scale is None else f", global_scale={float(self.global_scale):.6g}"
        return (f"QTensor(fmt={self.fmt.name!r}, shape={tuple(self.shape)}, dtype={self.dtype}, "
                f"device={self.device}, bits/elem={self.bits_per_element:.3f}{g})")

    # ---- files ---------------------------------------------------------------------
    def state_dict(self, prefix: str = "") -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Tensors and string metadata for a safetensors file (CPU, contiguous)."""
        tensors = {prefix + "data": self.data, prefix + "scales": self.scales}
        if self.global_scale is not None:
            tensors[prefix + "global_scale"] = self.global_scale.reshape(1)
        if self.zero_points is not None:
            tensors[prefix + "zero_points"] = self.zero_points
        tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
        meta = {"format": self.fmt.to_dict(), "shape": list(self.shape),
                "dtype": str(self.dtype).removeprefix("torch."), "meta": self.meta}
        return tensors, {prefix + "microscale": json.dumps(meta)}

    @classmethod
    def from_state_dict(cls, tensors: dict[str, torch.Tensor], metadata: dict[str, str], prefix: str = "") -> "QTensor":
        """Inverse of :meth:`state_dict`; validates shapes against the metadata."""
        key = prefix + "microscale"
        if key not in metadata:
            raise ValueError(f"no microscale metadata under {key!r}: not a microscale QTensor")
        m = json.loads(metadata[key])
        fmt = Format.from_dict(m["format"])
        if m["dtype"] not in _DTYPES:
            raise ValueError(f"unsupported original dtype {m['dtype']!r} in metadata")
        g = tensors.get(prefix + "global_scale")
        q = cls(tensors[prefix + "data"], tensors[prefix + "scales"], fmt, torch.Size(m["shape"]),
                _DTYPES[m["dtype"]], None if g is None else g.reshape(()).to(torch.float32),
                tensors.get(prefix + "zero_points"), dict(m.get("meta", {})))
        q.validate()
        return q

    def save(self, path: str | os.PathLike) -> None:
        """Write a safetensors file atomically (temporary file, then rename)."""
        from safetensors.torch import save_file

        tensors, meta = self.state_dict()
        path = os.fspath(path)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
        os.close(fd)
        try:
            save_file(tensors, tmp, metadata=meta)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device = "cpu") -> "QTensor":
        """Read a file written by :meth:`save` (no code execution: safetensors + JSON)."""
        from safetensors import safe_open

        with safe_open(os.fspath(path), framework="pt", device=str(device)) as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        return cls.from_state_dict(tensors, meta)

    def validate(self) -> None:
        """Check dtypes and shapes are consistent with the format; raise ValueError if not."""
        fmt = self.fmt
        if self.data.dtype != torch.uint8:
            raise ValueError(f"QTensor.data must be uint8, got {self.data.dtype}")
        if self.scales.dtype != fmt.scale.storage:
            raise ValueError(f"QTensor.scales must be {fmt.scale.storage} for {fmt.scale.name} scales, "
                             f"got {self.scales.dtype}")
        pk = self.padded_shape
        if len(self.shape) != len(pk) or any(s > p for s, p in zip(self.shape, pk)):
            raise ValueError(f"QTensor: data shape {tuple(pk)} cannot hold original shape {tuple(self.shape)}")
        want = list(pk[:-1]) + [pk[-1] // fmt.block_size]
        if fmt.block_rows > 1:
            want[-2] = pk[-2] // fmt.block_rows
        if list(self.scales.shape) != want:
            raise ValueError(f"QTensor: scales shape {tuple(self.scales.shape)} != expected {tuple(want)}")
        if fmt.zero_point != (self.zero_points is not None):
            raise ValueError("QTensor: zero_points must be present exactly for affine formats")
        if fmt.global_scale != (self.global_scale is not None):
            raise ValueError("QTensor: global_scale must be present exactly for two-level formats")
