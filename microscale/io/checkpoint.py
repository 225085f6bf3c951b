"""Checkpoints on disk: a directory of (sharded) safetensors with an optional
``model.safetensors.index.json``, a single ``.safetensors`` file, or a ``.gguf`` file.

* :func:`open_checkpoint` — lazy, validated view (tensor names, shapes, dtypes, files,
  convention detected from names, metadata and ``config.json``/``hf_quant_config.json``).
* :func:`load` / :func:`save` — whole checkpoints in memory (small models, tests).
* :func:`convert` — streaming conversion, tensor by tensor (see its docstring).
* :func:`inspect` — one row per logical tensor: name, format or dtype, shape, bytes.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from .._names import skip_matches
from ..formats import Format, get_format
from ..qtensor import QTensor
from .._paths import (UnsafePathError, atomic_output, check_output, copy_regular, open_regular, read_regular,
                     resolve_inside, side_files)
from .conventions import DETECT_ORDER, Convention, Group, get_convention, has_activation_scale, json_dumps
from .._safetensors import SafetensorsError, SafetensorsReader, SafetensorsWriter

__all__ = ["Checkpoint", "open_checkpoint", "load", "save", "convert", "inspect", "DEFAULT_SKIP", "should_quantize"]

INDEX = "model.safetensors.index.json"
#: Tensors never quantized by default (fnmatch patterns on the full tensor name);
#: ``--skip`` adds to these. Embeddings, norms, biases and the output head stay as they are.
DEFAULT_SKIP = ("*embed*", "*norm*", "*lm_head*", "*.bias", "*wte*", "*wpe*")
_FLOAT = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass
class Checkpoint:
    """A checkpoint's tensor directory; tensors are read on demand."""

    path: str
    readers: dict[str, SafetensorsReader]  # file name -> reader
    where: dict[str, str]  # tensor name -> file name
    metadata: dict[str, str]  # union of the shards' __metadata__
    files: dict[str, dict]  # json side files (config.json, hf_quant_config.json)
    convention: str  # detected: one of DETECT_ORDER or "float"
    groups: list[Group] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return list(self.where)

    def get(self, name: str) -> torch.Tensor:
        return self.readers[self.where[name]].get(name)

    def info(self, name: str):
        return self.readers[self.where[name]].info(name)

    def shard_names(self, shard: str) -> list[str]:
        return self.readers[shard].keys()

    def qtensor(self, g: Group, lazy: bool = False) -> QTensor:
        """Decode one group. ``lazy``: large members become meta tensors (shape and dtype
        only, nothing read) — enough to learn the format and shape."""
        def fetch(k):
            ti = self.info(k)
            if lazy and ti.nbytes > 4096:
                return torch.empty(ti.shape, dtype=ti.dtype, device="meta")
            return self.get(k)

        tensors = {role: fetch(k) for role, k in g.members.items()}
        conv = get_convention(self.convention)
        try:
            q = conv.decode(g, tensors, self.metadata)
        except (ValueError, TypeError) as e:  # name the file(s) the tensors came from
            files = sorted({self.where[k] for k in g.members.values()})
            where = self.path if os.path.isfile(self.path) else ", ".join(os.path.join(self.path, f) for f in files)
            raise type(e)(f"{where}: {e}") from None
        act = conv.activation_format(q, self.files)
        if act is not None:  # the layer runs W4A4 (nn.load_quantized_state reads it)
            q.meta["act_format"] = act
        return q


