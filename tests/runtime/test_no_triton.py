"""``import microscale`` and the whole CPU path work without Triton: a subprocess whose
import system refuses every ``triton*`` module quantizes, dequantizes and runs
``ms.linear`` (the reference path) on CPU tensors."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import sys

    class NoTriton:
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ImportError(f"{name} is blocked by the test")
            return None

    sys.meta_path.insert(0, NoTriton())
    import torch
    import microscale as ms
    from microscale import reference
    from microscale.runtime import target

    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 128, generator=g)
    x = torch.randn(2, 3, 128, generator=g).to(torch.bfloat16)
    for name in ("nvfp4", "mxfp8_e4m3", "int4_affine_g32"):
        q = ms.quantize(w, name)
        d = ms.dequantize(q, torch.float32)
        assert torch.equal(d, reference.dequantize(reference.quantize(w, name), torch.float32)), name
        y = ms.linear(x, q)
        ref = (x.double() @ d.double().T).to(torch.bfloat16)
        assert y.shape == (2, 3, 64) and torch.equal(y, ref), name
    assert not target.has_triton()
    try:
        target.require_triton("the test")
    except ImportError as e:
        assert "not installed" in str(e), e
    else:
        raise AssertionError("require_triton passed without Triton")
    loaded = sorted(m for m in sys.modules if m == "triton" or m.startswith("triton."))
    assert not loaded, loaded
    print("ok")
""")


def test_cpu_path_without_triton():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
