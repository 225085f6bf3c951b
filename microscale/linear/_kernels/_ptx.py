"""PTX post-processing for the warp-specialized Gluon kernels (private).

Why: Gluon lowers every ``mbarrier`` wait and the elected ``mbarrier`` arrive of a
multi-warp partition with a CTA-wide named barrier (``bar.sync id, threads``) in front.
In the consumer loops of :mod:`._decode_tma` these barriers make all consumer warps
wait for the slowest one twice per ring chunk (ncu: the largest stall reason;
docs/decisions/linear-decode-tma.md). Neither is needed for the ring's correctness when each warp frees a slot on its
own: a thread's wait covers its own reads, and a slot is empty once every consumer warp
has arrived after its reads (``bar.warp.sync`` orders the lanes of a warp, the arrive
releases them).

A kernel opts in by emitting :data:`MARKER` in its PTX (:func:`marker`, under a
constexpr) and initializing its ``empty`` barriers with the number of consumer warps; its
``mbarrier.arrive`` calls must not take a ``pred`` (the rewrite replaces the election
predicate). :func:`install` adds a Triton compile-stage hook that rewrites such kernels' PTX
(:func:`warp_arrive`); other kernels pass through unchanged. The rewrite is part of the
compiled binary that Triton caches, keyed by the constexpr that emits the marker and by the
marker's text, which carries the rewrite's version (change it with :func:`warp_arrive`).
Triton's cache key does not cover the hook, so a kernel may take the marker only while the
hook is the installed one (:func:`active`): compiled without the rewrite, its ``empty``
barriers would never complete.
"""
from __future__ import annotations

import re

from triton import knobs
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

#: the comment a kernel's PTX carries to have its consumer barriers rewritten (with the rewrite's version:
#: the text is part of the kernels' source, so a new version misses Triton's cache of the old binaries)
MARKER = "ms:warp-arrive:v2"

_BAR = re.compile(r"^\s*bar\.sync\s+\d+,\s*\d+;\s*$")
_ARRIVE = re.compile(r"^\s*@%p\d+\s+mbarrier\.arrive\.shared::cta\.b64\s+_,\s*\[(%r\d+)\];\s*$")
_SKIP = re.compile(r"^\s*($|//|\{|\.reg\b|\.loc\b|waitLoop:)")


def _next_instruction(lines: list[str], i: int) -> int:
    """Index of the first line after ``i`` that is an instruction (not blank, a comment, a
    ``.loc``, an opening brace, a register declaration or the wait loop's label)."""
    j = i + 1
    while j < len(lines) and _SKIP.match(lines[j]):
        j += 1
    return j


def warp_arrive(ptx: str) -> str:
    """``ptx`` with each named barrier in front of an ``mbarrier.try_wait`` removed, and each
    named barrier in front of an elected ``mbarrier.arrive`` replaced by a warp barrier and
    an arrive by lane 0 of every warp. Unchanged unless it carries :data:`MARKER`."""
    if MARKER not in ptx:
        return ptx
    lines = ptx.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _BAR.match(line):
            j = _next_instruction(lines, i)
            nxt = lines[j] if j < len(lines) else ""
            if "mbarrier.try_wait" in nxt:
                i += 1  # drop the barrier; the wait itself is per thread
                continue
            m = _ARRIVE.match(nxt)
            if m:
                out.append("\tbar.warp.sync \t-1;")
                out.extend(lines[i + 1:j])
                out.append("\t{\n\t.reg .pred %ms_lane0;\n\t.reg .b32 %ms_lane;\n\tmov.u32 %ms_lane, %laneid;\n"
                           "\tsetp.eq.u32 %ms_lane0, %ms_lane, 0;\n"
                           f"\t@%ms_lane0 mbarrier.arrive.shared::cta.b64 _, [{m.group(1)}];\n\t}}")
                i = j + 1
                continue
        out.append(line)
        i += 1
    # the empty barriers now count one arrival per warp: an arrive left as it was (the PTX not as expected)
    # would never complete them, so refuse to compile instead of hanging
    arrives = [x for x in out if "mbarrier.arrive" in x and "expect_tx" not in x]
    if not arrives or any("%ms_lane0" not in x for x in arrives):
        raise RuntimeError("microscale: the PTX rewrite for per-warp slot release did not find the expected "
                           "barrier pattern (a different Triton version?); turn microscale.linear.tuning.dt_warp_arrive off")
    return "\n".join(out)


@gluon.jit
def marker(v):
    """``v`` unchanged (an int32 tensor), through an inline asm that puts :data:`MARKER` into the
    kernel's PTX."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1; // ms:warp-arrive:v2", "=r,r", [v], dtype=gl.int32,
                                     is_pure=True, pack=1)


_hook = None


def install() -> None:
    """Add the PTX rewrite to Triton's compile stages (once; a hook installed before still runs)."""
    global _hook
    if _hook is not None:
        return
    prev = knobs.runtime.add_stages_inspection_hook

    def hook(backend, stages, options, language, capability):
        if prev is not None:
            prev(backend, stages, options, language, capability)
        make_ptx = stages.get("ptx")
        if make_ptx is not None:
            stages["ptx"] = lambda src, metadata: warp_arrive(make_ptx(src, metadata))

    knobs.runtime.add_stages_inspection_hook = _hook = hook


def active() -> bool:
    """Whether the rewrite's hook is Triton's compile-stage hook now (not replaced since :func:`install`)."""
    return _hook is not None and knobs.runtime.add_stages_inspection_hook is _hook