def _read_json(path: str) -> dict:
    try:
        obj = json.loads(read_regular(path).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def open_checkpoint(path: str | os.PathLike, convention: str | None = None) -> Checkpoint:
    """Open a checkpoint directory or a single safetensors file (validating every header).

    Every file name read from the directory or from ``model.safetensors.index.json``
    must resolve inside it (no absolute path, no ``..``, no symlink leaving it; see
    docs/safety.md), and only regular files are opened."""
    path = os.fspath(path)
    files: dict[str, dict] = {}
    if os.path.isdir(path):
        for j in ("config.json", "hf_quant_config.json"):
            if os.path.lexists(os.path.join(path, j)):
                files[j] = _read_json(resolve_inside(path, j, path))
        idx = os.path.join(path, INDEX)
        if os.path.lexists(idx):
            wm = _read_json(resolve_inside(path, INDEX, path)).get("weight_map")
            if not isinstance(wm, dict):
                raise ValueError(f"{idx}: no 'weight_map' object")
            for s in wm.values():
                resolve_inside(path, s, f"{idx}: weight_map")
            shards = sorted(set(wm.values()))
        else:
            shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
            wm = None
        if not shards:
            raise FileNotFoundError(f"{path}: no .safetensors files")
        real = {s: resolve_inside(path, s, path) for s in shards}
    elif os.path.lexists(path):
        shards, wm = [os.path.basename(path)], None
        real = {shards[0]: path}  # the file the user named (a link to it is followed)
    else:
        raise FileNotFoundError(f"{path}: no such file or directory")
    readers, where, meta = {}, {}, {}
    for s in shards:
        fp = real[s]
        if not os.path.exists(fp):
            raise FileNotFoundError(f"{os.path.join(path, s)}: listed in {INDEX} but missing")
        r = SafetensorsReader(fp)
        readers[s] = r
        meta.update(r.metadata)
        for k in r.keys():
            if k in where:
                raise ValueError(f"{path}: tensor {k!r} appears in both {where[k]} and {s}")
            where[k] = s
    if wm is not None:
        for k, s in wm.items():
            if where.get(k) != s:
                raise ValueError(f"{path}: {INDEX} says {k!r} is in {s} but it is "
                                 f"{'in ' + where[k] if k in where else 'in no shard'}")
    names = list(where)
    if convention is None:
        convention = "float"
        for c in DETECT_ORDER:
            if get_convention(c).detect(names, meta, files):
                convention = c
                break
    groups = get_convention(convention).groups(names, meta) if convention != "float" else []
    return Checkpoint(path, readers, where, meta, files, convention, groups)


# ---------------------------------------------------------------------------------
# whole checkpoints in memory
# ---------------------------------------------------------------------------------
def _is_gguf(path: str) -> bool:
    if not os.path.lexists(path) or os.path.isdir(path):
        return False
    with open_regular(path) as f:  # a FIFO or device raises instead of blocking
        return f.read(4) == b"GGUF"


def load(path: str | os.PathLike, convention: str | None = None) -> dict[str, QTensor | torch.Tensor]:
    """Every logical tensor of a checkpoint: QTensors for quantized weights, tensors otherwise."""
    path = os.fspath(path)
    if _is_gguf(path):
        from .gguf_io import load_gguf

        return load_gguf(path)
    ck = open_checkpoint(path, convention)
    out: dict[str, QTensor | torch.Tensor] = {}
    member = {k for g in ck.groups for k in g.members.values()}
    for g in ck.groups:
        out[g.base] = ck.qtensor(g)
    for k in ck.names:
        if k not in member:
            out[k] = ck.get(k)
    return out


def save(tensors: dict[str, QTensor | torch.Tensor], path: str | os.PathLike, convention: str = "native",
         config: dict | None = None, skipped: Iterable[str] = (), overwrite: bool = False) -> None:
    """Write ``tensors`` in ``convention``: a ``.gguf`` file for gguf, else a directory
    holding ``model.safetensors`` and the convention's json files, atomically.

    ``path`` must not exist (an empty directory is fine) unless ``overwrite=True``; an
    existing one is replaced only once the new one is complete (docs/safety.md)."""
    path = os.fspath(path)
    conv = get_convention(convention)
    if conv.name == "gguf":
        from .gguf_io import save_gguf

        check_output(None, path, overwrite, "save", kind="file")
        save_gguf(path, tensors.items(), overwrite=overwrite)
        return
    check_output(None, path, overwrite, "save")
    fmts = [t.fmt for t in tensors.values() if isinstance(t, QTensor)]
    with atomic_output(path, overwrite=overwrite) as tmp:
        w = SafetensorsWriter(os.path.join(tmp, "model.safetensors"), {"format": "pt"})
        try:
            for name, t in tensors.items():
                _write_one(w, conv, name, t)
            w.close()
        except BaseException:
            w.abort()
            raise
        if fmts:
            qnames = [n for n, t in tensors.items() if isinstance(t, QTensor)]
            acts = any(has_activation_scale(t) for t in tensors.values() if isinstance(t, QTensor))
            for fname, content in conv.config_files(fmts[0], qnames, list(skipped), config, acts).items():
                with open(os.path.join(tmp, fname), "w", encoding="utf-8") as f:
                    f.write(json_dumps(content))
        elif config is not None:
            with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
                f.write(json_dumps(config))


def _write_one(w: SafetensorsWriter, conv: Convention, name: str, t: QTensor | torch.Tensor,
               added: list[str] | None = None) -> int:
    """Write one logical tensor; its stored names are appended to ``added``; bytes written."""
    if isinstance(t, QTensor):
        ts, meta = conv.encode(name, t)
        for k, v in ts.items():
            w.add(k, v)
        if added is not None:
            added.extend(ts)
        w.metadata.update(meta)
        return sum(v.numel() * v.element_size() for v in ts.values())
    w.add(name, t)
    if added is not None:
        added.append(name)
    return t.numel() * t.element_size()


# ---------------------------------------------------------------------------------
# streaming conversion
# ---------------------------------------------------------------------------------
def should_quantize(name: str, shape: tuple[int, ...], dtype: torch.dtype, fmt: Format,
                    skip: Iterable[str] = DEFAULT_SKIP) -> bool:
    """Quantize floating tensors with >= 2 dims whose name matches no skip pattern
    (the dialect of :mod:`microscale._names`, shared with ``quantize_model``) and whose
    last dim holds at least one block."""
    if dtype not in _FLOAT or len(shape) < 2 or shape[-1] < fmt.block_size:
        return False
    if fmt.block_rows > 1 and shape[-2] < fmt.block_rows:
        return False
    return skip_matches(name, skip) is None


#: Why a convention may quantize none of a checkpoint's tensors (named in the error).
_ONLY = {"gpt-oss": "it quantizes only MoE expert weights: 3-D tensors named '*.experts.*_proj' "
                    "(gate_up_proj, down_proj)"}


def _quant_format(fmt: str | Format, conv: Convention, qkw: dict) -> Format:
    """The format written: ``fmt`` with the ``block_size``/``scale_rule`` overrides of
    ``qkw`` (removed from it) applied and named in the format's name (``nvfp4_b64``,
    ``mxfp4_rceil``), as the convention stores it."""
    from ..options import resolve_format

    base = get_format(fmt)
    bs, rule = qkw.pop("block_size", None), qkw.pop("scale_rule", None)
    if bs is not None and (isinstance(bs, bool) or not isinstance(bs, int) or bs < 1):
        raise ValueError(f"convert: block_size={bs!r}: expected a positive integer")
    f = resolve_format(base, bs, rule)
    want_rule = f.scale_rule
    f = conv.check_format(f)
    if rule is not None and f.scale_rule != want_rule:
        raise ValueError(f"convert: convention {conv.name!r} stores {base.name} with scale rule "
                         f"{f.scale_rule.value!r}, not the requested {want_rule.value!r}")
    suffix = (f"_b{f.block_size}" if f.block_size != base.block_size else "") + \
             (f"_{want_rule.value}" if rule is not None and want_rule != base.scale_rule else "")
    return f.replace(name=base.name + suffix) if suffix else f


def _none_quantized(ck: Checkpoint, names: list[str], conv: Convention, fmt: Format, patterns) -> str:
    """Why no tensor of ``names`` is quantized: counts per reason."""
    if conv.name in _ONLY:
        return _ONLY[conv.name]
    small = stored = skipped = 0
    for x in names:
        ti = ck.info(x)
        if not should_quantize(x, ti.shape, ti.dtype, fmt, ()):
            small += 1
        elif not conv.quantizable(x, ti.shape, fmt):
            stored += 1
        else:
            skipped += 1
    parts = [f"{small} are not float matrices with at least one {fmt.block_size}-element block per row"] * bool(small)
    parts += [f"{stored} have shapes convention {conv.name!r} cannot store"] * bool(stored)
    parts += [f"{skipped} match the skip patterns ({', '.join(patterns)})"] * bool(skipped)
    return "; ".join(parts)


def _dequantize_chunked(q: QTensor, dtype: torch.dtype, chunk: int = 1 << 18) -> torch.Tensor:
    """``q.dequantize(dtype)`` computed ``chunk`` elements of rows at a time into one
    output tensor, so the float32 temporaries of the decode stay small (bit-identical:
    every block is decoded by the same code). 256K elements keeps them ~1 MiB each:
    at 1M, freed multi-MiB temporaries raise glibc's mmap threshold and stay resident."""
    pshape = q.padded_shape
    if (q.data.dim() < 2 or q.numel == 0 or q.data.device.type != "cpu"
            or tuple(pshape[:-1]) != tuple(q.shape[:-1])):  # padded rows (2-D blocks): whole tensor
        return q.dequantize(dtype)
    k, kp = q.shape[-1], pshape[-1]
    data = q.data.reshape(-1, q.data.shape[-1])
    scales = q.scales.reshape(-1, q.scales.shape[-1]) if q.scales.dim() >= 2 else None
    zp = None if q.zero_points is None else q.zero_points.reshape(-1, q.zero_points.shape[-1])
    rows = data.shape[0]
    if scales is None or rows % scales.shape[0] or (zp is not None and zp.shape[0] != scales.shape[0]):
        return q.dequantize(dtype)
    per = rows // scales.shape[0]  # data rows per scale row (block_rows of 2-D blocks)
    step = max(1, chunk // max(kp * per, 1)) * per
    out = torch.empty((rows, k), dtype=dtype)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        s0, s1 = r0 // per, r1 // per
        part = QTensor(data[r0:r1], scales[s0:s1], q.fmt, torch.Size((r1 - r0, k)), q.dtype, q.global_scale,
                       None if zp is None else zp[s0:s1], dict(q.meta))
        out[r0:r1] = part.dequantize(dtype)
    return out.reshape(q.shape)


def convert(src: str | os.PathLike, dst: str | os.PathLike, *, fmt: str | Format | None = None,
            convention: str = "native", skip: Iterable[str] = (), default_skip: bool = True,
            dequantize: bool = False, dtype: torch.dtype | None = None, progress: bool = True,
            quantize_kwargs: dict | None = None, on_tensor: Callable[[str], None] | None = None,
            overwrite: bool = False) -> dict:
    """Convert a checkpoint tensor by tensor.

    Modes: ``fmt`` given — quantize a float checkpoint (or re-quantize after decoding a
    quantized one) and write it in ``convention``; ``dequantize=True`` — decode every
    quantized tensor to ``dtype`` (default: the original dtype, bfloat16 when unknown)
    and write a plain float checkpoint; neither — re-spell a quantized checkpoint in
    another ``convention`` (exact: no re-quantization). ``quantize_kwargs`` go to
    :func:`microscale.quantize`; a ``block_size`` or ``scale_rule`` among them is
    named in the written format (e.g. ``nvfp4_b64``).

    Safety (docs/safety.md): ``dst`` must not exist (an empty directory is fine) unless
    ``overwrite=True``, and never equals, contains or lies inside ``src``; every file
    name read from ``src`` resolves inside it; only regular files are read. The output
    is built under a unique temporary name beside ``dst`` and put in place atomically
    (an existing ``dst`` stays until the new one is complete). Shards keep their file
    names; the index json is rewritten; allow-listed side files (configs, tokenizer,
    README, LICENSE) are copied, every other file is listed in ``files_skipped``;
    ``config.json`` is updated for the convention.

    Memory: one input tensor (or group) and its outputs at a time; dequantizing decodes
    in row chunks straight into the output dtype. Returns a summary dict: tensor names
    under ``quantized``, ``skipped``, ``copied``, ``dequantized``; ``files_copied`` and
    ``files_skipped`` (``(name, reason)``); ``bytes_in``, ``bytes_out``; ``format`` (the
    name of the format written, when quantizing).
    """
    from ..ops import quantize as ms_quantize

    src, dst = os.fspath(src), os.fspath(dst)
    if fmt is not None and dequantize:
        raise ValueError("convert: pass either fmt (quantize) or dequantize=True, not both")
    out_conv = get_convention("native" if dequantize else convention)
    qkw = dict(quantize_kwargs or {})
    qfmt = None if fmt is None else _quant_format(fmt, out_conv, qkw)
    patterns = (tuple(DEFAULT_SKIP) if default_skip else ()) + tuple(skip)
    if not os.path.lexists(src):
        raise FileNotFoundError(f"{src}: no such file or directory")
    check_output(src, dst, overwrite, "convert", kind="file" if out_conv.name == "gguf" else "dir")
    if _is_gguf(src):
        raise ValueError("convert: GGUF input is supported by load()/inspect, not by streaming convert")
    ck = open_checkpoint(src)
    if ck.convention == "float" and qfmt is None:
        job = "dequantize" if dequantize else f"re-write in convention {out_conv.name!r}"
        raise ValueError(f"convert: {src} holds no quantized tensors (convention 'float'): nothing to {job}; "
                         "quantize it with fmt=... (`microscale quantize`)")
    in_conv = get_convention(ck.convention) if ck.convention != "float" else None
    member = {k: g for g in ck.groups for k in g.members.values()}
    primary = {next(iter(g.members.values())): g for g in ck.groups}

    # plan: per input shard, the items (("group", g) or ("plain", name)) whose first key lives there
    shards = list(ck.readers)
    plan: dict[str, list] = {s: [] for s in shards}
    for k in ck.names:
        if k in primary:
            plan[ck.where[k]].append(("group", primary[k]))
        elif k not in member:
            plan[ck.where[k]].append(("plain", k))

    def wanted(x: str) -> tuple[bool, bool]:
        """(convention can quantize it, the skip rules let it be quantized)."""
        ti = ck.info(x)
        return (out_conv.quantizable(x, ti.shape, qfmt),
                should_quantize(x, out_conv.prepared_shape(x, ti.shape), ti.dtype, qfmt, patterns))

    if qfmt is not None and not ck.groups:
        plain = [x for s in shards for kind, x in plan[s] if kind == "plain"]
        if not any(all(wanted(x)) for x in plain):
            raise ValueError(f"convert: convention {out_conv.name!r} would quantize none of the {len(plain)} "
                             f"tensors of {src} to {qfmt.name}: {_none_quantized(ck, plain, out_conv, qfmt, patterns)}")
    total = sum(ck.info(k).nbytes for k in ck.names)
    summary = {"quantized": [], "skipped": [], "copied": [], "dequantized": [], "files_copied": [],
               "files_skipped": [], "bytes_in": total, "bytes_out": 0,
               "activation_scales": False}
    if qfmt is not None:
        summary["format"] = qfmt.name
    first_fmt: list[Format] = []

    def produce(item):
        """Yield (logical name, QTensor | tensor) outputs for one plan item."""
        kind, x = item
        if kind == "group":
            q = ck.qtensor(x)
            if dequantize:
                summary["dequantized"].append(x.base)
                t = in_conv.restore(x.base, _dequantize_chunked(q, dtype or q.dtype))
                del q
                yield x.base, t
            elif qfmt is not None:
                t = out_conv.prepare(x.base, in_conv.restore(x.base, _dequantize_chunked(q, torch.float32)))
                del q
                summary["quantized"].append(x.base)
                yield x.base, ms_quantize(t, qfmt, pad=True, **qkw)
            else:
                out_conv.check_format(q.fmt)
                summary["quantized"].append(x.base)
                yield x.base, q
            return
        ti = ck.info(x)
        t = ck.get(x)
        if qfmt is not None and all(wanted(x)):
            summary["quantized"].append(x)
            yield x, ms_quantize(out_conv.prepare(x, t), qfmt, pad=True, **qkw)
        else:
            if qfmt is not None and ti.dtype in _FLOAT and len(ti.shape) >= 2:
                summary["skipped"].append(x)
            else:
                summary["copied"].append(x)
            yield x, (t.to(dtype) if (dequantize and dtype is not None and t.dtype in _FLOAT) else t)

    src_is_dir = os.path.isdir(src)
    if out_conv.name == "gguf":
        return _convert_gguf(ck, plan, shards, produce, dst, total, summary, progress, overwrite)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"convert -> {out_conv.name}")
    try:
        with atomic_output(dst, overwrite=overwrite) as tmp:
            weight_map: dict[str, str] = {}
            for s in shards:
                out_name = os.path.normpath(s) if src_is_dir else "model.safetensors"  # resolved inside src
                os.makedirs(os.path.dirname(os.path.join(tmp, out_name)), exist_ok=True)
                w = SafetensorsWriter(os.path.join(tmp, out_name), {"format": "pt"})
                try:
                    for item in plan[s]:
                        keys = list(item[1].members.values()) if item[0] == "group" else [item[1]]
                        nin = sum(ck.info(k).nbytes for k in keys)
                        for name, t in produce(item):
                            if isinstance(t, QTensor) and not first_fmt:
                                first_fmt.append(t.fmt)
                            if isinstance(t, QTensor) and has_activation_scale(t):
                                summary["activation_scales"] = True
                            added: list[str] = []
                            summary["bytes_out"] += _write_one(w, out_conv, name, t, added)
                            for k in added:
                                weight_map[k] = out_name
                            del t
                        if on_tensor is not None:
                            on_tensor(keys[0])
                        if bar is not None:
                            bar.update(nin)
                    w.close()
                except BaseException:
                    w.abort()
                    raise
            if src_is_dir:
                copy, summary["files_skipped"] = side_files(src, exclude=[INDEX, "hf_quant_config.json", *shards])
                for rel, real in copy:
                    d = os.path.join(tmp, rel)
                    os.makedirs(os.path.dirname(d), exist_ok=True)
                    copy_regular(real, d)
                    summary["files_copied"].append(rel)
            config = ck.files.get("config.json")
            if dequantize or (qfmt is None and not first_fmt):
                if config is not None and "quantization_config" in config:
                    c = {k: v for k, v in config.items() if k != "quantization_config"}
                    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
                        f.write(json_dumps(c))
            elif first_fmt:
                if config is not None:
                    config = {k: v for k, v in config.items() if k != "quantization_config"}
                hq = os.path.join(tmp, "hf_quant_config.json")
                if os.path.exists(hq):
                    os.unlink(hq)
                for fname, content in out_conv.config_files(first_fmt[0], summary["quantized"], summary["skipped"],
                                                            config, summary["activation_scales"]).items():
                    with open(os.path.join(tmp, fname), "w", encoding="utf-8") as f:
                        f.write(json_dumps(content))
            if src_is_dir and (os.path.lexists(os.path.join(src, INDEX)) or len(shards) > 1):
                idx = {"metadata": {"total_size": summary["bytes_out"]}, "weight_map": dict(sorted(weight_map.items()))}
                with open(os.path.join(tmp, INDEX), "w", encoding="utf-8") as f:
                    f.write(json_dumps(idx))
    finally:
        if bar is not None:
            bar.close()
    return summary


def _convert_gguf(ck, plan, shards, produce, dst, total, summary, progress, overwrite) -> dict:
    """Stream every plan item into one GGUF file (tensor data spooled to disk)."""
    from .gguf_io import save_gguf

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="B", unit_scale=True, desc="convert -> gguf")

    def items():
        for s in shards:
            for item in plan[s]:
                keys = list(item[1].members.values()) if item[0] == "group" else [item[1]]
                for name, t in produce(item):
                    summary["bytes_out"] += t.nbytes if isinstance(t, QTensor) else t.numel() * t.element_size()
                    yield name, t
                if bar is not None:
                    bar.update(sum(ck.info(k).nbytes for k in keys))

    try:
        save_gguf(dst, items(), overwrite=overwrite)
    finally:
        if bar is not None:
            bar.close()
    return summary


