import os

import torch

# Without a GPU the Triton kernels run in the interpreter; this must be set before any
# kernel module is imported (triton.jit reads it at decoration time).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI runs the property tests on a fixed example sequence (reproducible landings);
# locally they draw fresh examples every run.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def gen() -> torch.Generator:
    """A fresh, seeded generator per test (MICROSCALE_TEST_SEED varies the draw)."""
    g = torch.Generator()
    g.manual_seed(int(os.environ.get("MICROSCALE_TEST_SEED", "1234")))
    return g


@pytest.fixture
def run_tool():
    """Runs ``tools/<script>`` in a subprocess without ``TRITON_INTERPRET`` (and without the
    ``MICROSCALE_GEMV_*`` switches, plus ``env`` on top), for the checks that compile
    kernels for sm_90 on CPU with the triton wheel's ptxas (skipped where it has none).
    Returns the CompletedProcess."""
    import pathlib
    import subprocess
    import sys

    import triton

    if not (pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("the triton wheel has no bundled ptxas")
    root = pathlib.Path(__file__).resolve().parents[1]

    def run(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        e = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET" and not k.startswith("MICROSCALE_GEMV_")}
        e.update(env or {})
        return subprocess.run([sys.executable, str(root / "tools" / script), *args], cwd=root, env=e,
                              capture_output=True, text=True, timeout=600)

    return run
