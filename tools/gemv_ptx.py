"""Compile the decode GEMV and its activation prep (or, ``--mma``, the tensor-core decode
kernel; ``--ws``, the warp-specialized Gluon prefill, ``--dtma`` the TMA-fed Gluon decode kernel,
``--fp8`` the fp8 kernel of ``scaled_mm(..., fast_accum=True)`` (Triton or, with ``gluon`` in
``--config``, warp-specialized Gluon), ``--moe MODE`` the MoE prefill path's Gluon kernel (``plain``, ``act``:
the gate/up GEMM's activation epilogue, ``scatter``: the down GEMM's), with ptxas's register / spill report)
for sm_90 without a GPU, as ``ms.linear`` launches them on an H200 for a weight's second call
(config from ``choose_gemv_config`` / ``choose_gemv_mma_config`` unless overridden), and
write their PTX / SASS.

    python tools/gemv_ptx.py OUTDIR [--fmt nvfp4] [--m 1] [--n 28672] [--k 8192]
                             [--config "{'pdl': True}"] [--sass] [--mma | --ws | --dtma | --fp8 | --moe MODE]
                             [--set "{'gemv_early_w': False}"]

Writes ``OUTDIR/<kernel>.ptx`` for each launch (``.sass`` too with ``--sass``) and prints
the loop-body instruction histogram of the main kernel. Used by
``tests/kernels/test_gemv.py`` (the order of loads around the programmatic-launch wait,
the scale loads of ``scale_direct``) and to count instructions before spending device
time. Needs only the triton wheel.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import os
import sys
from dataclasses import replace

os.environ.pop("TRITON_INTERPRET", None)  # before triton / microscale are imported
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tools")]

import torch  # noqa: E402
import triton  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import compile_check as cc  # noqa: E402
import microscale as ms  # noqa: E402
from microscale.linear import tuning  # noqa: E402
from microscale.linear.backends import decode_tma as dt  # noqa: E402
from microscale.linear.backends import gemv as gv  # noqa: E402
from microscale.linear.backends import gemv_mma as gmma  # noqa: E402
from microscale.linear.backends import prefill_ws as pws  # noqa: E402
from microscale.runtime import target  # noqa: E402
from microscale.linear._kernels import _gemv_kernels as kern  # noqa: E402
from microscale.linear._kernels import _gemv_mma as mkern  # noqa: E402
from sass import dump_compiled, loop_counts  # noqa: E402


@contextlib.contextmanager
def _recorded(*patches, **facts):
    """The backends' launches recorded (not run); ``patches``: ``(module, name, value)`` set
    meanwhile; ``facts``: target facts stood in (:func:`microscale.runtime.target.override`)."""
    rec = lambda fn, grid, *a, **kw: cc._record(fn, a, kw)  # noqa: E731
    patches = [(md, "launch", rec) for md in (gv, gmma, pws, dt)] + [(pws, "launch_direct", rec)] + list(patches)
    saved = [(md, name, getattr(md, name)) for md, name, _ in patches]
    for md, name, value in patches:
        setattr(md, name, value)
    try:
        with target.override(**facts):
            yield
    finally:
        for md, name, value in reversed(saved):
            setattr(md, name, value)


def compile_gemv(fmt: str, m: int, n: int, k: int, overrides: dict, mma: bool = False) -> dict:
    """``{kernel name: compiled kernel}`` for one ``gemv`` (``mma``: ``gemv_mma``) call's
    launches (sm_90; the host takes the device for a Hopper one)."""
    q = ms.quantize(torch.randn(64, k), fmt)
    x = torch.zeros(m, k, dtype=torch.bfloat16)
    cc.SPECS.clear()
    with _recorded(pdl=True, num_sms=132):  # a Hopper's
        for _ in range(2):  # the second call: the steady state (the weight's views cached)
            cc.SPECS.clear()
            if mma:
                cfg = replace(gmma.choose_gemv_mma_config(n, k, torch.device("cpu"), m), **overrides)
                gmma.gemv_mma_run(x, q, None, cfg)
            else:
                cfg = replace(gv.choose_gemv_config(n, k, torch.device("cpu"), m, q.fmt.element.bits), **overrides)
                gv.gemv(x, q, None, cfg, use_asm=True)
    mods = (kern, mkern)
    out = {}
    for s in cc.SPECS.values():
        fn = next(getattr(md, s["kernel"]) for md in mods if hasattr(md, s["kernel"]))
        src = ASTSource(fn=fn, signature=s["signature"], constexprs=s["constexprs"], attrs=s["attrs"])
        out[s["kernel"]] = triton.compile(src, target=cc.TARGET, options=s["options"])
    return out


def compile_gluon(fmt: str, m: int, n: int, k: int, overrides: dict, op: str = "prefill_ws",
                  dtype: torch.dtype = torch.bfloat16) -> dict:
    """``{kernel name: compiled kernel}`` for one call's launches of a Gluon route, ``op``
    ``prefill_ws`` or ``decode_tma`` (the K-permutation prep and the
    warp-specialized kernel), sm_90a, for activations of ``dtype``."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from microscale.linear._kernels import _decode_tma as dk
    from microscale.linear._kernels import _prefill_gluon as pg

    rows = n if n * k <= 1 << 24 else 1024 + n % 8  # what specializes: N % 8 (the TMA store), strides
    q = ms.quantize(torch.randn(rows, k), fmt)
    x = torch.zeros(m, k, dtype=dtype)
    cc.SPECS.clear()
    md = pws if op == "prefill_ws" else dt
    with _recorded((md, op + "_reason", lambda q, x: None)):  # the device checks: a Hopper is stood in
        getattr(md, op)(x, q, None, **overrides)
    out = {}
    for s in cc.SPECS.values():
        fn = getattr(pg, s["kernel"], None) or getattr(dk, s["kernel"])
        cls = ASTSource if s["kernel"] == "_xperm_kernel" else GluonASTSource
        src = cls(fn=fn, signature=s["signature"], constexprs=s["constexprs"], attrs=s["attrs"])
        out[s["kernel"]] = triton.compile(src, target=cc.TARGET, options=s["options"])
    return out


