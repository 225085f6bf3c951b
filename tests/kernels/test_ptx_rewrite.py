"""The PTX rewrite for per-warp slot release (:mod:`microscale.linear._kernels._ptx`) on hand-written PTX in the
shape Gluon emits: the partition barrier before a ring wait goes, the one before an elected arrive
becomes a warp barrier with an arrive by every warp's lane 0; unmarked PTX passes through unchanged, and
a marked PTX whose arrives do not look as expected refuses to compile (its empty barriers would never
complete). The compiled kernel's PTX and SASS are checked in ``test_decode_tma.py``."""
from __future__ import annotations

import pytest

from microscale.linear._kernels import _ptx

WAIT = """\tbar.sync \t0, 256;
\t// begin inline asm
\t
{
\t.reg .pred complete;
\twaitLoop:
\tmbarrier.try_wait.parity.shared.b64 complete, [%r132], %r133;
\t@!complete bra.uni waitLoop;
}

\t// end inline asm"""
ARRIVE = """\t.loc\t1 150 28
\tbar.sync \t0, 256;
\t// begin inline asm
\t@%p12 mbarrier.arrive.shared::cta.b64 _, [%r294];
\t// end inline asm"""
INIT = """\tbar.sync \t0, 256;
\t@%p12 mbarrier.init.shared::cta.b64 [%r89], 8;"""


def _ptx_text(*parts: str, marked: bool = True) -> str:
    head = "\tmov.b32 %r93, %r94; // " + _ptx.MARKER if marked else "\tmov.b32 %r93, %r94;"
    return "\n".join([".visible .entry k()", "{", head, *parts, "\tret;", "}"])


def test_rewrite():
    src = _ptx_text(INIT, WAIT, "\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%r1}, {%r2}, {%r3}, {%r1};",
                    ARRIVE)
    out = _ptx.warp_arrive(src)
    assert out.count("bar.sync") == 1 and "bar.sync \t0, 256;\n\t@%p12 mbarrier.init" in out  # the init's stays
    assert "mbarrier.try_wait.parity.shared.b64 complete, [%r132], %r133;" in out
    assert "@%p12 mbarrier.arrive" not in out
    assert "bar.warp.sync \t-1;" in out and "mov.u32 %ms_lane, %laneid;" in out
    assert "@%ms_lane0 mbarrier.arrive.shared::cta.b64 _, [%r294];" in out
    assert out.index("bar.warp.sync") < out.index("%ms_lane0 mbarrier.arrive")


def test_unmarked_ptx_is_unchanged():
    src = _ptx_text(INIT, WAIT, ARRIVE, marked=False)
    assert _ptx.warp_arrive(src) == src


def test_unexpected_barriers_refuse_to_compile():
    lone_arrive = "\t@%p12 mbarrier.arrive.shared::cta.b64 _, [%r294];"  # no partition barrier in front
    with pytest.raises(RuntimeError, match="per-warp slot release"):
        _ptx.warp_arrive(_ptx_text(WAIT, "\tadd.s32 %r1, %r1, 1;", lone_arrive))
    with pytest.raises(RuntimeError, match="per-warp slot release"):  # an arrive of another form
        _ptx.warp_arrive(_ptx_text(WAIT, ARRIVE.replace("arrive.shared", "arrive.release.cta.shared")))
    with pytest.raises(RuntimeError, match="per-warp slot release"):  # no arrive at all
        _ptx.warp_arrive(_ptx_text(WAIT))


def test_active_only_while_the_hook_is_installed(monkeypatch):
    """Kernels take the marker only while the rewrite's hook is Triton's (a kernel compiled with the
    marker but without the rewrite would hang): replaced, the rewrite is reported inactive."""
    from triton import knobs

    _ptx.install()  # (what decode_tma's first launch does)
    assert _ptx.active()
    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", lambda *a: None)
    assert not _ptx.active()


def test_hook_not_installed_at_import():
    """Importing microscale, the linear op and the decode kernel's module leaves Triton's compile hooks
    alone (the rewrite is installed by decode_tma's first launch; a fresh process, since other tests
    in this one launch it)."""
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    code = ("import microscale, microscale.linear, microscale.linear._kernels._decode_tma\n"
            "from triton import knobs\n"
            "from microscale.linear._kernels import _ptx\n"
            "assert knobs.runtime.add_stages_inspection_hook is None and not _ptx.active()\n"
            "_ptx.install()\n"
            "assert _ptx.active()\n")
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_rewrite_version_follows_the_rewrite():
    """Triton caches rewritten binaries under the kernel source, which holds :data:`_ptx.MARKER` but not
    :func:`_ptx.warp_arrive`: a change to the rewrite must come with a new marker version (so old binaries
    miss the cache). Recorded here: the rewrite's source hash for each version; update both together."""
    import hashlib
    import inspect

    versions = {"ms:warp-arrive:v1": "15ee3240bde601c8", "ms:warp-arrive:v2": "f45c53f4ad379d54"}
    digest = hashlib.sha256(inspect.getsource(_ptx.warp_arrive).encode()).hexdigest()[:16]
    assert versions.get(_ptx.MARKER) == digest, (
        f"warp_arrive changed (source hash {digest}): bump _ptx.MARKER and the marker text in _ptx.marker, "
        "and record the new pair here")
    assert _ptx.MARKER in inspect.getsource(_ptx.marker.fn)
