"""Compile every kernel specialization microscale launches, for sm_90, without a GPU: the
quantize / dequantize kernels, and every op family's launches listed by its
``microscale/<family>/_compile_cases.py`` (``launches(mode)``: the linear backends, MoE,
attention, ...).

    python tools/compile_check.py            # everything (quick + the GPU benchmark's launches)
    python tools/compile_check.py --quick    # registry + policies + layouts + fused, one shape
    python tools/compile_check.py --smoke    # a few launches, one per kind of run-time branch
    python tools/compile_check.py -j 4 --filter nvfp4 --list
    python tools/compile_check.py --filter microscale.linear   # one family's launches
    python tools/compile_check.py --sass     # SASS per element on the clean-tile path
    python tools/compile_check.py --pdl-order   # programmatic-launch order of quantize / dequantize

Why: the Triton interpreter (``TRITON_INTERPRET=1``, the CPU test suite) evaluates a
run-time ``if`` in Python, so it accepts code the compiler rejects (e.g. a variable
whose type or shape differs between the branches of a run-time ``if``). This script
runs the public entry points (``quantize``, ``quantize_for_gemm``, ``dequantize``,
``fused.rmsnorm_quantize`` / ``silu_mul_quantize`` and ``benchmarks/run_gpu_quantize.py``'s
checks, timings and sweep) on CPU tensors with the kernels' launches intercepted: each
launch is specialised by Triton's own launcher binder for a ``GPUTarget("cuda", 90, 32)``
backend (argument types, divisibility-by-16 and ==1 specialisations, constexprs, options
such as ``num_warps`` / ``enable_fp_fusion``: what the GPU launcher would compile; the
interpreter-only constexprs ``MANUAL_BF16`` / ``MARKSTEIN`` / ``HW_FP8`` / ``ASM`` take their GPU
values because ``TRITON_INTERPRET`` is unset here), de-duplicated, and each distinct
specialization is compiled to a cubin with ``triton.compile``. Nothing runs: outputs
are garbage. Exit status 1 when any specialization fails to compile.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import pkgutil
import re
import sys
import time
import traceback

os.environ.pop("TRITON_INTERPRET", None)  # before triton / microscale are imported

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from microscale import quant as kq  # noqa: E402
from microscale import reference, reference_fused  # noqa: E402
from microscale.formats import registry  # noqa: E402
from microscale.runtime import launch as _launch  # noqa: E402
from microscale.runtime import target  # noqa: E402
from microscale.quant import fused, params  # noqa: E402
from microscale.quant._kernels import amax as _ka, dequantize as _kd, quantize as _kqk  # noqa: E402
from sass import dump_compiled  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
BACKEND = make_backend(TARGET)

SPECS: dict = {}  # key -> dict(kernel, fn, signature, constexprs, attrs, options, where)
_WHERE = ["?"]
_BINDERS: dict = {}


def _record(fn, args, kwargs):
    binder = _BINDERS.get(fn)
    if binder is None:
        binder = _BINDERS[fn] = create_function_from_signature(fn.signature, fn.params, BACKEND)
    kwargs = dict(kwargs, debug=False)
    bound, specialization, options = binder(*args, **kwargs)
    key = (fn.__module__, fn.__name__, tuple(map(repr, specialization)),
           tuple(sorted((k, repr(v)) for k, v in options.items())))
    if key not in SPECS:
        opts, signature, constexprs, attrs = fn._pack_args(BACKEND, kwargs, bound, specialization, options)
        SPECS[key] = dict(kernel=fn.__name__, fn=fn, signature=signature, constexprs=constexprs, attrs=attrs,
                          options=opts.__dict__, where=_WHERE[0])


@contextlib.contextmanager
def intercept(interpreting: bool = True):
    """Every Triton / Gluon launch (``kernel[grid](...)``, microscale's launcher included) is
    recorded instead of run. ``interpreting``: stand the interpreter in (the quant entry points'
    CPU-tensor guard stands down; the quant kernels' interpreter constexprs are fixed at import
    with TRITON_INTERPRET unset, so they keep their GPU values); False for families whose
    kernels take the interpreter as a run-time constexpr (the linear backends)."""
    saved = JITFunction.__getitem__
    JITFunction.__getitem__ = lambda fn, grid: (lambda *a, **kw: _record(fn, a, kw))
    fast, _launch._FAST = _launch._FAST, False  # every launch through kernel[grid]
    try:
        with target.override(interpreting=interpreting):
            yield
    finally:
        JITFunction.__getitem__ = saved
        _launch._FAST = fast


def _try(where, f, *a, **kw):
    _WHERE[0] = where
    try:
        return f(*a, **kw)
    except (ValueError, NotImplementedError, TypeError) as e:  # combinations the API rejects
        return e


# ----------------------------------------------------------------------------------
# launches
# ----------------------------------------------------------------------------------
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
POW2_RULES = ("floor", "ceil", "even", "rceil")
LAYOUTS = ("row_major", "swizzled_128x4", "swizzled_8x4")
CONVENTIONS = (None, "torchao", "compressed-tensors")


def _x(shape, dtype):
    return torch.randn(shape).to(dtype)


def registry_launches(shapes=((256, 1024),)) -> None:
    """Every registry format x input dtype x policy x scale rule x layout, dequantize to
    every dtype, NVFP4 conventions static/dynamic, the fused prologues."""
    for name, fmt in registry.items():
        if kq.unsupported_reason(fmt):
            continue
        two = fmt.global_scale
        for shape in shapes:
            shape = (max(shape[0], fmt.block_rows), shape[1])
            for dt in DTYPES:
                x = _x(shape, dt)
                gss = (None, 0.01) if two else (None,)
                for conv in (CONVENTIONS if two else (None,)):
                    for gs in gss:
                        kw = dict(convention=conv, global_scale=gs)
                        q = _try(f"quantize {name} {dt} {kw}", kq.quantize, x, name, **kw)
                        if dt is torch.bfloat16 and not isinstance(q, Exception):
                            for odt in DTYPES:
                                _try(f"dequantize {name} -> {odt} {kw}", kq.dequantize, q, odt)
                        for nf in ("zero", "error"):
                            _try(f"quantize {name} {dt} nonfinite={nf} {kw}", kq.quantize, x, name, nonfinite=nf, **kw)
                        if dt is not torch.bfloat16:
                            continue
                        _try(f"quantize {name} nearest_away {kw}", kq.quantize, x, name, rounding="nearest_away", **kw)
                        _try(f"quantize {name} overflow=native {kw}", kq.quantize, x, name, overflow="native", **kw)
                        if not fmt.zero_point:
                            for lay in LAYOUTS:
                                _try(f"quantize_for_gemm {name} {lay} {kw}", kq.quantize_for_gemm, x, name,
                                     scale_layout=lay, **kw)
                        if fmt.scale.power_of_two:
                            for rule in POW2_RULES:
                                _try(f"quantize {name} rule={rule}", kq.quantize, x, name, scale_rule=rule)
                                _try(f"quantize {name} rule={rule} nearest_away", kq.quantize, x, name,
                                     scale_rule=rule, rounding="nearest_away")
                        if fmt.block_rows == 1 and (gs is not None or not two):
                            w = torch.rand(shape[1]).to(dt) + 0.5
                            for nf in ("propagate", "zero", "error"):
                                _try(f"rmsnorm_quantize {name} {nf} {kw}", fused.rmsnorm_quantize, x, w, name,
                                     nonfinite=nf, **kw)
                                _try(f"silu_mul_quantize {name} {nf} {kw}", fused.silu_mul_quantize, x, x.flip(0),
                                     name, nonfinite=nf, **kw)
            if fmt.block_rows == 1:  # fused with other input dtypes
                for dt in (torch.float16, torch.float32):
                    x = _x(shape, dt)
                    kw = dict(global_scale=0.01) if two else {}
                    _try(f"rmsnorm_quantize {name} {dt}", fused.rmsnorm_quantize, x, torch.rand(shape[1]).to(dt), name,
                         **kw)
                    _try(f"silu_mul_quantize {name} {dt}", fused.silu_mul_quantize, x, x.flip(0), name, **kw)


def shape_launches() -> None:
    """Small / odd shapes (single row, K not a multiple of the tile, padding): the tiling
    choose_config picks for them, default policies, bf16."""
    for name, fmt in registry.items():
        if kq.unsupported_reason(fmt):
            continue
        for shape in ((1, 4096), (3, 96), (40, 320), (1000, 4160), (7, 4096 + 32)):
            shape = (max(shape[0], fmt.block_rows), shape[1])
            x = _x(shape, torch.bfloat16)
            q = _try(f"quantize {name} {shape}", kq.quantize, x, name, pad=True)
            if not isinstance(q, Exception):
                _try(f"dequantize {name} {shape}", kq.dequantize, q, torch.bfloat16)


def benchmark_launches() -> None:
    """benchmarks/run_gpu_quantize.py: its correctness checks, timings and sweep, on CPU
    tensors (the reference calls answered by the intercepted kernels; big inputs are ones)."""
    spec = importlib.util.spec_from_file_location("run_gpu_quantize", os.path.join(ROOT, "benchmarks",
                                                                                  "run_gpu_quantize.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.DEV = "cpu"
    bench.log = lambda msg: None

    class _Ref:  # the reference answered by the (intercepted) kernels: only launches matter here
        @staticmethod
        def quantize(x, fmt, **kw):
            _WHERE[0] = f"benchmark check {fmt} {kw}"
            return kq.quantize(x, fmt, **kw)

        @staticmethod
        def dequantize(q, dtype=torch.float32):
            return torch.zeros(q.padded_shape, dtype=dtype)[tuple(slice(0, n) for n in q.shape)]

    bench.reference = _Ref
    make_input = bench.make_input

    def make_input_small(shape, seed, dtype=torch.bfloat16, **kw):
        if shape[0] * shape[1] >= 1 << 26:  # timing sizes: values do not matter
            return torch.ones(shape, dtype=dtype)
        return make_input(shape, seed, dtype, **kw)

    bench.make_input = make_input_small
    bench.graph_time = lambda fn, inputs, **kw: (fn(inputs[0]), 1.0)[1]
    saved = (reference_fused.rmsnorm_quantize, reference_fused.silu_mul_quantize)
    reference_fused.rmsnorm_quantize = lambda x, w, fmt, **kw: fused.rmsnorm_quantize(x, w, fmt, **kw)
    reference_fused.silu_mul_quantize = lambda g, u, fmt, **kw: fused.silu_mul_quantize(g, u, fmt, **kw)
    empty_cache = torch.cuda.empty_cache
    torch.cuda.empty_cache = lambda: None
    try:
        bench.check_correctness()
        _WHERE[0] = "benchmark timings"
        bench.run_timings(1.0)
        _WHERE[0] = "benchmark sweep"
        bench.config_sweep(1.0)
    finally:
        reference_fused.rmsnorm_quantize, reference_fused.silu_mul_quantize = saved
        torch.cuda.empty_cache = empty_cache


# ----------------------------------------------------------------------------------
# compile
# ----------------------------------------------------------------------------------
def _label(s) -> str:
    c = s["constexprs"]
    fn = s["fn"]
    cx = {fn.arg_names[p[0]]: v for p, v in c.items()}
    keys = ("TR", "TK", "B", "BR", "BITS", "IS_INT", "RULE", "TWO_LEVEL", "GS_DYNAMIC", "SCALE_KIND", "LAYOUT",
            "ROUNDING", "NONFIN", "PROLOGUE", "PACK32", "HW_FP8", "HAS_ZP", "ITERS")
    sig = {k: v for k, v in s["signature"].items() if v != "constexpr" and k in ("x_ptr", "out_ptr", "scale_ptr")}
    return f"{s['kernel']} w{s['options']['num_warps']} " + " ".join(f"{k}={cx[k]}" for k in keys if k in cx) + \
        f" {sig}"


def source(s):
    """The compiler's source of a recorded specialization (Gluon kernels: Gluon's own)."""
    fn = s["fn"]
    cls = ASTSource
    if type(fn).__name__ == "GluonJITFunction":
        from triton.experimental.gluon._runtime import GluonASTSource as cls
    return cls(fn=fn, signature=s["signature"], constexprs=s["constexprs"], attrs=s["attrs"])


def compile_spec(s):
    """``triton.compile`` of a recorded specialization for sm_90 (the compiled kernel)."""
    return triton.compile(source(s), target=TARGET, options=s["options"])


_POOL_SPECS: list = []  # the specializations a forked pool compiles, by index (kernels do not pickle)


def compile_one(i: int) -> tuple[bool, str, float]:
    s = _POOL_SPECS[i]
    t0 = time.time()
    try:
        compile_spec(s)
        return True, "", time.time() - t0
    except Exception as e:  # noqa: BLE001
        msg = "".join(traceback.format_exception_only(type(e), e)) + (f"\n{e.__cause__!r}" if e.__cause__ else "")
        return False, msg[-3000:], time.time() - t0


# ----------------------------------------------------------------------------------
# SASS on the clean-tile path (--sass)
# ----------------------------------------------------------------------------------
_SASS_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def clean_path_count(text: str, max_skip: int = 16) -> tuple[int, dict]:
    """Instructions one thread executes from entry to EXIT on the clean-tile path: a
    conditional forward branch over at most ``max_skip`` instructions that contain a CALL
    (a ``div.rn`` slow path) is taken; every other conditional branch falls through (the
    fast path is the fall-through of the run-time ``if clean``). Returns (count, opcodes)."""
    ins = []
    for line in text.splitlines():
        m = _SASS_INSTR.search(line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2), m.group(3), m.group(4)))
    idx = {a: i for i, (a, *_) in enumerate(ins)}
    i, n, hist = 0, 0, {}
    while i < len(ins):
        a, pred, op, rest = ins[i]
        n += 1
        hist[op.split(".")[0]] = hist.get(op.split(".")[0], 0) + 1
        if n > 10 ** 6:
            raise RuntimeError("no EXIT reached")
        if op == "EXIT" and not pred:
            break
        if op.startswith("BRA"):
            j = idx[int(re.search(r"0x([0-9a-f]+)", rest).group(1), 16)]
            if not pred or (i < j <= i + max_skip and any(o.startswith("CALL") for _, _, o, _ in ins[i + 1:j])):
                i = j
                continue
            if j < i:
                raise RuntimeError(f"conditional backward branch at {a:#x}")
        if op.startswith("CALL"):
            raise RuntimeError(f"call on the path at {a:#x}")
        i += 1
    return n, dict(sorted(hist.items(), key=lambda kv: -kv[1]))


def sass_report(shape=(16384, 16384), config=(16, 256, 4)) -> None:
    """SASS instructions per element on the clean-tile path, launched as quantize() does
    for a bf16 ``shape`` input with tile ``config`` (docs/decisions/quant-kernels.md)."""
    cases = [("NVFP4 static", "nvfp4", dict(global_scale=0.01)), ("NVFP4 dynamic", "nvfp4", {}),
             ("MXFP4", "mxfp4", {}), ("MXFP8 e4m3", "mxfp8_e4m3", {})]
    x = torch.empty(shape, dtype=torch.bfloat16)
    cfg = kq.QuantizeConfig(*config)
    per_thread = cfg.tile_rows * cfg.tile_cols // (32 * cfg.num_warps)
    for label, name, kw in cases:
        SPECS.clear()
        with intercept():
            kq.quantize(x, name, config=cfg, **kw)
        s = next(v for v in SPECS.values() if v["kernel"] == "_quantize_kernel")
        k = triton.compile(ASTSource(fn=_kqk._quantize_kernel, signature=s["signature"], constexprs=s["constexprs"],
                                     attrs=s["attrs"]), target=TARGET, options=s["options"])
        n, hist = clean_path_count(dump_compiled(k, "-sass"))
        top = ", ".join(f"{o} {c}" for o, c in list(hist.items())[:8])
        print(f"{label:14s} {n:5d} instructions / {per_thread} elements = {n / per_thread:5.1f} per element  ({top})")


def smoke_launches() -> None:
    """A few launches covering each kind of run-time branch (the test suite's check)."""
    x = _x((64, 512), torch.bfloat16)
    for name, kw in (("mxfp6_e2m3", {}), ("int3_fp16", {}), ("mxfp4", dict(nonfinite="error")),
                     ("mxfp8_e4m3", {}), ("nvfp4", {}), ("int4_affine_g32", {})):
        q = _try(f"quantize {name} {kw}", kq.quantize, x, name, **kw)
        _try(f"dequantize {name}", kq.dequantize, q, torch.bfloat16)
    _try("rmsnorm_quantize nvfp4 error", fused.rmsnorm_quantize, x, torch.rand(512).to(x.dtype), "nvfp4",
         global_scale=0.01, nonfinite="error")


def family_modules() -> list[str]:
    """The op families' launch lists: every ``microscale.<package>._compile_cases*`` module."""
    import microscale

    names = []
    for info in pkgutil.walk_packages(microscale.__path__, "microscale."):
        if info.name.rsplit(".", 1)[-1].startswith("_compile_cases"):
            names.append(info.name)
    return sorted(names)


def family_launches(mode: str) -> None:
    """Each family's ``launches(mode)``: its public GPU entry points over the formats, branches
    and configs it ships ("smoke": one launch per kind of run-time branch)."""
    for name in family_modules():
        mod = importlib.import_module(name)
        _WHERE[0] = name
        mod.launches(mode)


def collect(mode: str, families: bool = True) -> list[dict]:
    with intercept():
        if mode == "smoke":
            smoke_launches()
        else:
            registry_launches()
        if mode == "full":
            shape_launches()
            benchmark_launches()
    if families:
        with intercept(interpreting=False):
            family_launches(mode)
    return list(SPECS.values())


def pdl_order() -> int:
    """With programmatic dependent launch on (a Hopper stood in): the quantize kernel waits
    before its first global load and never lets its dependents launch early (its codes may
    be the next ``ms.linear``'s weight, read by the decode GEMV ahead of its own wait); the
    dequantize kernel waits before its first load and triggers. Prints each kernel's facts;
    1 when a rule is broken."""
    saved = params._pdl_ok
    params._pdl_ok = lambda dev: True
    SPECS.clear()
    try:
        with intercept():
            x = torch.randn(256, 1024).to(torch.bfloat16)
            for name in ("nvfp4", "mxfp4", "mxfp8_e4m3"):
                kq.quantize(x, name)
                kq.dequantize(reference.quantize(x, name), torch.bfloat16)
    finally:
        params._pdl_ok = saved
    bad = 0
    for s in SPECS.values():
        if s["kernel"] not in ("_quantize_kernel", "_dequantize_kernel"):
            continue
        ptx = compile_spec(s).asm["ptx"]
        wait, load = ptx.find("griddepcontrol.wait"), ptx.find("ld.global")
        trig = "griddepcontrol.launch_dependents" in ptx
        ok = (s["options"].get("launch_pdl") and 0 <= wait < load
              and trig == (s["kernel"] == "_dequantize_kernel"))
        bad += not ok
        print(f"{s['kernel']:20s} launch_pdl={s['options'].get('launch_pdl')} wait_before_loads={0 <= wait < load} "
              f"triggers={trig} {'ok' if ok else 'BROKEN'}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="registry launches only, one shape")
    ap.add_argument("--smoke", action="store_true", help="a few launches (seconds; the test suite runs this)")
    ap.add_argument("-j", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--filter", default="", help="only specializations whose label contains this")
    ap.add_argument("--list", action="store_true", help="list the specializations, compile nothing")
    ap.add_argument("--sass", action="store_true", help="only: SASS per element on the clean-tile path, "
                    "16384^2 bf16, 16x256 tiles, 4 warps (NVFP4 static/dynamic, MXFP4, MXFP8)")
    ap.add_argument("--pdl-order", action="store_true", help="only: the programmatic-launch rules of the "
                    "quantize / dequantize kernels (wait before any load; only dequantize triggers)")
    a = ap.parse_args()
    if a.pdl_order:
        return pdl_order()
    if a.sass:
        sass_report()
        return 0
    t0 = time.time()
    mode = "smoke" if a.smoke else "quick" if a.quick else "full"
    specs = [s for s in collect(mode) if a.filter in _label(s) + " " + s["where"]]
    print(f"{len(specs)} distinct specializations ({time.time() - t0:.0f}s to collect)", flush=True)
    if a.list:
        for s in specs:
            print(_label(s), "|", s["where"])
        return 0
    import multiprocessing as mp

    fails = 0
    _POOL_SPECS[:] = specs
    with mp.get_context("fork").Pool(a.j) as pool:
        for i, (s, (ok, msg, dt)) in enumerate(zip(specs, pool.imap(compile_one, range(len(specs))))):
            if not ok:
                fails += 1
                print(f"FAIL [{i + 1}/{len(specs)}] {_label(s)}\n  first launched by: {s['where']}\n{msg}", flush=True)
            elif (i + 1) % 25 == 0:
                print(f"  {i + 1}/{len(specs)} compiled ({time.time() - t0:.0f}s)", flush=True)
    print(f"{len(specs) - fails}/{len(specs)} specializations compile for sm_90"
          f" ({fails} failed, {time.time() - t0:.0f}s)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
