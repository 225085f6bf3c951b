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
