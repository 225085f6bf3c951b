"""Tensor-parallel block-scaled layers over torch.distributed: check, then time, on 2-4 GPUs.

    torchrun --nproc-per-node 2 benchmarks/run_tp.py [--out DIR]      # NCCL on 2 GPUs
    torchrun --nproc-per-node 4 benchmarks/run_tp.py [--out DIR]      # NCCL on 4 GPUs
    torchrun --nproc-per-node 2 benchmarks/run_tp.py --device cpu --quick --out /tmp/tpout   # gloo dry run

(``python -m torch.distributed.run`` where ``torchrun`` is not on PATH.) On CUDA the script turns NVLink
multicast off before the process group starts (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``); on the CPU it runs over gloo.

Sections (``--only``):

* ``layers`` — for NVFP4, MXFP4 and fp8 block 128x128 at 1, 16 and 4096 tokens: a column-parallel
  28672x8192 layer (output all-gathered) and a row-parallel 8192x28672 layer (parallel input, partial sums
  all-reduced in float32). Checked first against the same layer on one device: the gathered column output
  equals ``ms.linear`` bit for bit (bf16); the row output with float32 activations is within rel 1e-5 of the
  float32 single-device product, and with bf16 activations no further from it than 3x the single-device bf16
  output is. Then timed: the single-device layer (rank 0), the local product alone, the collective alone and
  the whole parallel layer; speedup = single / parallel layer, efficiency = speedup / world size, and the
  communication share of the step.
* ``model`` — a tiny Llama built from a config, quantized, parallelized with the default plan: float32
  logits within rel 1e-5 of the single-device quantized model (bf16 logits reported).
* ``loading`` — a checkpoint of the two layer weights per format, each rank reading only its slice with
  ``load_sharded``: bytes read, peak host memory (RSS high-water mark) and GPU memory per rank, the shard
  equal to cutting the full tensor.

Timing (all ranks in lockstep, so every rank makes the same calls): the first call per input set untimed,
then warm-up batches that double until ``--warmup-ms`` has passed; each sample starts after a barrier and
covers enough back-to-back calls to fill ``--sample-ms`` (CUDA events on the current stream, which waits for
NCCL's; ``perf_counter`` on the CPU); a sample's time is the slowest rank's; the statistic is the median
over samples (20th / 80th percentiles as spread, :func:`microscale.bench._timing.quantiles`). Calls rotate
over copies of the weight whose bytes together exceed 3x L2 (:func:`microscale.bench._timing.rotation_count`);
activations are shared, as a layer reads the previous one's output. Eager calls, no CUDA graphs, for the
single-device layer too, so the ratio compares like with like.

Outputs (rank 0, atomically): ``OUT/tp_<device>_w<world>.json`` and ``.md``, rewritten after each case.
Exit status 1 when any check fails (the speed target is reported, not enforced).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout this script lives in, before any installed copy
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import microscale as ms  # noqa: E402
from microscale.bench._timing import Timing, l2_cache_bytes, quantiles, rotation_count  # noqa: E402
from microscale.bench.report import collect_env, write_json, write_text_atomic  # noqa: E402
from microscale.distributed import (ColumnParallelQuantLinear, ReadStats, RowParallelQuantLinear,  # noqa: E402
                                    load_sharded, parallelize, shard)

#: NVLink multicast off in NCCL, PyTorch's symmetric memory and NVSHMEM (set before any process group)
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
FORMATS = ("nvfp4", "mxfp4", "fp8_e4m3_block128x128")
TOKENS = (1, 16, 4096)
#: (parallel style, N, K): gate/up projections column-parallel, the down projection row-parallel
SHAPES = (("column", 28672, 8192), ("row", 8192, 28672))
QUICK_TOKENS = (1, 16, 128)
QUICK_SHAPES = (("column", 512, 1024), ("row", 1024, 512))
#: 2-way speedup over one device the column-parallel 28672x8192 layer should reach at 4096 tokens
TARGET = {"world": 2, "parallel": "column", "n": 28672, "k": 8192, "tokens": 4096, "speedup": 1.8}
ROW_FP32_TOL = 1e-5  # float32 summation order
ROW_BF16_FACTOR = 3.0  # bf16 partial sums: each rounded once more than the single-device output
LOAD_SLACK = 16 << 20  # host bytes beyond 1.25x the shard that the loading check allows (allocator, file objects)


@dataclasses.dataclass
class Config:
    """What to run. Defaults: the GPU run; :func:`quick_config` the CPU dry run."""

    device: str = "cuda"
    formats: Sequence[str] = FORMATS
    tokens: Sequence[int] = TOKENS
    shapes: Sequence[tuple[str, int, int]] = SHAPES
    sections: Sequence[str] = ("layers", "model", "loading")
    warmup_ms: float = 25.0
    target_ms: float = 200.0
    sample_ms: float = 10.0
    min_reps: int = 10
    max_reps: int = 500
    rotate: bool = True
    seed: int = 0
    model_dims: tuple[int, int, int, int] = (1024, 2048, 8, 4)  # hidden, intermediate, heads, kv heads
    model_formats: Sequence[str] = FORMATS
    tmp: Optional[str] = None  # where rank 0 writes the loading section's checkpoints
    out: Optional[str] = None  # results folder (rank 0 writes there after each case)
    quick: bool = False


def quick_config(**kw) -> Config:
    """Small shapes and short timings for a CPU dry run (gloo)."""
    base = dict(device="cpu", tokens=QUICK_TOKENS, shapes=QUICK_SHAPES, warmup_ms=5.0, target_ms=40.0,
                sample_ms=1.0, min_reps=3, max_reps=20, rotate=False, model_dims=(256, 512, 8, 4), quick=True)
    base.update(kw)
    return Config(**base)


# ---- lockstep collectives and timing -----------------------------------------------------

class Lockstep:
    """The ranks of ``group`` acting together: agreement on numbers, barriers, and a timing loop in
    which every rank makes the same calls. ``solo=True``: this rank alone (no collectives)."""

    def __init__(self, device: torch.device, group: Optional[dist.ProcessGroup] = None, solo: bool = False):
        self.device, self.group, self.solo = device, group, solo
        self.world = 1 if solo else dist.get_world_size(group)
        self.rank = 0 if solo else dist.get_rank(group)
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def reduce(self, values: Sequence[float], op: str = "max") -> list[float]:
        """Elementwise max (or min) of ``values`` over the ranks."""
        if self.solo or not values:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN, group=self.group)
        return t.tolist()

    def barrier(self) -> None:
        """Every rank's device idle and every rank here (an all-reduce of one number, then a sync)."""
        self.sync()
        self.reduce([0.0])
        self.sync()

    def _global(self, src: int) -> int:
        return src if self.group is None else dist.get_global_rank(self.group, src)

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """``t`` from rank ``src`` of the group into ``t`` on every rank (as bytes, so fp8 storage travels too)."""
        if not self.solo:
            if not t.is_contiguous():
                raise ValueError(f"run_tp: broadcast needs a contiguous tensor, got strides {t.stride()}")
            dist.broadcast(t.reshape(-1).view(torch.uint8), src=self._global(src), group=self.group)
        return t

    def objects(self, obj: Any, src: int = 0) -> Any:
        """A picklable object from rank ``src`` of the group."""
        if self.solo:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self._global(src), group=self.group,
                                   device=self.device if self.cuda else None)
        return box[0]

    def _batch(self, fn: Callable, sets: Sequence[tuple], start: int, k: int) -> tuple[float, float]:
        """(ms per call, host ms per call to issue it) of ``k`` back-to-back calls rotating over ``sets``."""
        a = b = None
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        t0 = time.perf_counter()
        for i in range(k):
            fn(*sets[(start + i) % len(sets)])
        host = (time.perf_counter() - t0) * 1e3 / k
        if b is None:
            return host, host
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / k, host

    def time(self, fn: Callable, sets: Sequence[tuple], cfg: Config) -> Timing:
        """Median ms per call of ``fn(*s)`` over ``sets``, each sample the slowest rank's (see the module
        docstring). Every decision (batch sizes, sample count) is agreed, so collectives inside ``fn``
        stay matched."""
        for s in sets:
            fn(*s)
        self.barrier()
        k, spent, idx, est, host = 1, 0.0, 0, 0.0, 0.0
        while True:
            self.barrier()
            dev_ms, host_ms = self._batch(fn, sets, idx, k)
            est, batch_host = self.reduce([dev_ms, host_ms])
            if k <= 16:  # small batches never fill the launch queue, so their host time is the time to issue
                host = batch_host
            idx += k
            spent += est * k
            if spent >= cfg.warmup_ms or k >= 4096:
                break
            k *= 2
        est = max(est, 1e-6)
        calls = max(1, min(4096, math.ceil(cfg.sample_ms / est)))
        reps = int(max(cfg.min_reps, min(cfg.max_reps, cfg.target_ms / (est * calls))))
        samples = []
        for _ in range(reps):
            self.barrier()
            samples.append(self._batch(fn, sets, idx, calls)[0])
            idx += calls
        samples = self.reduce(samples)
        med, p20, p80 = quantiles(samples)
        method = "lockstep events" if self.cuda else "lockstep perf_counter"
        # host_us: time to issue one call (slowest rank); near the median, Python and launches set the pace
        return Timing(med, p20, p80, len(samples), method, len(sets), calls,
                      "" if self.solo else f"slowest of {self.world} ranks per sample",
                      host * 1e3 if self.cuda else None)


