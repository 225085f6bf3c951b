"""GGUF MXFP4 (type 39) and NVFP4 (type 40) tensors through the ``gguf`` package.

llama.cpp's block layouts (gguf >= 0.18 defines both types; tested with 0.19.0):

* MXFP4, 32 elements, 17 bytes: ``{u8 e; u8 qs[16]}``, ``qs[j] = c[j] | c[j+16] << 4``,
  ``x = kvalues[c] * 2^(e-128)`` with ``kvalues = 2*E2M1`` — i.e. ``e`` is the E8M0 byte.
* NVFP4, 64 elements, 36 bytes: ``{u8 d[4]; u8 qs[32]}``, four UE4M3 sub-block scales,
  ``qs[8s+j] = c[16s+j] | c[16s+j+8] << 4``. The per-tensor decode multiplier is not
  part of the block; microscale stores it as an F32 tensor ``<name>.global_scale``
  (shape [1]) — the ``gguf`` package names no such tensor, so that name is our choice.

Tensor names are kept as given (no llama.cpp architecture renaming): the files hold
tensors, not a model llama.cpp can run.
"""
from __future__ import annotations

import os
from typing import Iterable, Iterator

import numpy as np
import torch

from ..formats import Format, get_format, pack_codes, unpack_codes
from ..qtensor import QTensor
from ._paths import atomic_output, check_output

__all__ = ["gguf_type", "qtensor_to_gguf_bytes", "gguf_bytes_to_qtensor", "save_gguf", "iter_gguf", "load_gguf"]

GLOBAL_SUFFIX = ".global_scale"


def _gguf():
    try:
        import gguf
    except ImportError as e:
        raise ImportError("GGUF support needs the gguf package (0.19 or newer): pip install 'gguf>=0.19' (or, "
                          "in the microscale checkout, pip install -e '.[gguf]')") from e
    return gguf


def gguf_type(fmt: Format):
    """The GGML type for ``fmt`` (MXFP4 or NVFP4), or ValueError."""
    g = _gguf()
    if fmt.element.name == "e2m1" and fmt.scale.name == "e8m0" and fmt.block_size == 32:
        return g.GGMLQuantizationType.MXFP4
    if fmt.element.name == "e2m1" and fmt.global_scale and fmt.block_size == 16:
        if not hasattr(g.GGMLQuantizationType, "NVFP4"):
            raise ValueError(f"gguf {getattr(g, '__version__', '?')} has no NVFP4 type (40); upgrade gguf")
        return g.GGMLQuantizationType.NVFP4
    raise ValueError(f"convention 'gguf' stores mxfp4 and nvfp4 only, not {fmt.name!r}")


