"""Command line: ``python -m microscale.bench`` (and, later, ``microscale bench``).

Run a suite::

    python -m microscale.bench [--suite default|quantize|linear|matrix|all] [--ops quantize,linear]
                               [--formats nvfp4,'mx*'] [--shapes 8192x8192,1x28672x8192]
                               [--out DIR] [--cpu] [--dtype bf16|fp16] [--list]

writes ``DIR/results.json`` (rewritten after every case, so a killed run leaves its partial
results, marked ``"complete": false``), ``DIR/results.csv`` and ``DIR/roofline.png`` (if
matplotlib imports). Regenerate ``benchmarks/RESULTS.md`` from a saved run::

    python -m microscale.bench report DIR/results.json [--md PATH]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from . import report, runner, suites

__all__ = ["main", "build_parser", "build_report_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of a benchmark run."""
    p = argparse.ArgumentParser(
        prog="python -m microscale.bench",
        description="Time microscale's ops against the ceilings and peers measured in the same run. "
                    "Subcommand 'report RESULTS.json' regenerates benchmarks/RESULTS.md.")
    p.add_argument("--suite", default="default", choices=sorted(suites.SUITES),
                   help="which suite (default: %(default)s)")
    p.add_argument("--ops", action="append", metavar="OP[,OP]",
                   help=f"only these ops ({', '.join(suites.OPS)}); repeatable or comma-separated")
    p.add_argument("--formats", action="append", metavar="FMT[,FMT]",
                   help="these formats instead of the suite's: names or glob patterns ('mx*')")
    p.add_argument("--shapes", action="append", metavar="SHAPE[,SHAPE]",
                   help="shapes instead of the suite's: RxC for quantize/dequantize, MxNxK for linear")
    p.add_argument("--out", default="bench-results", metavar="DIR", help="output folder (default: %(default)s)")
    p.add_argument("--cpu", action="store_true", help="time the reference path on the CPU (perf_counter)")
    p.add_argument("--dtype", choices=sorted(suites.DTYPES), default="bf16",
                   help="activations of the linear cases, and their cuBLAS peer (default: %(default)s)")
    p.add_argument("--list", action="store_true", help="print the selected cases and exit")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh, recorded in the JSON)")
    p.add_argument("--target-ms", type=float, default=None,
                   help="time the timed repetitions of one op fill (default: 300 on CUDA, 1000 on the CPU)")
    p.add_argument("--graph", choices=("auto", "always", "never"), default=None,
                   help="CUDA graphs: auto = for calls under 10 us or host-bound launches (default; "
                        "'always' for the matrix suite)")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="report the cases left after S seconds as skipped (default: the suite's, 450 for "
                        "'default', none for the others; 0: no budget)")
    p.add_argument("--md", default=None, metavar="PATH",
                   help="also regenerate this RESULTS.md from the run (default: don't)")
    return p


def build_report_parser() -> argparse.ArgumentParser:
    """The parser of ``report``."""
    p = argparse.ArgumentParser(prog="python -m microscale.bench report",
                                description="Regenerate RESULTS.md (atomically) from a results JSON.")
    p.add_argument("json", help="results.json written by a run")
    p.add_argument("--md", default=None, metavar="PATH",
                   help=f"output (default: {report.default_results_md()})")
    p.add_argument("--csv", default=None, metavar="PATH", help="also rewrite the CSV here")
    p.add_argument("--png", default=None, metavar="PATH", help="also redraw the roofline plot here")
    return p


def _report(argv: Sequence[str]) -> int:
    a = build_report_parser().parse_args(list(argv))
    md = report.regenerate(a.json, a.md)
    print(f"wrote {md}", file=sys.stderr)
    if a.csv or a.png:
        doc = report.load_json(a.json)
        if a.csv:
            print(f"wrote {report.write_csv(doc, a.csv)}", file=sys.stderr)
        if a.png:
            ok = report.plot_roofline(doc, a.png)
            print(f"wrote {a.png}" if ok else "roofline plot skipped (matplotlib missing or nothing ran)",
                  file=sys.stderr)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point; returns the process exit status (0: ran, even with skipped cases;
    1: some case failed its check or raised; 2: bad arguments)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":
        return _report(argv[1:])
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        specs = suites.select_cases(a.suite, ops=a.ops, formats=a.formats, shapes=a.shapes, cpu=a.cpu)
    except ValueError as exc:
        parser.error(str(exc))
    if a.list:
        for s in specs:
            print(s.id)
        return 0
    budget = suites.SUITES[a.suite].budget_s if a.time_budget is None else (a.time_budget or None)
    opts = runner.RunOptions(graph=suites.suite_graph(a.suite, a.graph), time_budget_s=budget)
    if a.target_ms is not None:
        opts.target_ms, opts.cpu_target_s = a.target_ms, a.target_ms / 1e3
    partial = Path(a.out) / "results.json"
    try:
        doc = runner.run_benchmark(a.suite, ops=a.ops, formats=a.formats, shapes=a.shapes, cpu=a.cpu,
                                   seed=a.seed, opts=opts, checkpoint=lambda d: report.write_json(d, partial),
                                   dtype=a.dtype)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    paths = report.write_outputs(doc, a.out)
    for kind, path in paths.items():
        print(f"wrote {path}" if path else f"{kind}: skipped (matplotlib not importable or nothing ran)",
              file=sys.stderr)
    if a.md:
        print(f"wrote {report.regenerate(paths['json'], a.md)}", file=sys.stderr)
    counts: dict[str, int] = {}
    for r in doc["results"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print("cases: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), file=sys.stderr)
    return 1 if counts.get("failed") or counts.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
