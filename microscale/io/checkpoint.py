"""Checkpoints on disk: a directory of (sharded) safetensors with an optional
``model.safetensors.index.json``, a single ``.safetensors`` file, or a ``.gguf`` file.

* :func:`open_checkpoint` — lazy, validated view (tensor names, shapes, dtypes, files,
  convention detected from names, metadata and ``config.json``/``hf_quant_config.json``).
* :func:`load` / :func:`save` — whole checkpoints in memory (small models, tests).
* :func:`convert` — streaming conversion, tensor by tensor (see its docstring).
* :func:`inspect` — one row per logical tensor: name, format or dtype, shape, bytes.
"""
from __future__ import annotations

import fnmatch
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from ..formats import Format, get_format
from ..qtensor import QTensor
from .conventions import DETECT_ORDER, Convention, Group, get_convention, has_activation_scale, json_dumps
from .safetensors_io import SafetensorsError, SafetensorsReader, SafetensorsWriter

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
        return get_convention(self.convention).decode(g, tensors, self.metadata)


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from e


def open_checkpoint(path: str | os.PathLike, convention: str | None = None) -> Checkpoint:
    """Open a checkpoint directory or a single safetensors file (validating every header)."""
    path = os.fspath(path)
    files: dict[str, dict] = {}
    if os.path.isdir(path):
        for j in ("config.json", "hf_quant_config.json"):
            if os.path.exists(os.path.join(path, j)):
                files[j] = _read_json(os.path.join(path, j))
        idx = os.path.join(path, INDEX)
        if os.path.exists(idx):
            wm = _read_json(idx).get("weight_map")
            if not isinstance(wm, dict):
                raise ValueError(f"{idx}: no 'weight_map' object")
            shards = sorted(set(wm.values()))
        else:
            shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
            wm = None
        if not shards:
            raise FileNotFoundError(f"{path}: no .safetensors files")
        root = path
    elif os.path.isfile(path):
        root, shards, wm = os.path.dirname(os.path.abspath(path)), [os.path.basename(path)], None
    else:
        raise FileNotFoundError(f"{path}: no such file or directory")
    readers, where, meta = {}, {}, {}
    for s in shards:
        fp = os.path.join(root, s)
        if not os.path.exists(fp):
            raise FileNotFoundError(f"{fp}: listed in {INDEX} but missing")
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
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
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
         config: dict | None = None, skipped: Iterable[str] = ()) -> None:
    """Write ``tensors`` in ``convention``: a ``.gguf`` file for gguf, else a directory
    holding ``model.safetensors`` and the convention's json files (atomically)."""
    path = os.fspath(path)
    conv = get_convention(convention)
    if conv.name == "gguf":
        from .gguf_io import save_gguf

        save_gguf(path, tensors.items())
        return
    fmts = [t.fmt for t in tensors.values() if isinstance(t, QTensor)]
    with _atomic_dir(path) as tmp:
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


def _write_one(w: SafetensorsWriter, conv: Convention, name: str, t: QTensor | torch.Tensor) -> int:
    if isinstance(t, QTensor):
        ts, meta = conv.encode(name, t)
        for k, v in ts.items():
            w.add(k, v)
        w.metadata.update(meta)
        return sum(v.numel() * v.element_size() for v in ts.values())
    w.add(name, t)
    return t.numel() * t.element_size()