# ---------------------------------------------------------------------------------
# inspect
# ---------------------------------------------------------------------------------
def inspect(path: str | os.PathLike) -> tuple[str, list[tuple[str, str, tuple[int, ...], int]]]:
    """``(convention, rows)``; a row is ``(name, format or dtype, logical shape, bytes)``."""
    path = os.fspath(path)
    if _is_gguf(path):
        from .gguf_io import iter_gguf

        rows = []
        for name, t in iter_gguf(path):
            if isinstance(t, QTensor):
                rows.append((name, t.fmt.name, tuple(t.shape), t.nbytes))
            else:
                rows.append((name, str(t.dtype).removeprefix("torch."), tuple(t.shape), t.numel() * t.element_size()))
        return "gguf", rows
    ck = open_checkpoint(path)
    rows = []
    member = {k for g in ck.groups for k in g.members.values()}
    for g in ck.groups:
        q = ck.qtensor(g, lazy=True)  # headers only (plus scalars)
        rows.append((g.base, q.fmt.name, tuple(q.shape), sum(ck.info(k).nbytes for k in g.members.values())))
        del q
    for k in ck.names:
        if k not in member:
            ti = ck.info(k)
            rows.append((k, str(ti.dtype).removeprefix("torch."), ti.shape, ti.nbytes))
    order = {k: i for i, k in enumerate(ck.names)}
    for g in ck.groups:  # a group sorts where its first stored tensor is
        order.setdefault(g.base, order[next(iter(g.members.values()))])
    rows.sort(key=lambda r: order.get(r[0], 0))
    return ck.convention, rows


__all__ += ["SafetensorsError", "UnsafePathError"]
