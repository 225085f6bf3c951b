"""Checkpoint conventions: how a quantized tensor is spelled in a checkpoint.

A convention maps one logical weight (``base``, the name its float tensor has, e.g.
``model.layers.0.mlp.up_proj.weight``) to the tensors and metadata that store it, and
back. Conventions register in :data:`CONVENTIONS`; code looks them up by name and never
branches on a convention elsewhere.

=====================  ===================================================================
``native``             ``<base>.data``, ``<base>.scales`` [, ``.global_scale``,
                       ``.zero_points``]; JSON under metadata key ``<base>.microscale``.
                       Every format. ``config.json`` gets a ``quantization_config``
                       without ``quant_method`` so transformers refuses the directory.
``modelopt``           NVIDIA ModelOpt HF export, NVFP4: ``<m>.weight`` u8 [N,K/2],
                       ``<m>.weight_scale`` e4m3fn [N,K/16], ``<m>.weight_scale_2`` fp32
                       (decode multiplier), ``<m>.input_scale`` fp32 when calibrated;
                       ``hf_quant_config.json``.
``compressed-tensors`` ``nvfp4-pack-quantized``: ``<m>.weight_packed``, ``<m>.weight_scale``
                       e4m3fn, ``<m>.weight_global_scale`` fp32[1] = 1/decode multiplier;
                       ``mxfp4-pack-quantized``: E8M0 u8 ``weight_scale``, no global.
``gpt-oss``            MXFP4 ``<x>_blocks`` u8 [..., rows, K/32, 16], ``<x>_scales`` u8
                       [..., rows, K/32] (E8M0, bias 127).
``gguf``               a single ``.gguf`` file (see :mod:`microscale.io.gguf_io`).
=====================  ===================================================================
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field

import torch

from ..formats import Format, get_format
from ..qtensor import QTensor

__all__ = ["Convention", "Group", "CONVENTIONS", "get_convention", "register_convention", "has_activation_scale",
           "ReciprocalRoundingWarning", "quantizable_tensors", "native_quantization_config"]


@dataclass
class Group:
    """The checkpoint keys that store one quantized logical tensor."""

    base: str
    members: dict[str, str]  # role -> checkpoint key
    optional: tuple[str, ...] = ()


@dataclass
class Convention:
    """Base class; subclasses implement ``groups``, ``decode`` and ``encode``."""

    name: str = ""
    description: str = ""
    formats: tuple[str, ...] = ()  # accepted preset families (empty: every format)
    config: dict = field(default_factory=dict)
    #: What the convention quantizes, for messages (e.g. when nothing in a checkpoint matches).
    selects = "floating tensors of two or more dims whose last dim holds whole blocks"

    # ---- detection and grouping --------------------------------------------------
    def detect(self, names: list[str], metadata: dict[str, str], files: dict[str, dict]) -> bool:
        """True if a checkpoint with these tensor names / metadata / json files uses this convention."""
        return bool(self.groups(names, metadata))

    def groups(self, names: list[str], metadata: dict[str, str]) -> list[Group]:
        raise NotImplementedError

    # ---- tensors <-> QTensor -----------------------------------------------------
    def decode(self, g: Group, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> QTensor:
        raise NotImplementedError

    def encode(self, base: str, q: QTensor) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        raise NotImplementedError

    def check_format(self, fmt: Format) -> Format:
        """The format this convention stores for a requested ``fmt`` (raise if unsupported)."""
        return fmt

    def activation_format(self, q: QTensor, files: dict[str, dict]) -> str | None:
        """The format a checkpoint declares for the activations of the layer whose weight ``q``
        decoded (a preset name: the layer runs both operands quantized), given its json side
        files; None for weight-only (the default)."""
        return None

    # ---- float tensors <-> the orientation the convention quantizes -------------------
    def quantizable(self, name: str, shape: tuple[int, ...], fmt: Format | None = None) -> bool:
        """Whether a float tensor of this name/shape is one this convention quantizes.
        Only ``native`` records the original shape, so the others need K (and rows of
        2-D blocks) to be whole blocks."""
        if fmt is None or self.name == "native":
            return True
        return shape[-1] % fmt.block_size == 0 and (fmt.block_rows == 1 or shape[-2] % fmt.block_rows == 0)

    def prepare(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """A float tensor as it is quantized (e.g. transposed); identity by default."""
        return t

    def prepared_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape :meth:`prepare` gives a tensor of ``shape`` (blocks run along its last dim)."""
        return tuple(shape)

    def restore(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`prepare`, applied to a dequantized tensor."""
        return t

    # ---- files beside the tensors -------------------------------------------------
    def config_files(self, fmt: Format, quantized: list[str], skipped: list[str],
                     config: dict | None, activation_scales: bool = False) -> dict[str, dict]:
        """JSON files to write in the output directory (name -> content), given the
        source ``config.json`` (or None). ``activation_scales``: some quantized tensor
        carries a static activation scale (see :func:`has_activation_scale`), so the
        config must declare quantized inputs."""
        return {}


CONVENTIONS: dict[str, Convention] = {}


def register_convention(c: Convention) -> Convention:
    """Add a checkpoint convention to the registry (its name must be new)."""
    if c.name in CONVENTIONS:
        raise ValueError(f"convention {c.name!r} is already registered")
    CONVENTIONS[c.name] = c
    return c


def get_convention(name: str | Convention) -> Convention:
    """Look up a convention by name (``native``, ``modelopt``, ``compressed-tensors``,
    ``gpt-oss``, ``fp8-block``, ``gguf``; ``_`` may stand for ``-``) or pass one through."""
    if isinstance(name, Convention):
        return name
    key = str(name).lower().replace("_", "-")
    if key not in CONVENTIONS:
        raise KeyError(f"unknown convention {name!r}; known: {', '.join(CONVENTIONS)}")
    return CONVENTIONS[key]


def has_activation_scale(q: QTensor) -> bool:
    """Whether ``q`` carries a static activation scale (ModelOpt ``input_scale`` or
    compressed-tensors ``input_global_scale``) that a checkpoint writes beside it."""
    return "input_scale" in q.meta or "input_global_scale" in q.meta


class ReciprocalRoundingWarning(UserWarning):
    """A per-tensor scale was written as its float32 reciprocal (ModelOpt <-> compressed-tensors)
    and ``fl(1/fl(1/s)) != s``: reading it back gives ``s`` off by one ulp (2^-23 relative)."""


RECIPROCAL_SUFFIX = ".reciprocal_of"  # safetensors metadata: "<key>.reciprocal_of" -> the exact source value


def _reciprocal(src: torch.Tensor, key: str, conv: str, what: str) -> tuple[torch.Tensor, dict[str, str]]:
    """``fl(1/src)`` in float32, and metadata recording ``src`` when the reciprocal does not
    invert exactly. No float32 value can: ``fl(1/g) == s`` has no solution ``g`` for about
    15% of float32 ``s``, so one ulp of ``s`` is lost on the way back."""
    src = src.to(torch.float32)
    out = (1.0 / src).to(torch.float32)
    back = (1.0 / out).to(torch.float32)
    if torch.equal(back, src):
        return out, {}
    warnings.warn(f"{conv}: a {what} is stored as its float32 reciprocal g, and 1/g does not give the source value "
                  "s back (no float32 g does for about 15% of s): reading it back gives s one ulp off (2^-23 "
                  "relative; decoded values within 2^-22). The exact s is kept in the safetensors metadata "
                  f"'<key>{RECIPROCAL_SUFFIX}'.",
                  ReciprocalRoundingWarning, stacklevel=3)
    return out, {key + RECIPROCAL_SUFFIX: json.dumps([float(v) for v in src.reshape(-1)])}


def _stem(base: str) -> str:
    return base[: -len(".weight")] if base.endswith(".weight") else base


def _scalar_meta(t: torch.Tensor) -> dict:
    """A float32 tensor as exact JSON (shape + values; fp32 -> python float is exact)."""
    return {"shape": list(t.shape), "values": [float(v) for v in t.reshape(-1).to(torch.float32)]}


def _scalar_from_meta(m: dict) -> torch.Tensor:
    return torch.tensor(m["values"], dtype=torch.float32).reshape(m["shape"])


def _unpadded(q: QTensor, conv: str, base: str) -> None:
    if tuple(q.padded_shape) != tuple(q.shape):
        raise ValueError(f"{conv}: {base!r} of shape {tuple(q.shape)} was padded to {tuple(q.padded_shape)}; only the "
                         "native convention records the original shape")


def _need(tensors: dict[str, torch.Tensor], role: str, dtype: torch.dtype, g: Group, conv: str) -> torch.Tensor:
    t = tensors[role]
    if t.dtype != dtype:
        raise ValueError(f"{conv}: {g.members[role]!r} has dtype {t.dtype}; expected {dtype}")
    return t


# ---------------------------------------------------------------------------------
# native
# ---------------------------------------------------------------------------------
def native_quantization_config(fmt: Format) -> dict:
    """``config.json``'s ``quantization_config`` for a native microscale checkpoint. It has no
    ``quant_method``, so transformers' ``from_pretrained`` raises instead of loading random
    weights into the Linear layers whose tensors it cannot read."""
    return {"producer": "microscale", "convention": "native", "format": fmt.name,
            "load_with": "microscale.nn.load_quantized_state(model, microscale.io.load(path))"}


class Native(Convention):
    def groups(self, names, metadata):
        have = set(names)
        out = []
        for k in metadata:
            if k.endswith(".microscale"):
                base = k[: -len(".microscale")]
                mem = {r: f"{base}.{r}" for r in ("data", "scales", "global_scale", "zero_points")
                       if f"{base}.{r}" in have}
                out.append(Group(base, mem))
        return out

    def decode(self, g, tensors, metadata):
        return QTensor.from_state_dict({f"{g.base}.{r}": t for r, t in tensors.items()}, metadata, prefix=g.base + ".")

    def encode(self, base, q):
        return q.state_dict(prefix=base + ".")

    def config_files(self, fmt, quantized, skipped, config, activation_scales=False):
        # transformers (and so SentenceTransformer) would read this directory as a float model
        # and fill every quantized Linear with random weights; a quantization_config without
        # ``quant_method`` makes it raise instead. Loading goes through load_quantized_state.
        if config is None:
            return {}
        c = {k: v for k, v in config.items() if k != "quantization_config"}
        c["quantization_config"] = native_quantization_config(fmt)
        return {"config.json": c}


# ---------------------------------------------------------------------------------
# ModelOpt NVFP4
# ---------------------------------------------------------------------------------
class ModelOpt(Convention):
    def detect(self, names, metadata, files):
        hq = files.get("hf_quant_config.json") or {}
        if (hq.get("producer") or {}).get("name") == "modelopt":
            return True
        return bool(self.groups(names, metadata))

    def groups(self, names, metadata):
        have = set(names)
        out = []
        for k in names:
            if k.endswith(".weight_scale_2"):
                m = k[: -len(".weight_scale_2")]
                mem = {"weight": m + ".weight", "weight_scale": m + ".weight_scale", "weight_scale_2": k}
                if m + ".input_scale" in have:
                    mem["input_scale"] = m + ".input_scale"
                missing = [v for v in mem.values() if v not in have]
                if missing:
                    raise ValueError(f"modelopt: {k!r} has no sibling {missing[0]!r}")
                out.append(Group(m + ".weight", mem))
        return out

    def check_format(self, fmt):
        if not (fmt.global_scale and fmt.element.name == "e2m1" and fmt.block_size == 16):
            raise ValueError(f"convention 'modelopt' stores NVFP4 only, not {fmt.name!r}")
        return fmt

    def activation_format(self, q, files):
        # quant_algo NVFP4 is W4A4: activations NVFP4 with the static per-tensor input_scale
        # (other algorithms with an input_scale, e.g. W4A8_NVFP4_FP8, stay weight-only here)
        if "input_scale" not in q.meta:
            return None
        algo = ((files.get("hf_quant_config.json") or {}).get("quantization") or {}).get("quant_algo")
        if algo is None:
            algo = ((files.get("config.json") or {}).get("quantization_config") or {}).get("quant_algo")
        return "nvfp4" if algo == "NVFP4" else None

    def decode(self, g, tensors, metadata):
        w = _need(tensors, "weight", torch.uint8, g, self.name)
        s = _need(tensors, "weight_scale", torch.float8_e4m3fn, g, self.name)
        s2 = _need(tensors, "weight_scale_2", torch.float32, g, self.name)
        if s2.numel() != 1:
            raise ValueError(f"modelopt: {g.members['weight_scale_2']!r} must hold one value, shape {tuple(s2.shape)}")
        meta = {"two_level": "modelopt", "weight_scale_2_shape": list(s2.shape)}
        if "input_scale" in tensors:
            meta["input_scale"] = _scalar_meta(_need(tensors, "input_scale", torch.float32, g, self.name))
        fmt = get_format("nvfp4")
        shape = torch.Size((*w.shape[:-1], w.shape[-1] * 2))
        q = QTensor(w, s, fmt, shape, torch.bfloat16, s2.reshape(()).clone(), None, meta)
        q.validate()
        return q

    def encode(self, base, q):
        self.check_format(q.fmt)
        _unpadded(q, self.name, base)
        m = _stem(base)
        meta: dict[str, str] = {}
        s2 = q.global_scale.reshape(q.meta.get("weight_scale_2_shape", []))
        if "global_scale_inv" in q.meta:  # from compressed-tensors: fl(1/gs) may not invert back to gs
            s2, meta = _reciprocal(torch.tensor(q.meta["global_scale_inv"], dtype=torch.float32), m + ".weight_scale_2",
                                   self.name, "compressed-tensors weight_global_scale")
            s2 = s2.reshape(q.meta.get("weight_scale_2_shape", []))
        out = {m + ".weight": q.data, m + ".weight_scale": q.scales, m + ".weight_scale_2": s2}
        if "input_scale" in q.meta:
            out[m + ".input_scale"] = _scalar_from_meta(q.meta["input_scale"])
        elif "input_global_scale" in q.meta:  # from compressed-tensors: its reciprocal (as its own converter does)
            inv, mi = _reciprocal(_scalar_from_meta(q.meta["input_global_scale"]).reshape(()), m + ".input_scale",
                                  self.name, "compressed-tensors input_global_scale")
            out[m + ".input_scale"] = inv
            meta.update(mi)
        return out, meta

    def config_files(self, fmt, quantized, skipped, config, activation_scales=False):
        excl = sorted({_stem(s) for s in skipped})
        hq = {"producer": {"name": "modelopt", "version": "microscale"},
              "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                               "exclude_modules": excl}}
        out = {"hf_quant_config.json": hq}
        if config is not None:
            c = dict(config)
            c["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                        "exclude_modules": excl}
            out["config.json"] = c
        return out


# ---------------------------------------------------------------------------------
# compressed-tensors nvfp4-pack-quantized / mxfp4-pack-quantized
# ---------------------------------------------------------------------------------
class CompressedTensors(Convention):
    def detect(self, names, metadata, files):
        qc = (files.get("config.json") or {}).get("quantization_config") or {}
        if qc.get("quant_method") == "compressed-tensors" and qc.get("format") in (
                "nvfp4-pack-quantized", "mxfp4-pack-quantized"):
            return True
        return bool(self.groups(names, metadata))

    def groups(self, names, metadata):
        have = set(names)
        out = []
        for k in names:
            if k.endswith(".weight_packed"):
                m = k[: -len(".weight_packed")]
                mem = {"weight_packed": k, "weight_scale": m + ".weight_scale"}
                for opt in ("weight_global_scale", "input_global_scale"):
                    if f"{m}.{opt}" in have:
                        mem[opt] = f"{m}.{opt}"
                if mem["weight_scale"] not in have:
                    raise ValueError(f"compressed-tensors: {k!r} has no sibling {mem['weight_scale']!r}")
                if m + ".weight_shape" in have or m + ".weight_zero_point" in have:
                    continue  # int pack-quantized: not an fp4 layout
                out.append(Group(m + ".weight", mem))
        return out

    def check_format(self, fmt):
        if fmt.element.name != "e2m1" or not ((fmt.global_scale and fmt.block_size == 16) or
                                              (fmt.scale.name == "e8m0" and fmt.block_size == 32)):
            raise ValueError(f"convention 'compressed-tensors' stores nvfp4 and mxfp4 only, not {fmt.name!r}")
        if fmt.global_scale:
            return fmt.replace(two_level="compressed-tensors")
        return fmt.replace(scale_rule="even")  # compressed-tensors' MXFP4 scale rule

    def activation_format(self, q, files):
        # a config group with FP4 input activations (compressed-tensors' NVFP4 preset) and the
        # weight's static input_global_scale: W4A4
        if "input_global_scale" not in q.meta or not q.fmt.global_scale:
            return None
        qc = (files.get("config.json") or {}).get("quantization_config") or {}
        for group in (qc.get("config_groups") or {}).values():
            ia = (group or {}).get("input_activations") or {}
            if ia.get("num_bits") == 4 and ia.get("type") == "float":
                return "nvfp4"
        return None

    def decode(self, g, tensors, metadata):
        w = _need(tensors, "weight_packed", torch.uint8, g, self.name)
        shape = torch.Size((*w.shape[:-1], w.shape[-1] * 2))
        meta = {}
        if "input_global_scale" in tensors:
            meta["input_global_scale"] = _scalar_meta(tensors["input_global_scale"])
        if "weight_global_scale" in tensors:
            s = _need(tensors, "weight_scale", torch.float8_e4m3fn, g, self.name)
            gs = _need(tensors, "weight_global_scale", torch.float32, g, self.name)
            if gs.numel() != 1:
                raise ValueError(f"compressed-tensors: {g.members['weight_global_scale']!r} must hold one value")
            fmt = get_format("nvfp4").replace(two_level="compressed-tensors")
            meta.update({"two_level": "compressed-tensors", "global_scale_inv": float(gs.reshape(())),
                         "weight_global_scale_shape": list(gs.shape)})
            gscale = (1.0 / gs.reshape(())).to(torch.float32)
        else:
            s = _need(tensors, "weight_scale", torch.uint8, g, self.name)
            fmt = get_format("mxfp4").replace(scale_rule="even")
            gscale = None
        q = QTensor(w, s, fmt, shape, torch.bfloat16, gscale, None, meta)
        q.validate()
        return q

    def encode(self, base, q):
        self.check_format(q.fmt)
        _unpadded(q, self.name, base)
        m = _stem(base)
        meta: dict[str, str] = {}
        out = {m + ".weight_packed": q.data, m + ".weight_scale": q.scales}
        if q.fmt.global_scale:
            gs = q.meta.get("global_scale_inv")
            if gs is not None:
                gs = torch.tensor(gs, dtype=torch.float32)
            else:  # a decode multiplier (ModelOpt's weight_scale_2): its reciprocal may not invert back
                gs, meta = _reciprocal(q.global_scale.reshape(()), m + ".weight_global_scale", self.name,
                                       "ModelOpt weight_scale_2 (NVFP4 decode multiplier)")
            out[m + ".weight_global_scale"] = gs.reshape(q.meta.get("weight_global_scale_shape", [1]))
        if "input_global_scale" in q.meta:
            out[m + ".input_global_scale"] = _scalar_from_meta(q.meta["input_global_scale"])
        elif "input_scale" in q.meta:  # from ModelOpt: its reciprocal (as compressed-tensors' converter does)
            inv, mi = _reciprocal(_scalar_from_meta(q.meta["input_scale"]).reshape(()), m + ".input_global_scale",
                                  self.name, "ModelOpt input_scale")
            out[m + ".input_global_scale"] = inv.reshape(1)
            meta.update(mi)
        return out, meta

    # compressed-tensors' own NVFP4 preset (``quant_scheme.NVFP4``): its input_activations
    # declare the per-tensor ``input_global_scale`` with dynamic local 16-blocks.
    NVFP4_INPUT_ACTIVATIONS = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16,
                               "strategy": "tensor_group", "dynamic": "local", "scale_dtype": "torch.float8_e4m3fn",
                               "observer": "static_minmax"}

    def config_files(self, fmt, quantized, skipped, config, activation_scales=False):
        nv = fmt.global_scale
        w = {"num_bits": 4, "type": "float", "symmetric": True, "dynamic": False,
             "strategy": "tensor_group" if nv else "group", "group_size": 16 if nv else 32}
        w["scale_dtype"] = "torch.float8_e4m3fn" if nv else "torch.uint8"
        inputs = dict(self.NVFP4_INPUT_ACTIVATIONS) if (nv and activation_scales) else None
        qc = {"quant_method": "compressed-tensors",
              "format": "nvfp4-pack-quantized" if nv else "mxfp4-pack-quantized",
              "quantization_status": "compressed",
              "config_groups": {"group_0": {"targets": sorted({_stem(q) for q in quantized}) or ["Linear"],
                                            "weights": w, "input_activations": inputs,
                                            "format": "nvfp4-pack-quantized" if nv else "mxfp4-pack-quantized"}},
              "ignore": sorted({_stem(s) for s in skipped})}
        c = dict(config or {})
        c["quantization_config"] = qc
        return {"config.json": c}


# ---------------------------------------------------------------------------------
# gpt-oss MXFP4
# ---------------------------------------------------------------------------------
class GptOss(Convention):
    def detect(self, names, metadata, files):
        qc = (files.get("config.json") or {}).get("quantization_config") or {}
        return qc.get("quant_method") == "mxfp4" or bool(self.groups(names, metadata))

    def groups(self, names, metadata):
        have = set(names)
        out = []
        for k in names:
            if k.endswith("_blocks") and k[: -len("_blocks")] + "_scales" in have:
                b = k[: -len("_blocks")]
                out.append(Group(b, {"blocks": k, "scales": b + "_scales"}))
        return out

    def check_format(self, fmt):
        if not (fmt.element.name == "e2m1" and fmt.scale.name == "e8m0" and fmt.block_size == 32):
            raise ValueError(f"convention 'gpt-oss' stores mxfp4 only, not {fmt.name!r}")
        return fmt

    selects = ("only 3-D MoE expert tensors named '*.experts.*_proj' (HF [E, in, out], blocks along in, "
               "in a multiple of 32)")

    # gpt-oss quantizes only the MoE expert matrices. HF keeps them as [E, in, out]
    # (``gate_up_proj`` [E, H, 2I], ``down_proj`` [E, I, H]); the MXFP4 blocks run along
    # ``in``: [E, out, in/32, 16] (transformers transposes after dequantizing).
    @staticmethod
    def _expert(name: str, ndim: int) -> bool:
        return ndim == 3 and ".experts." in name and name.endswith("_proj")

    def quantizable(self, name, shape, fmt=None):
        # blocks run along ``in`` (dim -2 of HF's [E, in, out]), the last dim once prepared
        return self._expert(name, len(shape)) and super().quantizable(name, self.prepared_shape(name, shape), fmt)

    def prepared_shape(self, name, shape):
        shape = tuple(shape)
        return (*shape[:-2], shape[-1], shape[-2]) if self._expert(name, len(shape)) else shape

    def prepare(self, name, t):
        return t.transpose(-1, -2).contiguous() if self._expert(name, t.dim()) else t

    def restore(self, name, t):
        return t.transpose(-1, -2).contiguous() if self._expert(name, t.dim()) else t

    def decode(self, g, tensors, metadata):
        b = _need(tensors, "blocks", torch.uint8, g, self.name)
        s = _need(tensors, "scales", torch.uint8, g, self.name)
        if b.dim() < 3 or b.shape[-1] != 16 or tuple(b.shape[:-1]) != tuple(s.shape):
            raise ValueError(f"gpt-oss: {g.members['blocks']!r} {tuple(b.shape)} and {g.members['scales']!r} "
                             f"{tuple(s.shape)} do not form [..., rows, K/32, 16] and [..., rows, K/32]")
        if s.device.type != "meta" and bool((s == 255).any()):
            # OCP E8M0 0xFF is NaN; transformers' gpt-oss decode (integrations/mxfp4.py) reads it as
            # 2^128. Either way the weights are broken: say so instead of loading NaNs.
            where = tuple((s == 255).nonzero()[0].tolist())
            raise ValueError(f"gpt-oss: {g.members['scales']!r} holds the E8M0 NaN code 0xFF (first at index "
                             f"{where}); a gpt-oss scale is 0..254 (2^(s-127))")
        # the blocks are [..., rows, K/32, 16]: 16 bytes of two E2M1 codes each, the low nibble the even
        # element, as transformers' convert_moe_packed_tensors decodes them (== microscale's packing)
        data = b.reshape(*b.shape[:-2], b.shape[-2] * 16)
        shape = torch.Size((*data.shape[:-1], data.shape[-1] * 2))
        q = QTensor(data, s, get_format("mxfp4"), shape, torch.bfloat16, None, None, {})
        q.validate()
        return q

    def encode(self, base, q):
        self.check_format(q.fmt)
        _unpadded(q, self.name, base)
        blocks = q.data.reshape(*q.data.shape[:-1], q.data.shape[-1] // 16, 16)
        return {base + "_blocks": blocks, base + "_scales": q.scales}, {}

    def config_files(self, fmt, quantized, skipped, config, activation_scales=False):
        c = dict(config or {})
        c["quantization_config"] = {"quant_method": "mxfp4",
                                    "modules_to_not_convert": sorted({_stem(s) for s in skipped})}
        return {"config.json": c}


class Gguf(Convention):
    """Placeholder entry so ``get_convention('gguf')`` works; files go through gguf_io."""

    def groups(self, names, metadata):
        return []

    def check_format(self, fmt):
        from .gguf_io import gguf_type

        gguf_type(fmt)
        return fmt

    def quantizable(self, name, shape, fmt=None):  # NVFP4 super-blocks hold 64 elements
        return super().quantizable(name, shape, fmt) and (fmt is None or not fmt.global_scale or shape[-1] % 64 == 0)


# ---------------------------------------------------------------------------------
# fp8 block-128 (DeepSeek-V3, transformers' FineGrainedFP8: quant_method "fp8")
# ---------------------------------------------------------------------------------
class Fp8Block(Convention):
    """``<m>.weight`` E4M3 ``[N, K]`` beside ``<m>.weight_scale_inv`` ``[ceil(N/128), ceil(K/128)]`` (float32;
    bf16 / fp16 in some exports, widened exactly and written back as they came), the decode multiplier of each
    128 x 128 block (despite its name); activations quantized per token and 128 K on the fly
    (``activation_scheme: dynamic``)."""

    selects = "2-D weights named '*.weight' (any shape: partial 128 x 128 blocks at the edges)"

    def detect(self, names, metadata, files):
        qc = (files.get("config.json") or {}).get("quantization_config") or {}
        return qc.get("quant_method") == "fp8" and qc.get("weight_block_size") is not None \
            or bool(self.groups(names, metadata))

    def groups(self, names, metadata):
        have = set(names)
        out = []
        for k in names:
            if k.endswith(".weight_scale_inv"):
                m = k[: -len("_scale_inv")]
                if m not in have:
                    raise ValueError(f"{self.name}: {k!r} has no sibling {m!r}")
                out.append(Group(m, {"weight": m, "weight_scale_inv": k}))
        return out

    def check_format(self, fmt):
        if not (fmt.element.name == "e4m3" and fmt.block_size == 128 and fmt.block_rows == 128
                and fmt.scale.name == "fp32" and not fmt.zero_point and not fmt.global_scale):
            raise ValueError(f"convention {self.name!r} stores fp8_e4m3_block128x128 only, not {fmt.name!r}")
        return fmt

    def quantizable(self, name, shape, fmt=None):
        return len(shape) == 2 and name.endswith(".weight")

    def activation_format(self, q, files):
        qc = (files.get("config.json") or {}).get("quantization_config") or {}
        block = qc.get("weight_block_size")
        if block is not None and list(block) != [128, 128]:
            raise ValueError(f"{self.name}: config.json quantization_config.weight_block_size={block}; microscale reads "
                             "fp8 block checkpoints with [128, 128] blocks only")
        return "fp8_e4m3_block128" if qc.get("activation_scheme") == "dynamic" else None

    def decode(self, g, tensors, metadata):
        w = _need(tensors, "weight", torch.float8_e4m3fn, g, self.name)
        s = tensors["weight_scale_inv"]
        if s.dtype not in (torch.float32, torch.bfloat16, torch.float16):  # (Qwen3 FP8 ships bf16 scales)
            raise ValueError(f"{self.name}: {g.members['weight_scale_inv']!r} has dtype {s.dtype}; expected float32, "
                             "bfloat16 or float16")
        if w.dim() != 2:
            raise ValueError(f"{self.name}: {g.members['weight']!r} has shape {tuple(w.shape)}; expected [N, K]")
        n, k = w.shape
        want = (-(-n // 128), -(-k // 128))
        if tuple(s.shape) != want:
            raise ValueError(f"{self.name}: {g.members['weight_scale_inv']!r} has shape {tuple(s.shape)}; expected "
                             f"{list(want)} (one scale per 128 x 128 block of the [{n}, {k}] weight; microscale reads "
                             "weight_block_size [128, 128] only)")
        if w.device != s.device:  # (a lazy read: large members are meta tensors, small ones real)
            s = s.to(w.device)
        codes = w.view(torch.uint8)
        if (n, k) != (want[0] * 128, want[1] * 128):  # QTensor codes cover whole blocks: zero-padded copy
            codes = torch.nn.functional.pad(codes, (0, want[1] * 128 - k, 0, want[0] * 128 - n))
        meta = {} if s.dtype == torch.float32 else {"scale_dtype": str(s.dtype).removeprefix("torch.")}
        q = QTensor(codes, s.to(torch.float32), get_format("fp8_e4m3_block128x128"), torch.Size((n, k)),
                    torch.bfloat16, None, None, meta)  # (bf16 / fp16 scales widen exactly)
        q.validate()
        return q

    def encode(self, base, q):
        self.check_format(q.fmt)
        n, k = (int(v) for v in q.shape)
        codes = q.data if tuple(q.padded_shape) == (n, k) else q.data[:n, :k].contiguous()
        sdt = getattr(torch, q.meta.get("scale_dtype", "float32"))
        scales = q.scales.to(sdt)
        if sdt != torch.float32 and not torch.equal(scales.to(torch.float32), q.scales):
            raise ValueError(f"{self.name}: {base!r} came with {sdt} scales but now holds scales {sdt} cannot hold "
                             "exactly; drop its meta 'scale_dtype' to write float32 scales")
        return {base: codes.view(torch.float8_e4m3fn), base + "_scale_inv": scales}, {}

    def config_files(self, fmt, quantized, skipped, config, activation_scales=False):
        if config is None:
            return {}
        c = dict(config)
        c["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                    "weight_block_size": [128, 128],
                                    "modules_to_not_convert": sorted({_stem(s) for s in skipped})}
        return {"config.json": c}


register_convention(Native("native", "microscale safetensors: QTensor fields + JSON metadata, every format"))
register_convention(ModelOpt("modelopt", "NVIDIA ModelOpt HF export (NVFP4)", ("nvfp4",)))
register_convention(CompressedTensors("compressed-tensors", "compressed-tensors nvfp4/mxfp4-pack-quantized",
                                      ("nvfp4", "mxfp4")))
register_convention(GptOss("gpt-oss", "gpt-oss MXFP4 *_blocks / *_scales", ("mxfp4",)))
register_convention(Fp8Block("fp8-block", "DeepSeek-V3 / transformers FineGrainedFP8: *.weight E4M3 + "
                                          "*.weight_scale_inv per 128x128", ("fp8_e4m3_block128x128",)))
register_convention(Gguf("gguf", "GGUF file, MXFP4 (type 39) and NVFP4 (type 40) tensors", ("nvfp4", "mxfp4")))

def quantizable_tensors(convention: str | Convention, shapes: dict[str, tuple[int, ...]],
                        fmt: str | Format) -> list[str]:
    """The names among ``shapes`` (tensor name -> shape of a float tensor) that ``convention``
    would quantize to ``fmt`` by name and shape alone (skip patterns and dtypes aside); an
    empty list means a conversion would write no quantized tensor (e.g. ``gpt-oss`` on a
    dense model: see ``convention.selects``)."""
    conv = get_convention(convention)
    f = conv.check_format(get_format(fmt))
    return [n for n, s in shapes.items() if len(s) >= 2 and conv.quantizable(n, tuple(s), f)
            and conv.prepared_shape(n, tuple(s))[-1] >= f.block_size]


# Detection order: the most specific first.
DETECT_ORDER = ("native", "modelopt", "compressed-tensors", "gpt-oss", "fp8-block")


def json_dumps(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=False) + "\n"