# ---- weights, inputs, helpers -------------------------------------------------------------

def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (inf for a shape mismatch or non-finite values)."""
    if a.shape != b.shape:
        return float("inf")
    a, b = a.double(), b.double()
    if not bool(torch.isfinite(a).all()):
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def copy_q(q: ms.QTensor) -> ms.QTensor:
    """A QTensor with its own storage (so each copy carries its own linear-op state)."""
    c = lambda t: None if t is None else t.clone()  # noqa: E731
    return ms.QTensor(c(q.data), c(q.scales), q.fmt, q.shape, q.dtype, c(q.global_scale), c(q.zero_points),
                      dict(q.meta))


def shared_weight(ls: Lockstep, n: int, k: int, fmt: str, seed: int) -> ms.QTensor:
    """The same quantized ``[n, k]`` weight on every rank: quantized on rank 0, its bytes broadcast."""
    parts = ("data", "scales", "global_scale", "zero_points")
    q = None
    if ls.rank == 0:
        g = torch.Generator(device=ls.device).manual_seed(seed)
        q = ms.quantize(torch.randn(n, k, generator=g, device=ls.device), fmt, pad=True)
        layout = {p: None if getattr(q, p) is None else (tuple(getattr(q, p).shape), getattr(q, p).dtype)
                  for p in parts}
        head = (layout, tuple(q.shape), q.dtype, dict(q.meta))
    else:
        head = None
    layout, shape, dtype, meta = ls.objects(head)
    if q is None:
        t = {p: None if v is None else torch.empty(v[0], dtype=v[1], device=ls.device) for p, v in layout.items()}
        q = ms.QTensor(t["data"], t["scales"], ms.get_format(fmt), torch.Size(shape), dtype, t["global_scale"],
                       t["zero_points"], meta)
    for p in parts:
        if getattr(q, p) is not None:
            ls.broadcast(getattr(q, p))
    return q


def shared_input(ls: Lockstep, shape: tuple[int, ...], seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    x = torch.empty(shape, dtype=dtype, device=ls.device)
    if ls.rank == 0:
        g = torch.Generator(device=ls.device).manual_seed(seed)
        x.copy_(torch.randn(shape, generator=g, device=ls.device))
    return ls.broadcast(x)


def n_sets(ls: Lockstep, q: ms.QTensor, cfg: Config) -> int:
    if not (cfg.rotate and ls.cuda):
        return 1
    return rotation_count(q.nbytes, l2_cache_bytes(ls.device), max_total_bytes=2 << 30)


def route(x: torch.Tensor, q: ms.QTensor) -> str:
    """The backend ``ms.linear`` takes for ``x`` and ``q``."""
    from microscale.linear.routing import explain

    try:
        return explain(x, q)[-1][0]
    except Exception as e:  # noqa: BLE001 - a label only; the checks run the op itself
        return f"? ({type(e).__name__})"


class Clocks:
    """The GPU's SM clock while a timing ran (:class:`microscale.bench._clocks.Monitor`; inert on the CPU)."""

    def __init__(self, device: torch.device):
        from microscale.bench._clocks import Monitor

        self.mon = Monitor(device)

    def __enter__(self):
        self.mon.__enter__()
        return self

    def __exit__(self, *exc):
        self.mon.__exit__(*exc)

    def timed(self, fn: Callable[[], Timing]) -> tuple[Timing, Optional[str]]:
        self.mon.settle(1.0)
        t0 = time.time()
        out = fn()
        st = self.mon.window(t0, time.time())
        return out, None if st is None else st.summary()


