"""`QTensor`: a quantized tensor in its canonical (checkpoint) layout.

Blocks run along the last dimension (and, for 2-D block formats, over
``block_rows`` rows of the second-to-last). Fields:

* ``data`` — ``uint8`` packed codes ``[..., K*bits/8]`` (see :mod:`microscale.formats.layouts`).
* ``scales`` — raw block scales, row-major ``[..., K/block]`` (``[..., N/block_rows, K/block]``
  for 2-D blocks): ``uint8`` for E8M0, ``torch.float8_e4m3fn`` for UE4M3, else float16/32, bf16.
* ``global_scale`` — float32 0-d tensor, a decode *multiplier*, or ``None``.
* ``zero_points`` — ``uint8`` ``[..., K/block]`` for affine formats, else ``None``.
* ``shape`` / ``dtype`` — the original tensor's (``shape`` excludes any padding).

``K`` above is the original last dim rounded up to a whole block (rows likewise for 2-D
blocks); every other dim equals the original's. A QTensor is checked against these
shapes and dtypes when it is built (no device sync), and its values too when it is
loaded (:meth:`QTensor.validate`).

Files are safetensors (tensors + JSON metadata); pickles are never read or written.
"""
from __future__ import annotations

import json
import math
import operator
import os
from dataclasses import dataclass, field

import torch

from .formats import Format

__all__ = ["QTensor"]

