"""The ``microscale`` command line."""
from __future__ import annotations

import argparse
import sys

from .formats import registry

__all__ = ["main", "format_table", "build_parser"]


def format_table(markdown: bool = False) -> str:
    """The registry as a table (name, element, block, scale, rule, bits per element with
    scales, description): aligned text, or Markdown (docs/formats.md is generated from it)."""
    rows = [("name", "element", "block", "scale", "rule", "bits/elem", "description")]
    for f in registry.values():
        block = f"{f.block_rows}x{f.block_size}" if f.block_rows > 1 else str(f.block_size)
        scale = f.scale.name + ("+fp32 tensor" if f.global_scale else "") + ("+zero" if f.zero_point else "")
        rows.append((f.name, f.element.name, block, scale, f.scale_rule.value, f"{f.bits_per_element:.3f}",
                     f.description))
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        lines += ["| " + " | ".join(f"`{r[0]}`" if i == 0 else c for i, c in enumerate(r)) + " |" for r in rows[1:]]
        return "\n".join(lines) + "\n"
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows) + "\n"


def _formats(args: argparse.Namespace) -> int:
    """Print the registry: element, block, scale, rule and bits per element (scales included)."""
    print(format_table(markdown=args.markdown), end="")
    return 0


_DT = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "fp32": "float32",
       "float32": "float32"}


def _fail(msg: str) -> int:
    print(f"microscale: error: {msg}", file=sys.stderr)
    return 2