def compile_fp8(fa: str, fb: str, m: int, n: int, k: int, overrides: dict) -> dict:
    """``{kernel name: compiled kernel}`` of one fast_accum launch (``fa`` activations x ``fb`` weights) with
    ``choose_fp8_config``'s config and ``overrides`` (Fp8Config fields), sm_90 (a Hopper stood in)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from microscale.linear._compile_cases import _dev
    from microscale.linear.backends import scaled_fp8 as sf
    from microscale.linear.scaled import prepare_operand

    a, b = ms.quantize(torch.randn(m, k), fa), ms.quantize(torch.randn(n, k), fb)
    oa, ob = (replace(o, codes=_dev(o.codes)) for o in (prepare_operand(a), prepare_operand(b)))
    cfg = replace(sf.choose_fp8_config(m, n, min(a.fmt.block_size, b.fmt.block_size), 132), **overrides)
    cc.SPECS.clear()
    with cc.intercept(interpreting=False), target.override(capability=(9, 0), num_sms=132):
        sf.scaled_fp8_launch(oa, ob, None, torch.bfloat16, cfg)
    out = {}
    for s in cc.SPECS.values():
        cls = GluonASTSource if type(s["fn"]).__name__ == "GluonJITFunction" else ASTSource
        src = cls(fn=s["fn"], signature=s["signature"], constexprs=s["constexprs"], attrs=s["attrs"])
        out[s["kernel"]] = triton.compile(src, target=cc.TARGET, options=s["options"])
    return out


def compile_moe(fmt: str, m: int, n: int, k: int, mode: str, overrides: dict) -> dict:
    """``{kernel name: compiled kernel}`` of one MoE prefill-path call (3 experts, ``m`` grouped rows) in ``mode``
    (``plain``, ``act``, ``scatter``) with ``PrefillConfig`` fields ``overrides``, sm_90 (a Hopper stood in)."""
    from microscale.linear._compile_cases import _dev
    from microscale.moe import prepare_experts
    from microscale.moe.prefill import PrefillConfig, prefill_run

    pe = prepare_experts(ms.quantize(torch.randn(3, n, k), fmt))
    x = _dev(torch.zeros(m, k, dtype=torch.bfloat16))
    offs = torch.tensor([0, m // 3, m // 2, m], dtype=torch.int32)
    rows = torch.arange(m, dtype=torch.int32)
    cfg = replace(PrefillConfig(), **overrides)
    cc.SPECS.clear()
    with cc.intercept(interpreting=True), target.override(capability=(9, 0), num_sms=132):
        if mode == "act":
            prefill_run(x, pe, offs, None, rows=rows, config=cfg, act=("swiglu", None, None, "concat"))
        elif mode == "scatter":
            prefill_run(x, pe, offs, None, rows=rows, config=cfg, scatter=torch.rand(m))
        else:
            prefill_run(x, pe, offs, None, config=cfg)
    return {s["kernel"]: cc.compile_spec(s) for s in cc.SPECS.values()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--fmt", default="nvfp4")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--n", type=int, default=28672)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--config", default="{}", help="GemvConfig fields to override, a Python dict literal")
    ap.add_argument("--sass", action="store_true")
    ap.add_argument("--mma", action="store_true", help="the tensor-core decode kernel (gemv_mma) instead")
    ap.add_argument("--ws", action="store_true", help="the warp-specialized Gluon prefill (prefill_ws) instead; "
                    "--config then takes its keyword arguments")
    ap.add_argument("--dtma", action="store_true", help="the TMA-fed Gluon decode kernel (decode_tma) instead; "
                    "--config then takes its keyword arguments")
    ap.add_argument("--fp8", action="store_true", help="the fp8 kernel of scaled_mm(..., fast_accum=True) instead "
                    "(--fmt the weight's format, --act the activations'); --config then takes Fp8Config fields")
    ap.add_argument("--act", default="fp8_e4m3_block128", help="the activations' format (--fp8)")
    ap.add_argument("--moe", choices=("plain", "act", "scatter"), help="the MoE prefill path's Gluon kernel instead, "
                    "with this epilogue; --config then takes PrefillConfig fields")
    ap.add_argument("--fp16", action="store_true", help="float16 activations (--ws / --dtma)")
    ap.add_argument("--set", default="{}", help="fields of microscale.linear.tuning to set first, a Python dict "
                    "literal (e.g. \"{'gemv_early_w': False}\")")
    a = ap.parse_args()
    try:
        tuning.set_tuning(**ast.literal_eval(a.set))
    except TypeError as e:
        raise SystemExit(f"--set: {e}") from None
    os.makedirs(a.outdir, exist_ok=True)
    cfg = ast.literal_eval(a.config)
    gluon_main = "_prefill_ws_kernel" if a.ws else "_decode_tma_kernel" if a.dtma else None
    if a.moe:
        kernels = compile_moe(a.fmt, a.m, a.n, a.k, a.moe, cfg)
        gluon_main = "_moe_prefill_ws_kernel"
    elif a.fp8:
        kernels = compile_fp8(a.act, a.fmt, a.m, a.n, a.k, cfg)
        gluon_main = "_scaled_fp8_ws_kernel" if cfg.get("gluon") else "_scaled_fp8_kernel"
    elif gluon_main:
        kernels = compile_gluon(a.fmt, a.m, a.n, a.k, cfg, "prefill_ws" if a.ws else "decode_tma",
                                torch.float16 if a.fp16 else torch.bfloat16)
    else:
        kernels = compile_gemv(a.fmt, a.m, a.n, a.k, cfg, a.mma)
    if gluon_main:  # ptxas's own verdict: registers, spills, serialized wgmma (C7512)
        import subprocess
        import tempfile

        ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "k.ptx")
            with open(src, "w") as f:
                f.write(kernels[gluon_main].asm["ptx"])
            r = subprocess.run([ptxas, "-arch=sm_90a", "-v", src, "-o", os.path.join(d, "k.cubin")],
                               capture_output=True, text=True)
        print("\n".join(ln for ln in (r.stdout + r.stderr).splitlines() if "ptxas" in ln or "spill" in ln))
        print(f"shared memory: {kernels[gluon_main].metadata.shared} bytes per program")
    for name, c in kernels.items():
        with open(os.path.join(a.outdir, name + ".ptx"), "w") as f:
            f.write(c.asm["ptx"])
        if a.sass or name in ("_gemv_kernel", "_gemv_mma_kernel", "_prefill_ws_kernel", "_decode_tma_kernel",
                              "_scaled_fp8_kernel", "_scaled_fp8_ws_kernel", "_moe_prefill_ws_kernel"):
            text = dump_compiled(c, "-sass")
            if a.sass:
                with open(os.path.join(a.outdir, name + ".sass"), "w") as f:
                    f.write(text)
            if name in ("_gemv_kernel", "_gemv_mma_kernel", "_prefill_ws_kernel", "_scaled_fp8_kernel",
                        "_scaled_fp8_ws_kernel", "_moe_prefill_ws_kernel"):
                print(name, loop_counts(text))


if __name__ == "__main__":
    main()
