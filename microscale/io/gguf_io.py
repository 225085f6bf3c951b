"""GGUF MXFP4 (type 39) and NVFP4 (type 40) tensors through the ``gguf`` package.

llama.cpp's block layouts (gguf >= 0.18 defines both types; tested with 0.19.0):

* MXFP4, 32 elements, 17 bytes: ``{u8 e; u8 qs[16]}``, ``qs[j] = c[j] | c[j+16] << 4``,
  ``x = kvalues[c] * 2^(e-128)`` with ``kvalues = 2*E2M1`` — i.e. ``e`` is the E8M0 byte.
* NVFP4, 64 elements, 36 bytes: ``{u8 d[4]; u8 qs[32]}``, four UE4M3 sub-block scales
  (bytes 0..0x7E; ggml decodes ``x = e2m1 * ue4m3``), ``qs[8s+j] = c[16s+j] | c[16s+j+8] << 4``.
  ggml's own NVFP4 tensors carry no per-tensor scale: they load with a global scale of
  1.0. llama.cpp's converter from ModelOpt stores the per-tensor decode multiplier
  (``weight_scale_2``) as an F32 tensor ``<stem>.scale`` beside ``<stem>.weight`` and the
  activation scale as ``<stem>.input_scale``, and multiplies the matmul output by
  ``.scale`` at run time; microscale writes those names (``.scale`` only when it is not
  1.0, as llama.cpp does) and reads them, and also reads the ``<name>.global_scale``
  that earlier microscale versions wrote.

Every tensor's byte size, computed from its shape and type, must fill its data span (its
offset to the next tensor's, or to the end of the file, less alignment padding): a header
that lies about a shape fails with the file and tensor named instead of reading another
tensor's bytes.

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
from .._paths import atomic_output, check_output

__all__ = ["scale_names", "gguf_type", "qtensor_to_gguf_bytes", "gguf_bytes_to_qtensor", "save_gguf", "iter_gguf",
           "load_gguf"]

SCALE_SUFFIX = ".scale"  # llama.cpp: NVFP4 per-tensor decode multiplier (ModelOpt weight_scale_2)
INPUT_SCALE_SUFFIX = ".input_scale"  # llama.cpp: NVFP4 activation scale (ModelOpt input_scale)
GLOBAL_SUFFIX = ".global_scale"  # read only: what earlier microscale versions wrote


def _stem(name: str) -> str:
    return name[: -len(".weight")] if name.endswith(".weight") else name


def scale_names(name: str) -> tuple[str, str]:
    """``(per-tensor scale, input scale)`` tensor names llama.cpp gives an NVFP4 weight ``name``."""
    return _stem(name) + SCALE_SUFFIX, _stem(name) + INPUT_SCALE_SUFFIX


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
    if bool((d > 0x7E).any()):
        raise ValueError("gguf: NVFP4 block scales must be non-negative finite E4M3 (bytes 0x00..0x7E) to be stored "
                         f"as GGUF's UE4M3; this tensor has byte 0x{int(d.max()):02X}")
    return torch.cat([d, qs], dim=-1).reshape(*lead, k // 64 * 36)


def gguf_bytes_to_qtensor(raw: torch.Tensor, kind: str, shape, global_scale: torch.Tensor | None = None,
                          name: str = "tensor", input_scale: torch.Tensor | None = None) -> QTensor:
    """Inverse of :func:`qtensor_to_gguf_bytes` (``kind`` is ``MXFP4`` or ``NVFP4``).

    An NVFP4 tensor without ``global_scale`` (ggml's own, ``x = e2m1 * ue4m3``) gets a
    global scale of 1.0; ``input_scale`` (llama.cpp's ``<stem>.input_scale``) is kept in
    the QTensor's meta as ModelOpt's ``input_scale``."""
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
        d = b[..., :4].contiguous()
        bad = (d > 0x7E).nonzero()
        if bad.numel():
            i = tuple(int(v) for v in bad[0])
            raise ValueError(f"gguf: NVFP4 tensor {name!r} has block-scale byte 0x{int(d[i]):02X} at block {i}; "
                             "UE4M3 scales are bytes 0x00..0x7E (ggml decodes the others differently from E4M3)")
        scales = d.reshape(*lead, nb * 4).view(torch.float8_e4m3fn)
        qs = b[..., 4:].reshape(*lead, nb, 4, 8)
        codes = torch.stack([qs & 0xF, qs >> 4], dim=-2).reshape(*lead, nb * 64)
        fmt = get_format("nvfp4")
        if global_scale is None:  # ggml's own NVFP4: x = e2m1 * ue4m3, no per-tensor scale
            gscale = torch.ones((), dtype=torch.float32)
        else:
            if global_scale.numel() != 1:
                raise ValueError(f"gguf: NVFP4 tensor {name!r}: its per-tensor scale {scale_names(name)[0]!r} holds "
                                 f"{global_scale.numel()} values (per-expert scales); microscale reads one value")
            gscale = global_scale.reshape(()).to(torch.float32)
    else:
        raise ValueError(f"gguf: tensor {name!r} has type {kind}, not MXFP4 or NVFP4")
    data = pack_codes(codes.contiguous(), 4)
    meta = {"two_level": "modelopt"} if gscale is not None else {}
    if input_scale is not None:
        meta["input_scale"] = {"shape": list(input_scale.shape),
                               "values": [float(v) for v in input_scale.reshape(-1).to(torch.float32)]}
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
                for sname, sval in _side_scales(name, t).items():
                    w.add_tensor(sname, sval.reshape(-1).float().numpy())
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


def _side_scales(name: str, q: QTensor) -> dict[str, torch.Tensor]:
    """llama.cpp's F32 side tensors for an NVFP4 weight: ``<stem>.scale`` (omitted when
    1.0, as llama.cpp omits it) and ``<stem>.input_scale`` when the QTensor carries one."""
    out: dict[str, torch.Tensor] = {}
    if q.global_scale is None:
        return out
    sname, iname = scale_names(name)
    if float(q.global_scale) != 1.0:
        out[sname] = q.global_scale.reshape(1).float()
    if "input_scale" in q.meta:
        m = q.meta["input_scale"]
        out[iname] = torch.tensor(m["values"], dtype=torch.float32)
    elif "input_global_scale" in q.meta:  # compressed-tensors' reciprocal, as ModelOpt spells it
        out[iname] = 1.0 / torch.tensor(q.meta["input_global_scale"]["values"], dtype=torch.float32)
    return out


def _check_spans(path: str, r, g) -> None:
    """Every tensor's size from its shape and type must fill its data span (offset to the
    next tensor's, or to the end of the file, less the alignment padding)."""
    align = int(getattr(r, "alignment", 32) or 32)
    end = int(r.data.shape[0])
    ts = sorted(r.tensors, key=lambda t: int(t.data_offset))
    for i, t in enumerate(ts):
        kind = g.GGMLQuantizationType(t.tensor_type)
        block, tsize = g.GGML_QUANT_SIZES[kind]
        dims = [int(x) for x in t.shape.tolist()]
        if dims and dims[0] % block:
            raise ValueError(f"{path}: tensor {t.name!r} has shape {list(reversed(dims))} whose last dim is not a "
                             f"multiple of {kind.name}'s block of {block}")
        n = int(np.prod(dims)) if dims else 1
        want = n // block * tsize
        start = int(t.data_offset)
        stop = int(ts[i + 1].data_offset) if i + 1 < len(ts) else end
        span = stop - start
        if not want <= span < want + align:
            nxt = f"the next tensor {ts[i + 1].name!r} starts" if i + 1 < len(ts) else "the file ends"
            raise ValueError(f"{path}: tensor {t.name!r} of type {kind.name} and shape {list(reversed(dims))} needs "
                             f"{want} bytes at offset {start}, but {nxt} {span} bytes later (a lying header or a "
                             "truncated file)")


def iter_gguf(path: str | os.PathLike) -> Iterator[tuple[str, QTensor | torch.Tensor]]:
    """Yield ``(name, QTensor or tensor)`` from a GGUF file. An NVFP4 weight's side tensors
    (llama.cpp's ``<stem>.scale`` and ``<stem>.input_scale``, or ``<name>.global_scale``)
    are folded into its QTensor; an NVFP4 weight without a per-tensor scale (ggml's own)
    gets 1.0. Every tensor's data span is checked against its shape first."""
    g = _gguf()
    path = os.fspath(path)
    try:
        r = g.GGUFReader(path)
    except Exception as e:  # the reader raises bare ValueError/AssertionError/numpy errors on corrupt files
        raise ValueError(f"{path}: not a readable GGUF file: {e}") from e
    _check_spans(path, r, g)
    by_name = {t.name: t for t in r.tensors}
    T = g.GGMLQuantizationType
    side: dict[str, tuple[str | None, str | None]] = {}  # NVFP4 weight -> (scale tensor, input scale tensor)
    for t in r.tensors:
        if T(t.tensor_type) == T.NVFP4:
            sname, iname = scale_names(t.name)
            found = [n for n in (sname, t.name + GLOBAL_SUFFIX) if n in by_name]
            if len(found) > 1:
                raise ValueError(f"{path}: NVFP4 tensor {t.name!r} has two per-tensor scales {found}")
            side[t.name] = (found[0] if found else None, iname if iname in by_name else None)
    consumed = {n for pair in side.values() for n in pair if n is not None}
    for n in consumed:
        st = by_name[n]
        if T(st.tensor_type) != T.F32:
            raise ValueError(f"{path}: scale tensor {n!r} has type {T(st.tensor_type).name}; expected F32")

    def f32(n):
        return None if n is None else torch.from_numpy(np.array(by_name[n].data, dtype=np.float32))

    for t in r.tensors:
        if t.name in consumed:
            continue
        shape = [int(s) for s in reversed(t.shape.tolist())]
        kind = T(t.tensor_type)
        if kind in (T.MXFP4, T.NVFP4):
            sn, inn = side.get(t.name, (None, None))
            raw = torch.from_numpy(np.array(t.data, dtype=np.uint8))
            yield t.name, gguf_bytes_to_qtensor(raw, kind.name, shape, f32(sn), t.name, f32(inn))
        elif kind == T.BF16:
            yield t.name, torch.from_numpy(np.array(t.data)).view(torch.bfloat16).reshape(shape)
        else:
            yield t.name, torch.from_numpy(np.array(t.data)).reshape(shape)


def load_gguf(path: str | os.PathLike) -> dict[str, QTensor | torch.Tensor]:
    """Every tensor of a GGUF file (see :func:`iter_gguf`)."""
    return dict(iter_gguf(path))
