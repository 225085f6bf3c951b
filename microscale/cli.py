"""The ``microscale`` command line."""
from __future__ import annotations

import argparse
import sys

from .formats import registry

__all__ = ["main"]


def _formats(args: argparse.Namespace) -> int:
    """Print the registry: element, block, scale, rule and bits per element (scales included)."""
    rows = [("name", "element", "block", "scale", "rule", "bits/elem", "description")]
    for f in registry.values():
        block = f"{f.block_rows}x{f.block_size}" if f.block_rows > 1 else str(f.block_size)
        scale = f.scale.name + ("+fp32 tensor" if f.global_scale else "") + ("+zero" if f.zero_point else "")
        rows.append((f.name, f.element.name, block, scale, f.scale_rule.value, f"{f.bits_per_element:.3f}",
                     f.description))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (one sub-command per job)."""
    p = argparse.ArgumentParser(prog="microscale", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("formats", help="list the format registry with bits per element")
    f.set_defaults(func=_formats)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``microscale`` command."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
