"""Streaming safetensors reading and writing with strict header validation.

The reader parses the header itself (8-byte little-endian length, JSON) and checks
every entry against the file before any tensor is read, so a corrupt, truncated or
lying file fails with a message that names the file and the tensor. Tensors are read
one at a time with plain file reads (no mmap), so memory holds only what the caller
keeps. The writer streams tensors one at a time into a data file and assembles the
final file (header + data) at close; the result is written under a temporary name and
renamed into place. Only regular files are opened (a FIFO or device is refused).
"""
from __future__ import annotations

import json
import os
import struct
import tempfile
from dataclasses import dataclass

import torch

from ._paths import UnsafePathError, open_regular, output_mode

__all__ = ["SafetensorsError", "TensorInfo", "SafetensorsReader", "SafetensorsWriter", "DTYPES"]

#: safetensors dtype string <-> torch dtype
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
}
_NAMES = {v: k for k, v in DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit


class SafetensorsError(ValueError):
    """A safetensors file is corrupt, truncated or inconsistent."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute file offset of the first byte
    nbytes: int

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


class SafetensorsReader:
    """Validated, lazy access to one safetensors file (``keys``, ``info``, ``get``)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            f = open_regular(self.path)  # a FIFO, device or directory is refused, never waited on
        except UnsafePathError as e:
            raise SafetensorsError(f"not a safetensors file: {e}") from e
        except OSError as e:
            raise SafetensorsError(f"{self.path}: cannot open: {e}") from e
        with f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise SafetensorsError(f"{self.path}: truncated: {size} bytes, a safetensors file starts with an "
                                       "8-byte header length")
            (hlen,) = struct.unpack("<Q", head)
            if 8 + hlen > size:
                raise SafetensorsError(f"not a safetensors file: {self.path} (its first 8 bytes, read as the header "
                                       f"length, say {hlen} bytes but the file has {size}; truncated or another "
                                       "format)")
            if hlen > _MAX_HEADER:
                raise SafetensorsError(f"{self.path}: header of {hlen} bytes exceeds safetensors' limit of "
                                       f"{_MAX_HEADER} bytes")
            raw = f.read(hlen)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{self.path}: header is not valid JSON ({e}); corrupt or not safetensors") from e
        if not isinstance(header, dict):
            raise SafetensorsError(f"{self.path}: header must be a JSON object")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise SafetensorsError(f"{self.path}: __metadata__ must map strings to strings")
        self.metadata: dict[str, str] = meta
        base = 8 + hlen
        data_len = size - base
        infos: dict[str, TensorInfo] = {}
        spans = []
        for name, e in header.items():
            where = f"{self.path}: tensor {name!r}"
            if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= set(e):
                raise SafetensorsError(f"{where}: entry must have dtype, shape and data_offsets")
            if e["dtype"] not in DTYPES:
                raise SafetensorsError(f"{where}: unsupported dtype {e['dtype']!r}")
            shape, offs = e["shape"], e["data_offsets"]
            if (not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape)
                    or not isinstance(offs, list) or len(offs) != 2 or not all(isinstance(o, int) for o in offs)):
                raise SafetensorsError(f"{where}: bad shape {shape!r} or data_offsets {offs!r}")
            dt = DTYPES[e["dtype"]]
            n = 1
            for s in shape:
                n *= s
            want = n * dt.itemsize
            b, end = offs
            if not 0 <= b <= end:
                raise SafetensorsError(f"{where}: data_offsets {offs} are not increasing")
            if end - b != want:
                raise SafetensorsError(f"{where}: header says {e['dtype']} {shape} = {want} bytes but data_offsets "
                                       f"{offs} span {end - b} bytes (lying header)")
            if end > data_len:
                raise SafetensorsError(f"{where}: data ends at byte {end} of the data section but the file has only "
                                       f"{data_len} data bytes (truncated file)")
            infos[name] = TensorInfo(name, dt, tuple(shape), base + b, want)
            spans.append((b, end, name))
        spans.sort()
        pos = 0
        for b, end, name in spans:
            if b < pos:
                raise SafetensorsError(f"{self.path}: tensor {name!r} overlaps the previous tensor (lying header)")
            pos = end
        self.infos = infos

    def keys(self) -> list[str]:
        return list(self.infos)

    def info(self, name: str) -> TensorInfo:
        if name not in self.infos:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        return self.infos[name]

    def get(self, name: str) -> torch.Tensor:
        """Read one tensor into fresh CPU memory."""
        ti = self.info(name)
        buf = bytearray(ti.nbytes)
        with open_regular(self.path) as f:
            f.seek(ti.start)
            got = f.readinto(buf)
        if got != ti.nbytes:
            raise SafetensorsError(f"{self.path}: tensor {name!r}: read {got} of {ti.nbytes} bytes (file changed or "
                                   "truncated)")
        if ti.nbytes == 0:
            return torch.empty(ti.shape, dtype=ti.dtype)
        return torch.frombuffer(buf, dtype=ti.dtype).reshape(ti.shape)


class SafetensorsWriter:
    """Write a safetensors file one tensor at a time (memory: one tensor).

    Usage: ``w = SafetensorsWriter(path, metadata); w.add(name, t); ...; w.close()``.
    Data goes to a scratch file beside ``path``; ``close`` writes header + data to a
    temporary file and renames it to ``path``. ``abort`` removes the scratch files.
    """

    def __init__(self, path: str | os.PathLike, metadata: dict[str, str] | None = None):
        self.path = os.fspath(path)
        self.metadata = dict(metadata or {})
        d = os.path.dirname(os.path.abspath(self.path))
        fd, self._data_path = tempfile.mkstemp(dir=d, suffix=".data.tmp")
        self._data = os.fdopen(fd, "wb")
        self._entries: dict[str, dict] = {}
        self._pos = 0

    def add(self, name: str, t: torch.Tensor) -> None:
        if name in self._entries or name == "__metadata__":
            raise ValueError(f"{self.path}: duplicate tensor name {name!r}")
        if t.dtype not in _NAMES:
            raise TypeError(f"{self.path}: tensor {name!r} has dtype {t.dtype}, which safetensors cannot store")
        t = t.detach().cpu().contiguous()
        n = t.numel() * t.element_size()
        if n:
            self._data.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        self._entries[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                               "data_offsets": [self._pos, self._pos + n]}
        self._pos += n

    def close(self) -> None:
        self._data.close()
        header = dict(self._entries)
        if self.metadata:
            header = {"__metadata__": self.metadata, **header}
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * ((-len(raw)) % 8)
        d = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".st.tmp")
        try:
            with os.fdopen(fd, "wb") as out, open(self._data_path, "rb") as src:
                out.write(struct.pack("<Q", len(raw)))
                out.write(raw)
                while chunk := src.read(1 << 24):
                    out.write(chunk)
            os.chmod(tmp, output_mode())  # mkstemp's 0600 -> what open() would give under the umask
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        finally:
            os.unlink(self._data_path)

    def abort(self) -> None:
        self._data.close()
        if os.path.exists(self._data_path):
            os.unlink(self._data_path)