def check(name: str, ok: bool, err: float, tol: Any, note: str = "") -> dict:
    return {"name": name, "ok": bool(ok), "err": err, "tol": tol, "note": note}


def agree_checks(ls: Lockstep, checks: list[dict]) -> list[dict]:
    """Every rank's checks combined: ok only where ok on all ranks, the largest error."""
    oks = ls.reduce([1.0 if c["ok"] else 0.0 for c in checks], "min")
    errs = ls.reduce([c["err"] if math.isfinite(c["err"]) else 1e300 for c in checks])
    return [{**c, "ok": o > 0.5, "err": (e if e < 1e300 else float("inf"))} for c, o, e in zip(checks, oks, errs)]


# ---- section: layers ----------------------------------------------------------------------

def _layer_checks(ls: Lockstep, parallel: str, q: ms.QTensor, layer, x: torch.Tensor) -> list[dict]:
    out = []
    if parallel == "column":
        y, want = layer(x), ms.linear(x, q)
        same = y.shape == want.shape and y.dtype == want.dtype and torch.equal(y, want)
        diff = 0 if same else int((y != want).sum()) if y.shape == want.shape else -1
        out.append(check("column bf16: gathered == single-device ms.linear (bitwise)", same,
                         0.0 if same else rel(y, want), "bitwise", "" if same else f"{diff} elements differ"))
        return out
    xl = layer.local_input(x).contiguous()
    ref32 = F.linear(x.float(), q.dequantize(torch.float32))
    err32 = rel(layer(xl.float()), ref32)
    out.append(check("row fp32: reduced vs single-device fp32", err32 <= ROW_FP32_TOL, err32, ROW_FP32_TOL))
    single = rel(ms.linear(x, q), ref32)
    err16 = rel(layer(xl), ref32)
    tol = ROW_BF16_FACTOR * single + 1e-7
    out.append(check("row bf16: vs single-device fp32, within 3x the single-device bf16 error", err16 <= tol, err16,
                     tol, f"single-device bf16 error {single:.3g}"))
    return out


