"""microscale.bench: the benchmark harness.

One methodology (:mod:`._timing`): CUDA-event medians after warm-up, inputs rotated past
3x L2, CUDA graphs for short launches, fresh random data, every output checked against
the reference before it is timed. Ceilings (copy bandwidth, cuBLAS bf16, fp8
``_scaled_mm``) are measured in the same run; each op reports its bytes and flops model
(:mod:`.models`), achieved GB/s and TFLOP/s, % of the ceiling, and ratios to its peers.
Suites and case selection live in :mod:`.suites`, the case builders in :mod:`.cases`, the
output checks in :mod:`.checks`, the runner and the ceilings in :mod:`.runner`; JSON, CSV,
the roofline plot and ``benchmarks/RESULTS.md`` in :mod:`.report`.

Run ``python -m microscale.bench --help``; the project CLI calls :func:`main`.
"""
from typing import Optional, Sequence

from . import models
from .models import Ceilings
from .report import collect_env, regenerate, render_markdown, write_outputs
from .cases import BUILDERS, Case, Context, Peer, Skip
from .checks import Check
from .runner import CaseResult, RunOptions, measure_ceilings, run_benchmark, run_cases
from .suites import OPS, SUITES, CaseSpec, select_cases

__all__ = [
    "main", "models", "Ceilings", "collect_env", "regenerate", "render_markdown", "write_outputs",
    "BUILDERS", "OPS", "SUITES", "Case", "CaseResult", "CaseSpec", "Check", "Context", "Peer", "RunOptions",
    "Skip", "measure_ceilings", "run_benchmark", "run_cases", "select_cases",
]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line (``python -m microscale.bench``) with ``argv``; returns the
    exit status. See :mod:`microscale.bench.__main__` for the options."""
    from .__main__ import main as _main  # imported here so `python -m` does not import it twice

    return _main(argv)