class _atomic_dir:
    """Build a directory under a temporary name beside ``path``; rename it into place on
    success, delete it on any error (KeyboardInterrupt and SIGTERM included). An
    existing ``path`` is replaced only after the new one is complete. A process killed
    with SIGKILL cannot clean up: its ``.<name>.partial-<pid>-*`` directory is removed by
    the next run for the same ``path`` once that pid is gone."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)

    def _prefix(self) -> str:
        return "." + os.path.basename(self.path) + ".partial-"

    def _clean_stale(self, parent: str) -> None:
        for f in os.listdir(parent):
            if not f.startswith(self._prefix()):
                continue
            try:
                pid = int(f[len(self._prefix()):].split("-")[0])
            except ValueError:
                continue
            if pid != os.getpid() and not _pid_alive(pid):
                shutil.rmtree(os.path.join(parent, f), ignore_errors=True)

    def __enter__(self) -> str:
        parent = os.path.dirname(self.path)
        os.makedirs(parent, exist_ok=True)
        self._clean_stale(parent)
        self.tmp = tempfile.mkdtemp(dir=parent, prefix=f"{self._prefix()}{os.getpid()}-")
        self._term = _sigterm_as_exit().__enter__()
        return self.tmp

    def __exit__(self, et, ev, tb) -> bool:
        try:
            if et is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
                return False
            old = None
            if os.path.exists(self.path):
                old = self.path + ".old-" + os.path.basename(self.tmp)
                os.replace(self.path, old)
            os.replace(self.tmp, self.path)
            if old:
                shutil.rmtree(old, ignore_errors=True) if os.path.isdir(old) else os.unlink(old)
            return False
        finally:
            self._term.__exit__(None, None, None)


class _sigterm_as_exit:
    """While active (main thread only), SIGTERM raises SystemExit so cleanup code runs."""

    def __enter__(self):
        import signal
        import threading

        self.old = None
        if threading.current_thread() is threading.main_thread():
            def _term(signum, frame):
                raise SystemExit(128 + signum)

            self.old = signal.signal(signal.SIGTERM, _term)
        return self

    def __exit__(self, *exc) -> bool:
        import signal

        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------------
# streaming conversion
# ---------------------------------------------------------------------------------
def should_quantize(name: str, shape: tuple[int, ...], dtype: torch.dtype, fmt: Format,
                    skip: Iterable[str] = DEFAULT_SKIP) -> bool:
    """Quantize floating tensors with >= 2 dims whose name matches no skip pattern
    (fnmatch; a pattern without wildcards also matches as a substring) and whose last
    dim holds at least one block."""
    if dtype not in _FLOAT or len(shape) < 2 or shape[-1] < fmt.block_size:
        return False
    if fmt.block_rows > 1 and shape[-2] < fmt.block_rows:
        return False
    for p in skip:
        if fnmatch.fnmatchcase(name, p) or (not any(c in p for c in "*?[") and p in name):
            return False
    return True


def _dir_outputs(src: str, dst: str, src_is_dir: bool):
    """Non-safetensors files to copy (relative names)."""
    if not src_is_dir:
        return []
    out = []
    for root, dirs, fs in os.walk(src):
        for f in fs:
            rel = os.path.relpath(os.path.join(root, f), src)
            if f.endswith(".safetensors") or rel == INDEX:
                continue
            out.append(rel)
    return out


def convert(src: str | os.PathLike, dst: str | os.PathLike, *, fmt: str | Format | None = None,
            convention: str = "native", skip: Iterable[str] = (), default_skip: bool = True,
            dequantize: bool = False, dtype: torch.dtype | None = None, progress: bool = True,
            quantize_kwargs: dict | None = None, on_tensor: Callable[[str], None] | None = None) -> dict:
    """Convert a checkpoint tensor by tensor.

    Modes: ``fmt`` given — quantize a float checkpoint (or re-quantize after decoding a
    quantized one) and write it in ``convention``; ``dequantize=True`` — decode every
    quantized tensor to ``dtype`` (default: the original dtype, bfloat16 when unknown)
    and write a plain float checkpoint; neither — re-spell a quantized checkpoint in
    another ``convention`` (exact: no re-quantization).

    Memory: one input tensor (or group) and its outputs at a time; peak is about twice
    the largest tensor plus a constant. The output is built in a temporary directory
    beside ``dst`` and renamed at the end, so an interrupted run leaves no ``dst``; the
    input is only read. Shards keep their file names; the index json is rewritten;
    other files (tokenizer, configs) are copied, ``config.json`` updated for the
    convention. Returns a summary dict.
    """
    from ..ops import quantize as ms_quantize

    src, dst = os.fspath(src), os.fspath(dst)
    if os.path.abspath(src) == os.path.abspath(dst):
        raise ValueError("convert: dst must differ from src (the input is never modified)")
    qfmt = None if fmt is None else get_format(fmt)
    if qfmt is not None and dequantize:
        raise ValueError("convert: pass either fmt (quantize) or dequantize=True, not both")
    out_conv = get_convention("native" if dequantize else convention)
    if qfmt is not None:
        qfmt = out_conv.check_format(qfmt)
    qkw = dict(quantize_kwargs or {})
    patterns = (tuple(DEFAULT_SKIP) if default_skip else ()) + tuple(skip)
    if _is_gguf(src):
        raise ValueError("convert: GGUF input is supported by load()/inspect, not by streaming convert")
    ck = open_checkpoint(src)
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
    total = sum(ck.info(k).nbytes for k in ck.names)
    summary = {"quantized": [], "skipped": [], "copied": [], "dequantized": [], "bytes_in": total, "bytes_out": 0,
               "activation_scales": False}
    first_fmt: list[Format] = []

    def produce(item):
        """Yield (logical name, QTensor | tensor) outputs for one plan item."""
        kind, x = item
        if kind == "group":
            q = ck.qtensor(x)
            if dequantize:
                summary["dequantized"].append(x.base)
                yield x.base, in_conv.restore(x.base, q.dequantize(dtype or q.dtype))
            elif qfmt is not None:
                t = out_conv.prepare(x.base, in_conv.restore(x.base, q.dequantize(torch.float32)))
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
        if (qfmt is not None and out_conv.quantizable(x, ti.shape, qfmt)
                and should_quantize(x, out_conv.prepared_shape(x, ti.shape), ti.dtype, qfmt, patterns)):
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
        return _convert_gguf(ck, plan, shards, produce, dst, total, summary, progress)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"convert -> {out_conv.name}")
    try:
        with _atomic_dir(dst) as tmp:
            weight_map: dict[str, str] = {}
            for s in shards:
                out_name = s if src_is_dir else "model.safetensors"
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
                            before = set(w._entries)
                            summary["bytes_out"] += _write_one(w, out_conv, name, t)
                            for k in w._entries:
                                if k not in before:
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
            # side files
            for rel in _dir_outputs(src, dst, src_is_dir):
                d = os.path.join(tmp, rel)
                os.makedirs(os.path.dirname(d), exist_ok=True)
                shutil.copyfile(os.path.join(src, rel), d)
            config = ck.files.get("config.json")
            if dequantize or (qfmt is None and not first_fmt):
                if config is not None and "quantization_config" in config:
                    c = {k: v for k, v in config.items() if k != "quantization_config"}
                    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
                        f.write(json_dumps(c))
                hq = os.path.join(tmp, "hf_quant_config.json")
                if os.path.exists(hq):
                    os.unlink(hq)
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
            if src_is_dir and (os.path.exists(os.path.join(src, INDEX)) or len(shards) > 1):
                idx = {"metadata": {"total_size": summary["bytes_out"]}, "weight_map": dict(sorted(weight_map.items()))}
                with open(os.path.join(tmp, INDEX), "w", encoding="utf-8") as f:
                    f.write(json_dumps(idx))
    finally:
        if bar is not None:
            bar.close()
    return summary


def _convert_gguf(ck, plan, shards, produce, dst, total, summary, progress) -> dict:
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
        with _sigterm_as_exit():
            save_gguf(dst, items())
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
    rows.sort(key=lambda r: order.get(r[0], order.get(_first_key(ck, r[0]), 0)))
    return ck.convention, rows


def _first_key(ck: Checkpoint, base: str) -> str:
    for g in ck.groups:
        if g.base == base:
            return next(iter(g.members.values()))
    return base


__all__ += ["SafetensorsError"]