def _layer_case(ls: Lockstep, cfg: Config, fmt: str, parallel: str, n: int, k: int, q: ms.QTensor,
                layers: list, clocks: Clocks, tokens: int, seed: int) -> dict:
    world = ls.world
    x = shared_input(ls, (tokens, k), seed)
    layer = layers[0]
    xl = x if parallel == "column" else layer.local_input(x).contiguous()
    res: dict[str, Any] = {"section": "layers", "format": fmt, "parallel": parallel, "n": n, "k": k,
                           "tokens": tokens, "world": world, "local": [n // world, k] if parallel == "column"
                           else [n, k // world], "sets": len(layers)}
    res["routes"] = {"single": route(x, q), "local": route(xl, layer.weight)}
    with torch.no_grad():
        res["checks"] = agree_checks(ls, _layer_checks(ls, parallel, q, layer, x))
    if ls.cuda:
        torch.cuda.empty_cache()
    timing: dict[str, Any] = {}
    clock: dict[str, Any] = {}
    with torch.no_grad():
        # the single-device layer on rank 0 alone; the other ranks wait at the next barrier
        single = None
        if ls.rank == 0:
            solo = Lockstep(ls.device, solo=True)
            full = [q] + [copy_q(q) for _ in range(n_sets(solo, q, cfg) - 1)]
            single, clock["single"] = clocks.timed(lambda: solo.time(lambda w, a: ms.linear(a, w),
                                                                    [(w, x) for w in full], cfg))
            del full
            single = single.to_dict()
        timing["single"] = ls.objects(single)
        clock["single"] = ls.objects(clock.get("single"))
        ls.barrier()
        timing["local"] = ls.time(lambda w, a: ms.linear(a, w), [(m.weight, xl) for m in layers], cfg).to_dict()
        y = ms.linear(xl, layer.weight)
        if parallel == "column":
            parts = [torch.empty_like(y) for _ in range(world)]
            comm = lambda t: dist.all_gather(parts, t, group=ls.group)  # noqa: E731
            csets = [(y.contiguous(),)]
            res["collective"] = f"all_gather {tuple(y.shape)} {str(y.dtype).removeprefix('torch.')}"
        else:
            buf = torch.zeros(y.shape, dtype=torch.float32, device=ls.device)  # zeros: a sum that stays put
            comm = lambda t: dist.all_reduce(t, group=ls.group)  # noqa: E731
            csets = [(buf,)]
            res["collective"] = f"all_reduce {tuple(buf.shape)} float32"
        timing["comm"] = ls.time(comm, csets, cfg).to_dict()
        del y, csets
        t, c = clocks.timed(lambda: ls.time(lambda m, a: m(a), [(m, xl) for m in layers], cfg))
        timing["layer"] = t.to_dict()
        clock["layer"] = [s for s in (_gather_obj(ls, c) or []) if s]
    res["timing"] = timing
    res["clocks"] = clock
    s, lay, loc, com = (timing[k]["median_ms"] for k in ("single", "layer", "local", "comm"))
    res["speedup"] = s / lay
    res["efficiency"] = s / lay / world
    res["compute_speedup"] = s / loc
    res["comm_share"] = com / lay
    res["other_ms"] = lay - loc - com
    if (world, parallel, n, k, tokens) == tuple(TARGET[key] for key in ("world", "parallel", "n", "k", "tokens")):
        res["target"] = {"speedup": TARGET["speedup"], "met": res["speedup"] >= TARGET["speedup"]}
    return res


def _gather_obj(ls: Lockstep, obj: Any) -> Optional[list]:
    if ls.solo:
        return [obj]
    box: list = [None] * ls.world
    dist.all_gather_object(box, obj, group=ls.group)
    return box


def _build_layers(ls: Lockstep, cfg: Config, parallel: str, q: ms.QTensor) -> list:
    first = (ColumnParallelQuantLinear.from_qtensor(q, None, ls.group, gather_output=True) if parallel == "column"
             else RowParallelQuantLinear.from_qtensor(q, None, ls.group, input_is_parallel=True))
    out = [first]
    for _ in range(n_sets(ls, first.weight, cfg) - 1):
        kw = {"gather_output": True} if parallel == "column" else {"input_is_parallel": True}
        out.append(type(first)(copy_q(first.weight), None, ls.group, first.spec, first.in_features,
                               first.out_features, **kw))
    return out


def run_layers(ls: Lockstep, cfg: Config, emit: Callable[[dict], None]) -> None:
    with Clocks(ls.device) as clocks:
        for fi, fmt in enumerate(cfg.formats):
            for si, (parallel, n, k) in enumerate(cfg.shapes):
                seed = cfg.seed + 1000 * fi + 100 * si
                q = layers = None
                try:
                    q = shared_weight(ls, n, k, fmt, seed)
                    layers = _build_layers(ls, cfg, parallel, q)
                except Exception as e:  # noqa: BLE001 - the same on every rank (no collective raised)
                    for t in cfg.tokens:
                        emit(_error("layers", e, format=fmt, parallel=parallel, n=n, k=k, tokens=t, world=ls.world))
                    continue
                for t in cfg.tokens:
                    try:
                        emit(_layer_case(ls, cfg, fmt, parallel, n, k, q, layers, clocks, t, seed + t))
                    except Exception as e:  # noqa: BLE001 - recorded; a rank that raised alone leaves the others waiting
                        emit(_error("layers", e, format=fmt, parallel=parallel, n=n, k=k, tokens=t, world=ls.world))
                    if ls.cuda:
                        torch.cuda.empty_cache()
                del q, layers
                gc.collect()


def _error(section: str, e: BaseException, **kw) -> dict:
    traceback.print_exc()
    msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    return {"section": section, **kw, "checks": [check("ran", False, float("inf"), "-", msg)], "error": msg}


# ---- section: model -----------------------------------------------------------------------

def run_model(ls: Lockstep, cfg: Config, emit: Callable[[dict], None]) -> None:
    """A tiny Llama (built from a config), quantized, parallelized: logits vs the single-device model."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:  # the same on every rank
        emit({"section": "model", "world": ls.world, "format": "-", "skipped": f"transformers: {e}", "checks": []})
        return
    from microscale.nn import quantize_model

    hidden, inter, heads, kv = cfg.model_dims
    conf = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
                       num_key_value_heads=kv, num_hidden_layers=2, vocab_size=256, max_position_embeddings=128,
                       attn_implementation="eager")
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(cfg.seed)).to(ls.device)
    for fmt in cfg.model_formats:
        res = {"section": "model", "format": fmt, "world": ls.world, "config": f"Llama h={hidden} i={inter} "
               f"heads={heads}/{kv} layers=2", "tokens": int(ids.numel())}
        try:
            torch.manual_seed(cfg.seed)  # the same float weights on every rank (CPU generator)
            base = LlamaForCausalLM(conf).eval().to(ls.device)
            quantize_model(base, fmt)  # bit-exact, so the same bytes on every rank
            with torch.no_grad():
                ref32 = base(ids).logits
                ref16 = copy.deepcopy(base).to(torch.bfloat16)(ids).logits
                try:
                    tp32 = parallelize(copy.deepcopy(base), group=ls.group)
                    tp16 = parallelize(copy.deepcopy(base).to(torch.bfloat16), group=ls.group)
                except ValueError as e:  # a shard would cut a block or a head: the same on every rank
                    res.update(skipped=str(e).splitlines()[0][:300], checks=[])
                    emit(res)
                    continue
                out32, out16 = tp32(ids).logits, tp16(ids).logits
            err = rel(out32, ref32)
            res["checks"] = agree_checks(ls, [check("model fp32 logits: parallel vs single-device", err <= ROW_FP32_TOL,
                                                    err, ROW_FP32_TOL)])
            res["info"] = {"bf16_rel_vs_fp32": ls.reduce([rel(out16, ref32)])[0],
                           "single_bf16_rel_vs_fp32": rel(ref16, ref32),
                           "parallel_modules": sorted({type(m).__name__ for m in tp32.modules()
                                                       if "Parallel" in type(m).__name__})}
        except Exception as e:  # noqa: BLE001
            res = _error("model", e, **{k: res[k] for k in ("format", "world", "config")})
        emit(res)


# ---- section: loading ---------------------------------------------------------------------

def _rss() -> Optional[tuple[int, int]]:
    """(current RSS, high-water mark) of this process in bytes, from /proc (None elsewhere)."""
    try:
        text = Path("/proc/self/status").read_text()
        return tuple(int(re.search(rf"{k}:\s+(\d+)", text).group(1)) * 1024 for k in ("VmRSS", "VmHWM"))
    except (OSError, AttributeError):
        return None


def _reset_hwm() -> bool:
    """Reset the RSS high-water mark to the current RSS (Linux ``clear_refs`` 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _gpu_peak(tensors: dict, device: torch.device, before: int) -> int:
    """Peak GPU bytes allocated beyond ``before`` once ``tensors`` are on ``device`` (freed on return)."""
    on_device = [v.to(device) for v in tensors.values()]
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    on_device.clear()
    return peak


def _qbytes(q: ms.QTensor) -> int:
    return sum(t.numel() * t.element_size() for t in (q.data, q.scales, q.zero_points) if t is not None)


def _same_bytes(a: ms.QTensor, b: ms.QTensor) -> bool:
    def eq(x, y):
        if x is None or y is None:
            return x is None and y is None
        return x.shape == y.shape and x.dtype == y.dtype and torch.equal(
            x.contiguous().reshape(-1).view(torch.uint8).cpu(), y.contiguous().reshape(-1).view(torch.uint8).cpu())
    return a.shape == b.shape and all(eq(getattr(a, p), getattr(b, p))
                                      for p in ("data", "scales", "global_scale", "zero_points"))


def run_loading(ls: Lockstep, cfg: Config, emit: Callable[[dict], None]) -> None:
    """Rank 0 writes one checkpoint per format (an up and a down projection); each rank reads its slice."""
    import microscale.io as msio

    names = {"column": "model.layers.0.mlp.up_proj.weight", "row": "model.layers.0.mlp.down_proj.weight"}
    root = ls.objects(tempfile.mkdtemp(prefix="ms_tp_", dir=cfg.tmp) if ls.rank == 0 else None)
    try:
        for fi, fmt in enumerate(cfg.formats):
            path = os.path.join(root, fmt)
            res: dict[str, Any] = {"section": "loading", "format": fmt, "world": ls.world}
            try:
                qs = {p: shared_weight(ls, n, k, fmt, cfg.seed + 7 + 1000 * fi + si)
                      for si, (p, n, k) in enumerate(cfg.shapes)}
                if ls.rank == 0:
                    msio.save({names[p]: q.to("cpu") for p, q in qs.items()}, path)
                full_bytes = {p: _qbytes(q) for p, q in qs.items()}
                ls.barrier()
                gc.collect()
                if ls.cuda:
                    torch.cuda.reset_peak_memory_stats(ls.device)
                    gpu0 = torch.cuda.memory_allocated(ls.device)
                hwm_ok = _reset_hwm()
                before = _rss()
                st = ReadStats()
                t0 = time.perf_counter()
                got = load_sharded(path, ls.world, ls.rank, stats=st)
                secs = time.perf_counter() - t0
                after = _rss()
                host_peak = (after[1] - before[0]) if (hwm_ok and before and after) else None
                gpu_peak = _gpu_peak(got, ls.device, gpu0) if ls.cuda else None
                local = {p: _qbytes(got[names[p]]) for p in qs}
                shard_total = sum(local.values())
                dims = {"column": "n", "row": "k"}
                same = all(_same_bytes(got[names[p]], shard(qs[p].to("cpu"), dims[p], ls.world, ls.rank)) for p in qs)
                scal = 64 * len(qs)  # replicated scalars (global scales) are read whole
                checks = [check("loaded shard == shard of the full tensor (bytes)", same, 0.0 if same else 1.0, "bitwise"),
                          check("bytes read == shard bytes (+ scalars)", shard_total <= st.bytes_read <= shard_total
                                + scal, float(st.bytes_read - shard_total), f"0..{scal}")]
                if host_peak is not None:
                    tol = 1.25 * shard_total + LOAD_SLACK
                    checks.append(check("peak host memory of the load <= 1.25x shard + 16 MiB", host_peak <= tol,
                                        float(host_peak), tol))
                per_rank = _gather_obj(ls, {"rank": ls.rank, "bytes_read": st.bytes_read, "shard_bytes": shard_total,
                                            "host_peak_bytes": host_peak, "gpu_peak_bytes": gpu_peak,
                                            "seconds": secs})
                res.update(full_bytes=full_bytes, local_bytes=local, per_rank=per_rank,
                           checks=agree_checks(ls, checks))
                del got, qs
            except Exception as e:  # noqa: BLE001
                res = _error("loading", e, format=fmt, world=ls.world)
            emit(res)
            ls.barrier()
            if ls.rank == 0:
                shutil.rmtree(path, ignore_errors=True)
    finally:
        ls.barrier()
        if ls.rank == 0:
            shutil.rmtree(root, ignore_errors=True)


# ---- the run and its report ---------------------------------------------------------------

def _git() -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except Exception:  # noqa: BLE001 - no git, or not a checkout
        return None


def _nccl_version() -> Optional[str]:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a build without NCCL
        return None
    if isinstance(v, int):  # older torch: 2.21.5 as 22105
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
    return ".".join(map(str, v))


def environment(ls: Lockstep, cfg: Config) -> dict:
    env = collect_env(ls.device)
    env.update(world_size=ls.world, backend=dist.get_backend(ls.group), commit=_git(),
               nccl=_nccl_version() if ls.cuda else None,
               multicast_env={k: os.environ.get(k) for k in MULTICAST_OFF},
               devices=_gather_obj(ls, torch.cuda.get_device_name(ls.device) if ls.cuda else env.get("device")),
               quick=cfg.quick)
    return env


def run(cfg: Config, group: Optional[dist.ProcessGroup] = None) -> dict:
    """Every section of ``cfg`` on the ranks of ``group`` (torch.distributed initialized); returns the
    result document (the same on every rank). With ``cfg.out`` rank 0 writes it after each case."""
    device = torch.device(cfg.device, torch.cuda.current_device()) if cfg.device == "cuda" else torch.device("cpu")
    ls = Lockstep(device, group)
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 references are float32 products
    torch.backends.cudnn.allow_tf32 = False
    doc = {"schema": 1, "kind": "tensor-parallel", "env": environment(ls, cfg),
           "config": {k: (list(v) if isinstance(v, (tuple, list)) else v)
                      for k, v in dataclasses.asdict(cfg).items() if k not in ("out", "tmp")},
           "target": TARGET, "results": []}
    t_start = last = time.perf_counter()

    def emit(r: dict) -> None:
        nonlocal last
        now = time.perf_counter()
        r["seconds"], last = now - last, now  # since the previous result: where the run's time goes
        doc["results"].append(r)
        if ls.rank == 0:
            _print_row(r)
            if cfg.out:
                write_outputs(doc, cfg.out)

    sections = {"layers": run_layers, "model": run_model, "loading": run_loading}
    for name in cfg.sections:
        if name not in sections:
            raise ValueError(f"run_tp: unknown section {name!r}; expected some of {', '.join(sections)}")
        sections[name](ls, cfg, emit)
        ls.barrier()
    doc["seconds"] = time.perf_counter() - t_start
    doc["ok"] = all(c["ok"] for r in doc["results"] for c in r.get("checks", []))
    if ls.rank == 0 and cfg.out:
        write_outputs(doc, cfg.out)
    return doc


def _print_row(r: dict) -> None:
    bad = [c for c in r.get("checks", []) if not c["ok"]]
    head = " ".join(str(r.get(k)) for k in ("section", "format", "parallel", "tokens") if k in r)
    status = "skipped" if r.get("skipped") else ("FAIL " + "; ".join(f"{c['name']}: {c['err']:.3g} {c['note']}"
                                                                     for c in bad) if bad else "ok")
    extra = ""
    if "speedup" in r:
        tm = r["timing"]
        extra = (f" single {tm['single']['median_ms']:.4g} ms, TP layer {tm['layer']['median_ms']:.4g} ms "
                 f"(local {tm['local']['median_ms']:.4g}, comm {tm['comm']['median_ms']:.4g}) speedup "
                 f"{r['speedup']:.2f}x eff {r['efficiency']:.0%} comm {r['comm_share']:.0%}")
    print(f"[run_tp] {head}: {status}{extra}", flush=True)


def _ms(v: Optional[float]) -> str:
    if v is None:
        return "-"
    return f"{v * 1e3:.1f} us" if v < 1 else f"{v:.3f} ms"


def _tm(t: dict) -> str:
    """A timing's median; '(host)' where issuing a call took at least 90% of it (launch-bound)."""
    host = t.get("host_us")
    return _ms(t["median_ms"]) + (" (host)" if host is not None and host >= 0.9e3 * t["median_ms"] else "")


def render_markdown(doc: dict) -> str:
    """The result document as markdown: environment, target, one table per section."""
    env, world = doc["env"], doc["env"]["world_size"]
    lines = [f"# Tensor parallel, {world} ranks ({env['backend']})", "",
             f"- devices: {', '.join(map(str, env.get('devices') or [env.get('device')]))}",
             f"- torch {env['torch']}, NCCL {env.get('nccl') or '-'}, triton {env.get('triton') or '-'}, "
             f"CUDA {env.get('cuda_runtime') or '-'}, driver {env.get('driver') or '-'}",
             f"- commit {env.get('commit') or env.get('git') or '-'}, {env['date']}"
             + (" (quick: small shapes)" if env.get("quick") else ""),
             f"- NVLink multicast: {', '.join(f'{k}={v}' for k, v in env.get('multicast_env', {}).items())}",
             f"- checks: {'all passed' if doc.get('ok', True) else 'FAILED (see below)'}", ""]
    layers = [r for r in doc["results"] if r["section"] == "layers"]
    if layers:
        t = doc["target"]
        hits = [r for r in layers if "target" in r]
        if hits:
            lines += [f"Target: {t['world']}-way >= {t['speedup']}x one device on the {t['n']}x{t['k']} "
                      f"{t['parallel']}-parallel layer at {t['tokens']} tokens, communication included: "
                      + ", ".join(f"{r['format']} {r['speedup']:.2f}x ({'met' if r['target']['met'] else 'missed'}; "
                                  f"compute alone {r['compute_speedup']:.2f}x, comm {r['comm_share']:.0%} of the step)"
                                  for r in hits), ""]
        lines += ["Times are medians per call (each sample the slowest rank's); speedup = single / TP layer, "
                  "efficiency = speedup / ranks, comm = collective alone / TP layer; (host): issuing the calls took "
                  ">= 90% of the time, so Python and launches, not the device, set it.", "",
                  "| format | layer | tokens | checks | single | local matmul | collective | TP layer | speedup | "
                  "efficiency | comm | routes (single / local) |", "|" + "---|" * 12]
        for r in layers:
            ok = "ok" if all(c["ok"] for c in r.get("checks", [])) else "**FAIL**"
            if "timing" not in r:
                lines.append(f"| {r['format']} | {r['parallel']} {r['n']}x{r['k']} | {r['tokens']} | {ok} "
                             f"| {r.get('error', '')} |" + " |" * 7)
                continue
            tm = r["timing"]
            lines.append(f"| {r['format']} | {r['parallel']} {r['n']}x{r['k']} | {r['tokens']} | {ok} | "
                         f"{_tm(tm['single'])} | {_tm(tm['local'])} | {_tm(tm['comm'])} | {_tm(tm['layer'])} | "
                         f"{r['speedup']:.2f}x | "
                         f"{r['efficiency']:.0%} | {r['comm_share']:.0%} | {r['routes']['single']} / "
                         f"{r['routes']['local']} |")
        lines.append("")
    lines += _check_table(doc, "layers")
    models = [r for r in doc["results"] if r["section"] == "model"]
    if models:
        lines += ["## Tiny Llama, parallelized", "", "| format | model | fp32 logits rel. err | bf16 rel. err vs fp32 "
                  "(TP / single) | status |", "|---|---|---|---|---|"]
        for r in models:
            info = r.get("info", {})
            c = r.get("checks") or [{}]
            status = r.get("skipped") and f"skipped: {r['skipped']}" or ("ok" if c[0].get("ok") else
                                                                        f"**FAIL** {r.get('error', '')}")
            num = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
            lines.append(f"| {r['format']} | {r.get('config', '')} | {num(c[0].get('err'))} | "
                         f"{num(info.get('bf16_rel_vs_fp32'))} / {num(info.get('single_bf16_rel_vs_fp32'))} | {status} |")
        lines.append("")
    loads = [r for r in doc["results"] if r["section"] == "loading"]
    if loads:
        lines += ["## Sharded checkpoint loading", "", "| format | rank | full MB | shard MB | read MB | host peak MB "
                  "| GPU peak MB | s | checks |", "|---|---|---|---|---|---|---|---|---|"]
        mb = lambda v: "-" if v is None else f"{v / 2**20:.1f}"  # noqa: E731
        for r in loads:
            ok = "ok" if all(c["ok"] for c in r.get("checks", [])) else f"**FAIL** {r.get('error', '')}"
            for p in r.get("per_rank") or [{}]:
                lines.append(f"| {r['format']} | {p.get('rank', '-')} | {mb(sum((r.get('full_bytes') or {}).values()))}"
                             f" | {mb(p.get('shard_bytes'))} | {mb(p.get('bytes_read'))} | {mb(p.get('host_peak_bytes'))}"
                             f" | {mb(p.get('gpu_peak_bytes'))} | {p.get('seconds', 0):.2f} | {ok} |")
        lines.append("")
    lines += [f"Run time {doc.get('seconds', 0):.0f} s.", ""]
    return "\n".join(lines)


def _check_table(doc: dict, section: str) -> list[str]:
    bad = [(r, c) for r in doc["results"] if r["section"] == section for c in r.get("checks", []) if not c["ok"]]
    if not bad:
        return []
    out = ["Failed checks:", ""]
    for r, c in bad:
        out.append(f"- {r.get('format')} {r.get('parallel', '')} {r.get('tokens', '')} tokens: {c['name']}: "
                   f"{c['err']:.3g} (tol {c['tol']}) {c['note']}")
    return out + [""]


def write_outputs(doc: dict, out: str | os.PathLike) -> tuple[Path, Path]:
    """``OUT/tp_<device>_w<world>.json`` and ``.md``, each written atomically."""
    env = doc["env"]
    stem = f"tp_{'cuda' if env.get('nccl') else 'cpu'}_w{env['world_size']}"
    out = Path(out)
    return write_json(doc, out / f"{stem}.json"), write_text_atomic(out / f"{stem}.md", render_markdown(doc))


# ---- command line -------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="tp_out", help="results folder (default ./tp_out)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="cuda (NCCL, one GPU per rank) or cpu (gloo); default cuda when available")
    p.add_argument("--quick", action="store_true", help="small shapes and short timings (the CPU dry run)")
    p.add_argument("--formats", help="comma-separated registry formats (default nvfp4,mxfp4,fp8_e4m3_block128x128)")
    p.add_argument("--tokens", help="comma-separated token counts (default 1,16,4096; quick 1,16,128)")
    p.add_argument("--only", help="comma-separated sections: layers, model, loading (default all)")
    p.add_argument("--target-ms", type=float, help="time each timing should fill (default 200; quick 40)")
    p.add_argument("--tmp", help="folder for the loading section's checkpoints (default the system temp folder)")
    return p


def config_from_args(args: argparse.Namespace) -> Config:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    kw: dict[str, Any] = {"device": device, "out": args.out, "tmp": args.tmp}
    if args.formats:
        kw["formats"] = kw["model_formats"] = tuple(s.strip() for s in args.formats.split(",") if s.strip())
        for f in kw["formats"]:
            ms.get_format(f)  # an unknown name fails here, with the registry's message
    if args.tokens:
        kw["tokens"] = tuple(int(s) for s in args.tokens.split(","))
    if args.only:
        kw["sections"] = tuple(s.strip() for s in args.only.split(",") if s.strip())
    if args.target_ms:
        kw["target_ms"] = args.target_ms
    return quick_config(**kw) if args.quick else Config(**kw)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    os.environ.update(MULTICAST_OFF)  # before the process group (and NCCL) start
    if "RANK" not in os.environ:
        print("run_tp: launch with torchrun --nproc-per-node N (or python -m torch.distributed.run)", file=sys.stderr)
        return 2
    if cfg.device == "cuda":
        if not torch.cuda.is_available():
            print("run_tp: --device cuda but no CUDA device; pass --device cpu for the gloo dry run", file=sys.stderr)
            return 2
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            print(f"run_tp: LOCAL_RANK {local} but {torch.cuda.device_count()} GPUs", file=sys.stderr)
            return 2
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", timeout=timedelta(minutes=5),
                                device_id=torch.device("cuda", local))
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
        dist.init_process_group("gloo", timeout=timedelta(minutes=5))
    try:
        doc = run(cfg)
        if dist.get_rank() == 0 and cfg.out:
            print(f"[run_tp] wrote {', '.join(map(str, write_outputs(doc, cfg.out)))} "
                  f"({'all checks passed' if doc['ok'] else 'CHECKS FAILED'}, {doc['seconds']:.0f} s)", flush=True)
        return 0 if doc["ok"] else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