def qtensor_to_gguf_bytes(q: QTensor) -> torch.Tensor:
    """uint8 ``[..., K/32*17]`` (MXFP4) or ``[..., K/64*36]`` (NVFP4) in llama.cpp's layout."""
    t = gguf_type(q.fmt)
    if tuple(q.padded_shape) != tuple(q.shape):
        raise ValueError(f"gguf: a tensor of shape {tuple(q.shape)} padded to {tuple(q.padded_shape)} cannot be "
                         "stored (GGUF records no original shape); use the native convention")
    k = q.padded_shape[-1]
    lead = q.data.shape[:-1]
    codes = unpack_codes(q.data, 4, k)
    if t.name == "MXFP4":
        c = codes.reshape(*lead, k // 32, 2, 16)
        qs = c[..., 0, :] | (c[..., 1, :] << 4)
        out = torch.cat([q.scales.reshape(*lead, k // 32, 1), qs], dim=-1)
        return out.reshape(*lead, k // 32 * 17)
    if k % 64:
        raise ValueError(f"gguf NVFP4 needs K a multiple of 64, got K={k}")
    c = codes.reshape(*lead, k // 64, 4, 2, 8)
    qs = (c[..., 0, :] | (c[..., 1, :] << 4)).reshape(*lead, k // 64, 32)
    d = q.scales.view(torch.uint8).reshape(*lead, k // 64, 4)
    return torch.cat([d, qs], dim=-1).reshape(*lead, k // 64 * 36)


def gguf_bytes_to_qtensor(raw: torch.Tensor, kind: str, shape, global_scale: torch.Tensor | None = None,
                          name: str = "tensor") -> QTensor:
    """Inverse of :func:`qtensor_to_gguf_bytes` (``kind`` is ``MXFP4`` or ``NVFP4``)."""
    raw = raw.contiguous()
    lead = raw.shape[:-1]
    if kind == "MXFP4":
        nb = raw.shape[-1] // 17
        b = raw.reshape(*lead, nb, 17)
        scales = b[..., 0].contiguous()
        qs = b[..., 1:]
        codes = torch.stack([qs & 0xF, qs >> 4], dim=-2).reshape(*lead, nb * 32)
        fmt = get_format("mxfp4")
        gscale = None
    elif kind == "NVFP4":
        nb = raw.shape[-1] // 36
        b = raw.reshape(*lead, nb, 36)
        scales = b[..., :4].contiguous().reshape(*lead, nb * 4).view(torch.float8_e4m3fn)
        qs = b[..., 4:].reshape(*lead, nb, 4, 8)
        codes = torch.stack([qs & 0xF, qs >> 4], dim=-2).reshape(*lead, nb * 64)
        fmt = get_format("nvfp4")
        if global_scale is None:
            raise ValueError(f"gguf: NVFP4 tensor {name!r} has no {name + GLOBAL_SUFFIX!r} tensor")
        gscale = global_scale.reshape(()).to(torch.float32)
    else:
        raise ValueError(f"gguf: tensor {name!r} has type {kind}, not MXFP4 or NVFP4")
    data = pack_codes(codes.contiguous(), 4)
    meta = {"two_level": "modelopt"} if gscale is not None else {}
    q = QTensor(data, scales, fmt, torch.Size(shape), torch.bfloat16, gscale, None, meta)
    q.validate()
    return q


def save_gguf(path: str | os.PathLike, items: Iterable[tuple[str, QTensor | torch.Tensor]],
              arch: str = "microscale", overwrite: bool = False) -> None:
    """Write tensors (QTensors in MXFP4/NVFP4, float tensors as F32/F16/BF16) to a GGUF
    file, atomically; tensor data is spooled to disk one tensor at a time. An existing
    ``path`` is refused unless ``overwrite=True`` (docs/safety.md). The temporary file
    is removed on errors, Ctrl-C, SIGTERM and SIGHUP, and by the next export to ``path``
    if its writer was killed."""
    g = _gguf()
    path = os.fspath(path)
    check_output(None, path, overwrite, "save_gguf", kind="file")
    with atomic_output(path, kind="file", overwrite=overwrite) as tmp:  # unique locked temp, cleaned on any exit
        _write_gguf(g, tmp, items, arch)


def _write_gguf(g, tmp: str, items: Iterable[tuple[str, QTensor | torch.Tensor]], arch: str) -> None:
    w = g.GGUFWriter(tmp, arch, use_temp_file=True)
    try:
        for name, t in items:
            if isinstance(t, QTensor):
                raw = qtensor_to_gguf_bytes(t).numpy()
                w.add_tensor(name, raw, raw_dtype=gguf_type(t.fmt))
                if t.global_scale is not None:
                    w.add_tensor(name + GLOBAL_SUFFIX, t.global_scale.reshape(1).float().numpy())
            elif t.dtype == torch.bfloat16:
                w.add_tensor(name, t.contiguous().view(torch.uint8).numpy(), raw_dtype=g.GGMLQuantizationType.BF16)
            elif t.dtype in (torch.float32, torch.float16, torch.int8, torch.int16, torch.int32, torch.int64,
                             torch.float64):
                w.add_tensor(name, t.contiguous().numpy())
            else:
                raise TypeError(f"gguf: cannot store tensor {name!r} of dtype {t.dtype}")
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()


def iter_gguf(path: str | os.PathLike) -> Iterator[tuple[str, QTensor | torch.Tensor]]:
    """Yield ``(name, QTensor or tensor)`` from a GGUF file, global-scale tensors folded in."""
    g = _gguf()
    try:
        r = g.GGUFReader(os.fspath(path))
    except Exception as e:  # the reader raises bare ValueError/AssertionError on corrupt files
        raise ValueError(f"{os.fspath(path)}: not a readable GGUF file: {e}") from e
    by_name = {t.name: t for t in r.tensors}
    T = g.GGMLQuantizationType
    for t in r.tensors:
        if t.name.endswith(GLOBAL_SUFFIX) and t.name[: -len(GLOBAL_SUFFIX)] in by_name:
            continue
        shape = [int(s) for s in reversed(t.shape.tolist())]
        kind = T(t.tensor_type)
        if kind in (T.MXFP4, T.NVFP4):
            gt = by_name.get(t.name + GLOBAL_SUFFIX)
            gs = None if gt is None else torch.from_numpy(np.array(gt.data, dtype=np.float32))
            raw = torch.from_numpy(np.array(t.data, dtype=np.uint8))
            yield t.name, gguf_bytes_to_qtensor(raw, kind.name, shape, gs, t.name)
        elif kind == T.BF16:
            yield t.name, torch.from_numpy(np.array(t.data)).view(torch.bfloat16).reshape(shape)
        else:
            yield t.name, torch.from_numpy(np.array(t.data)).reshape(shape)


def load_gguf(path: str | os.PathLike) -> dict[str, QTensor | torch.Tensor]:
    return dict(iter_gguf(path))