_PARTS = ("data", "scales", "global_scale", "zero_points")  # the tensors of a file, by name

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

    def __post_init__(self) -> None:
        self._check_structure()

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
    def from_state_dict(cls, tensors: dict[str, torch.Tensor], metadata: dict[str, str], prefix: str = "",
                        source: str | None = None) -> "QTensor":
        """Inverse of :meth:`state_dict`: checks the metadata's fields (nothing is coerced),
        the tensors' dtypes and shapes against them, and the values (:meth:`validate`).
        Errors are ``ValueError``/``TypeError`` naming ``source`` (the file), the tensor and
        the field."""
        where = (source or "state dict") + (f" (prefix {prefix!r})" if prefix else "")
        try:
            return cls._from_state_dict(tensors, metadata, prefix)
        except (ValueError, TypeError) as e:
            raise type(e)(f"{where}: {e}") from None

    @classmethod
    def _from_state_dict(cls, tensors, metadata, prefix) -> "QTensor":
        key = prefix + "microscale"
        if not isinstance(metadata, dict) or key not in metadata:
            raise ValueError(f"no microscale metadata under {key!r}: not a microscale QTensor")
        try:
            m = json.loads(metadata[key])
        except (TypeError, ValueError) as e:
            raise ValueError(f"metadata {key!r} is not valid JSON ({e})") from None
        if not isinstance(m, dict):
            raise ValueError(f"metadata {key!r} must be a JSON object, got {type(m).__name__}")
        for k in ("format", "shape", "dtype"):
            if k not in m:
                raise ValueError(f"metadata {key!r} has no {k!r} field")
        unknown = sorted(set(m) - {"format", "shape", "dtype", "meta"})
        if unknown:
            raise ValueError(f"metadata {key!r} has unknown field(s) {', '.join(map(repr, unknown))}")
        fmt = Format.from_dict(m["format"])
        shape = m["shape"]
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise ValueError(f"metadata shape={shape!r} must be a list of integers")
        if m["dtype"] not in _DTYPES:
            raise ValueError(f"metadata dtype={m['dtype']!r} is not one of {', '.join(_DTYPES)}")
        meta = m.get("meta", {})
        if not isinstance(meta, dict):
            raise ValueError(f"metadata meta={meta!r} must be a JSON object")
        for name in ("data", "scales"):
            if prefix + name not in tensors:
                raise ValueError(f"tensor {prefix + name!r} is missing")
        g = tensors.get(prefix + "global_scale")
        if g is not None:
            if not isinstance(g, torch.Tensor):
                raise TypeError(f"global_scale must be a torch.Tensor, got {type(g).__name__}")
            if g.dtype != torch.float32 or g.numel() != 1:
                raise ValueError(f"global_scale must be float32 with one value, got {g.dtype} of shape "
                                 f"{tuple(g.shape)}")
            g = g.reshape(())
        q = cls(tensors[prefix + "data"], tensors[prefix + "scales"], fmt, torch.Size(shape), _DTYPES[m["dtype"]],
                g, tensors.get(prefix + "zero_points"), dict(meta))
        q.validate(values=True)
        return q

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        """Write a safetensors file atomically (a temporary file beside it, then one rename).

        An existing ``path`` is refused unless ``overwrite=True``; the new file gets the mode
        ``open`` would give under the umask."""
        from safetensors.torch import save_file

        from ._paths import atomic_output, check_output, output_mode

        tensors, meta = self.state_dict()
        check_output(None, path, overwrite, "QTensor.save", kind="file")
        with atomic_output(path, kind="file", overwrite=overwrite) as tmp:
            save_file(tensors, tmp, metadata=meta)
            os.chmod(tmp, output_mode())

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device = "cpu") -> "QTensor":
        """Read a file written by :meth:`save` (no code execution: safetensors + JSON)."""
        from ._safetensors import SafetensorsReader

        path = os.fspath(path)
        r = SafetensorsReader(path)  # validated header; regular files only; errors name file and tensor
        extra = sorted(set(r.keys()) - set(_PARTS))
        if extra:
            raise ValueError(f"{path}: unexpected tensor {extra[0]!r} (a QTensor file holds "
                             f"{', '.join(_PARTS)})")
        tensors = {k: r.get(k).to(device) for k in r.keys()}
        return cls.from_state_dict(tensors, dict(r.metadata), source=path)

    def validate(self, values: bool = False) -> None:
        """Check the fields against the format (types, dtypes, exact shapes, devices; no
        device sync) and, with ``values``, the values a file could get wrong (the global
        scale finite and > 0 and agreeing with the two-level entries of :attr:`meta`, zero
        points within the code range; a device sync).
        Raises ``TypeError``/``ValueError``. Runs at construction; loading adds ``values``."""
        self._check_structure()
        if values:
            self._check_values()

    def expected_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(data shape, scales shape) that :attr:`fmt` implies for :attr:`shape`."""
        return _expected_shapes(self.fmt, tuple(self.shape))

    def _check_structure(self) -> None:
        fmt = self.fmt
        if not isinstance(fmt, Format):
            raise TypeError(f"QTensor: fmt must be a microscale Format, got {type(fmt).__name__} {fmt!r}")
        for name in _PARTS:
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) and (t is not None or name in ("data", "scales")):
                raise TypeError(f"QTensor: {name} must be a torch.Tensor, got {type(t).__name__}")
        self.shape = _check_shape(self.shape, fmt)
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"QTensor: dtype must be a torch.dtype, got {self.dtype!r}")
        if self.dtype not in _DTYPES.values():
            raise ValueError(f"QTensor: dtype={self.dtype} is not one of {', '.join(_DTYPES)} (the original "
                             "tensor's dtype)")
        if not isinstance(self.meta, dict):
            raise TypeError(f"QTensor: meta must be a dict, got {type(self.meta).__name__}")
        dshape, sshape = _expected_shapes(fmt, tuple(self.shape))
        if fmt.zero_point != (self.zero_points is not None):
            raise ValueError(f"QTensor: zero_points must be {'given' if fmt.zero_point else 'None'} for "
                             f"{fmt.name} ({'' if fmt.zero_point else 'not '}an affine format)")
        if fmt.global_scale != (self.global_scale is not None):
            raise ValueError(f"QTensor: global_scale must be {'given' if fmt.global_scale else 'None'} for "
                             f"{fmt.name} ({'a' if fmt.global_scale else 'not a'} two-level format)")
        want = {"data": (torch.uint8, dshape), "scales": (fmt.scale.storage, sshape),
                "zero_points": (torch.uint8, sshape)}
        for name, (dtype, shp) in want.items():
            t = getattr(self, name)
            if t is None:
                continue
            if t.dtype != dtype:
                raise ValueError(f"QTensor: {name} dtype {t.dtype} != {dtype} expected for {fmt.name}"
                                 + (f" ({fmt.scale.name} scales)" if name == "scales" else ""))
            if tuple(t.shape) != shp:
                raise ValueError(f"QTensor: {name} shape {tuple(t.shape)} != {shp} expected for original shape "
                                 f"{tuple(self.shape)} in {fmt.name} ({fmt.element.bits}-bit codes, blocks of "
                                 f"{fmt.block_rows}x{fmt.block_size}, padded to whole blocks)")
        g = self.global_scale
        if g is not None:
            if g.dtype != torch.float32 or g.numel() != 1 or g.dim() > 1:
                raise ValueError(f"QTensor: global_scale must be a float32 tensor of one value (shape () or "
                                 f"(1,)), got {g.dtype} of shape {tuple(g.shape)}")
            if g.dim():
                self.global_scale = g = g.reshape(())
        dev = self.data.device
        for name in _PARTS[1:]:
            t = getattr(self, name)
            if t is not None and t.device != dev:
                raise ValueError(f"QTensor: {name} is on {t.device} but data is on {dev}; all parts must share "
                                 "one device")

    def _check_values(self) -> None:
        g = self.global_scale
        if g is not None:
            v = float(g)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"QTensor: global_scale={v} must be finite and > 0 (a decode multiplier)")
            two = self.meta.get("two_level", self.fmt.two_level.value)
            if two != self.fmt.two_level.value:
                raise ValueError(f"QTensor: meta two_level={two!r} disagrees with the format's "
                                 f"{self.fmt.two_level.value!r}")
            inv = self.meta.get("global_scale_inv")
            if inv is not None:  # compressed-tensors' stored scale: written back to its checkpoints
                if isinstance(inv, bool) or not isinstance(inv, (int, float)) or not math.isfinite(inv) or inv <= 0:
                    raise ValueError(f"QTensor: meta global_scale_inv={inv!r} must be a finite number > 0")
                want = float(1.0 / torch.tensor(inv, dtype=torch.float32))
                if want != v:
                    raise ValueError(f"QTensor: meta global_scale_inv={inv!r} is not the reciprocal of "
                                     f"global_scale={v!r} (1/{inv!r} = {want!r} in float32)")
        zp = self.zero_points
        if zp is not None and zp.numel():
            top = int(zp.max())
            if top > self.fmt.element.max_code:
                raise ValueError(f"QTensor: zero_points hold {top}, beyond the largest "
                                 f"{self.fmt.element.name} code {self.fmt.element.max_code}")


def _check_shape(shape: object, fmt: Format) -> torch.Size:
    """The original shape as a torch.Size of ints >= 0 (no coercion of floats or bools)."""
    if not isinstance(shape, (torch.Size, tuple, list)):
        raise TypeError(f"QTensor: shape must be a torch.Size, tuple or list of ints, got {shape!r}")
    dims = []
    for d in shape:
        if isinstance(d, torch.SymInt):
            dims.append(d)
            continue
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise TypeError(f"QTensor: shape {tuple(shape)!r} must hold ints, got {d!r} ({type(d).__name__})")
        d = operator.index(d)
        if d < 0:
            raise ValueError(f"QTensor: shape {tuple(shape)} has a negative dim")
        dims.append(d)
    need = 2 if fmt.block_rows > 1 else 1
    if len(dims) < need:
        raise ValueError(f"QTensor: shape {tuple(shape)} must have at least {need} dims for {fmt.name}")
    return torch.Size(dims)


def _expected_shapes(fmt: Format, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(data shape, scales shape) of the canonical layout of ``shape`` in ``fmt``."""
    b, br = fmt.block_size, fmt.block_rows
    kp = -(-shape[-1] // b) * b
    lead = list(shape[:-1])
    if br > 1:
        lead[-1] = -(-lead[-1] // br) * br
        slead = [*lead[:-1], lead[-1] // br]
    else:
        slead = lead
    return (*lead, kp * fmt.element.bits // 8), (*slead, kp // b)
