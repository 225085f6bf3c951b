"""Compile a Triton kernel for sm_90 without a GPU and look at its SASS.

    from tools.sass import sass, loop_counts
    text = sass(kernel, {"x_ptr": "*fp16", "n": "i32"}, {"BLOCK": 256}, num_warps=4)
    print(loop_counts(text))   # instruction count of each backward-branch loop body

Used to predict ALU cost per element before spending device time (the counts quoted in
docs/decisions/). Needs only the triton wheel (its bundled ptxas / cuobjdump).
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def _cubin(fn, signature: dict, constexprs: dict, num_warps: int, num_stages: int, arch: int,
           divisible: tuple[str, ...] | None) -> str:
    """Path of a temporary .cubin of ``fn`` compiled for ``sm_<arch>`` (caller deletes it)."""
    sig = dict(signature)
    for k in constexprs:
        sig[k] = "constexpr"
    if divisible is None:
        divisible = tuple(k for k, v in signature.items() if v.startswith("*") or k.startswith("stride"))
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in divisible}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": num_warps, "num_stages": num_stages})
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    return f.name


def _cuobjdump(path: str, *flags: str) -> str:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    try:
        return subprocess.run([tool, *flags, path], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)


def dump_compiled(compiled, *flags: str) -> str:
    """``cuobjdump <flags>`` (e.g. ``-sass``, ``-res-usage``) of a kernel returned by
    ``triton.compile``."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    return _cuobjdump(f.name, *flags)


def sass(fn, signature: dict, constexprs: dict, num_warps: int = 4, num_stages: int = 3,
         arch: int = 90, divisible: tuple[str, ...] | None = None) -> str:
    """SASS text of ``fn`` (a ``@triton.jit`` function) specialised to the given types.
    ``divisible``: arguments known to be multiples of 16, as Triton's launcher specialises
    them at run time (default: every pointer and every argument named ``stride*``)."""
    return _cuobjdump(_cubin(fn, signature, constexprs, num_warps, num_stages, arch, divisible), "-sass")


def registers(fn, signature: dict, constexprs: dict, num_warps: int = 4, num_stages: int = 3,
              arch: int = 90, divisible: tuple[str, ...] | None = None) -> int:
    """Registers per thread of ``fn`` compiled as :func:`sass` would."""
    out = _cuobjdump(_cubin(fn, signature, constexprs, num_warps, num_stages, arch, divisible), "-res-usage")
    m = re.search(r"REG:(\d+)", out)
    return int(m.group(1)) if m else -1


_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(address, opcode, line) of every instruction."""
    out = []
    for line in text.splitlines():
        m = _INSTR.search(line)
        if m:
            out.append((int(m.group(1), 16), m.group(3), line.strip()))
    return out


def loop_counts(text: str) -> list[dict]:
    """Each backward branch (a loop): its body's instruction count and opcode histogram."""
    ins = instructions(text)
    addr = {a: i for i, (a, _, _) in enumerate(ins)}
    loops = []
    for i, (a, op, line) in enumerate(ins):
        if op.startswith("BRA"):
            t = re.search(r"0x([0-9a-f]+)", line.split("BRA", 1)[1])
            if t:
                tgt = int(t.group(1), 16)
                if tgt < a and tgt in addr:
                    body = ins[addr[tgt]:i + 1]
                    hist: dict[str, int] = {}
                    for _, o, _ in body:
                        base = o.split(".")[0]
                        hist[base] = hist.get(base, 0) + 1
                    loops.append({"start": tgt, "end": a, "count": len(body),
                                  "hist": dict(sorted(hist.items(), key=lambda kv: -kv[1]))})
    return loops