def _quantize(args: argparse.Namespace) -> int:
    """Quantize a float checkpoint (directory, .safetensors file) to DST in a convention."""
    from . import io as msio

    kw = {}
    if args.scale_rule:
        kw["scale_rule"] = args.scale_rule
    if args.block_size:
        kw["block_size"] = args.block_size
    s = msio.convert(args.src, args.dst, fmt=args.format, convention=args.convention, skip=args.skip,
                     default_skip=not args.no_default_skip, progress=not args.quiet, quantize_kwargs=kw)
    print(f"{len(s['quantized'])} tensors quantized to {args.format} ({args.convention}), {len(s['skipped'])} skipped, "
          f"{len(s['copied'])} copied; {s['bytes_in'] / 1e6:.1f} MB -> {s['bytes_out'] / 1e6:.1f} MB in {args.dst}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    """Re-spell a quantized checkpoint in another convention, exactly (no re-quantization)."""
    from . import io as msio

    s = msio.convert(args.src, args.dst, convention=args.convention, progress=not args.quiet)
    print(f"{len(s['quantized'])} quantized tensors re-written as {args.convention}, {len(s['copied'])} copied "
          f"-> {args.dst}")
    return 0


def _dequantize(args: argparse.Namespace) -> int:
    """Decode every quantized tensor of SRC into a plain float safetensors checkpoint DST."""
    import torch

    from . import io as msio

    dt = None if args.dtype is None else getattr(torch, _DT[args.dtype])
    s = msio.convert(args.src, args.dst, dequantize=True, dtype=dt, progress=not args.quiet)
    print(f"{len(s['dequantized'])} tensors dequantized, {len(s['copied'])} copied -> {args.dst}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    """Detect the convention and list every logical tensor: format or dtype, shape, bytes."""
    from . import io as msio

    conv, rows = msio.inspect(args.path)
    print(f"{args.path}: convention {conv}, {len(rows)} tensors, {sum(r[3] for r in rows) / 1e6:.2f} MB")
    table = [("name", "format", "shape", "bytes")] + [(n, f, "x".join(map(str, sh)) or "scalar", str(b))
                                                       for n, f, sh, b in rows]
    w = [max(len(r[i]) for r in table) for i in range(4)]
    for r in table:
        print(f"{r[0].ljust(w[0])}  {r[1].ljust(w[1])}  {r[2].ljust(w[2])}  {r[3].rjust(w[3])}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    """Quantize all-MiniLM-L6-v2 to each main format; print accuracy and size."""
    from . import demo

    try:
        import torch

        dt = None if args.dtype is None else getattr(torch, _DT[args.dtype])
        demo.run(device=args.device, batch_size=args.batch_size, dtype=dt)
    except ImportError as e:
        print(str(e), file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (one sub-command per job)."""
    p = argparse.ArgumentParser(prog="microscale", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("formats", help="list the format registry with bits per element")
    f.add_argument("--markdown", action="store_true", help="as a Markdown table (docs/formats.md)")
    f.set_defaults(func=_formats)

    from .io.conventions import CONVENTIONS

    convs = list(CONVENTIONS)
    q = sub.add_parser("quantize", help="quantize a float checkpoint directory/file tensor by tensor",
                       description="Quantize SRC (a directory of sharded safetensors + index, or one .safetensors "
                       "file) into DST (a directory; a .gguf file for --convention gguf). Streams one tensor at a "
                       "time, writes to a temporary directory renamed at the end, never modifies SRC.")
    q.add_argument("src")
    q.add_argument("dst")
    q.add_argument("--format", "-f", required=True, choices=list(registry), metavar="FORMAT",
                   help="a preset from `microscale formats`")
    q.add_argument("--convention", "-c", default="native", choices=convs)
    q.add_argument("--skip", action="append", default=[], metavar="PATTERN",
                   help="fnmatch pattern (or substring) of tensor names to keep as they are; repeatable")
    q.add_argument("--no-default-skip", action="store_true",
                   help="also quantize embeddings, norms and lm_head (skipped by default)")
    q.add_argument("--scale-rule", choices=["floor", "ceil", "even", "rceil"], default=None)
    q.add_argument("--block-size", type=int, default=None)
    q.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    q.set_defaults(func=_quantize)

    c = sub.add_parser("convert", help="re-write a quantized checkpoint in another convention (exact)")
    c.add_argument("src")
    c.add_argument("dst")
    c.add_argument("--convention", "-c", required=True, choices=convs)
    c.add_argument("--quiet", "-q", action="store_true")
    c.set_defaults(func=_convert)

    d = sub.add_parser("dequantize", help="decode a quantized checkpoint into plain float safetensors")
    d.add_argument("src")
    d.add_argument("dst")
    d.add_argument("--dtype", choices=sorted(_DT), default=None, help="default: each tensor's original dtype "
                   "(bf16 when the checkpoint does not record it)")
    d.add_argument("--quiet", "-q", action="store_true")
    d.set_defaults(func=_dequantize)

    i = sub.add_parser("inspect", help="detect a checkpoint's convention; list per-tensor format, shape, bytes")
    i.add_argument("path")
    i.set_defaults(func=_inspect)

    m = sub.add_parser("demo", help="quantize all-MiniLM-L6-v2 to each main format and report accuracy/size")
    m.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    m.add_argument("--batch-size", type=int, default=32)
    m.add_argument("--dtype", choices=sorted(_DT), default=None,
                   help="compute dtype of the models (default fp32 on CPU, fp16 on CUDA)")
    m.set_defaults(func=_demo)

    b = sub.add_parser("bench", help="benchmark every op against the machine's ceilings and peers "
                       "(arguments as `python -m microscale.bench --help`)", add_help=False)
    b.add_argument("bench_args", nargs=argparse.REMAINDER)
    b.set_defaults(func=_bench)
    return p


def _bench(args: argparse.Namespace) -> int:
    """Delegate to the benchmark harness's own command line."""
    from .bench import main as bench_main

    return int(bench_main(args.bench_args) or 0)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``microscale`` command."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the harness parses its own options (argparse REMAINDER drops leading ones)
        return _bench(argparse.Namespace(bench_args=argv[1:]))
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, KeyError, FileNotFoundError, TypeError) as e:
        return _fail(str(e) if not isinstance(e, KeyError) else str(e.args[0]))


if __name__ == "__main__":
    sys.exit(main())
