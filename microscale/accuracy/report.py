"""Rank formats by quantization error against storage bits, per tensor and over a model
(``microscale error``).

For every (format, method) pair, each selected float tensor is quantized as
``microscale quantize`` would quantize it (``ms.quantize(t, fmt, method=..., pad=True)``) and
compared with its source (:class:`~microscale.accuracy.metrics.ErrorStats`, float64 sums).
Bits per element are the storage the QTensor takes: codes, block scales, zero points,
global scale and padding, over the tensor's elements. Model totals add the stats of every
tensor (each element weighs the same) and the bytes of every QTensor.

The tensors: floating, at least 2-D, at least one block per row for every format asked
for, and not matched by the skip patterns (by default the checkpoint converter's: embeddings,
norms, biases, the output head), so every row of the ranking covers the same tensors.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable

import torch

from ..formats import Format, get_format, registry
from ..qtensor import QTensor
from .metrics import ErrorStats, error_stats
from .methods import METHODS, _check

__all__ = ["DEFAULT_FORMATS", "error_report", "format_report", "write_json", "write_plot", "method_reason",
           "parse_formats", "mark_front", "format_table", "format_markdown", "write_points_plot", "spearman",
           "embedding_agreement"]

#: The formats ranked when none are named: the main formats of the demo and of checkpoints.
DEFAULT_FORMATS = ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "mxint8", "int4_affine_g128", "int8_fp16")

_CHUNK = 1 << 22  # elements of float64 temporaries at a time when summing the stats
_BAR_DELAY = 1.0  # seconds before the progress bar shows: short runs print none


def method_reason(fmt: Format, method: str) -> str | None:
    """Why ``method`` (one of :data:`METHODS`, or ``"gptq"``) does not apply to ``fmt``
    (None when it does)."""
    if method not in METHODS + ("gptq",):
        return f"method {method!r} is not known; expected one of {', '.join(METHODS + ('gptq',))}"
    if method == "rtn":
        return None
    try:
        _check(fmt, method)
    except ValueError as e:
        return str(e).removeprefix("quantize: ")
    return None


def _stats(x: torch.Tensor, q: QTensor) -> ErrorStats:
    """:func:`error_stats` of ``x`` against ``q``, summed over row chunks (bounded float64 memory)."""
    y = q.dequantize(torch.float32)
    k = x.shape[-1] if x.dim() else 1
    xs, ys = x.reshape(-1, k), y.reshape(-1, k)
    step = max(1, _CHUNK // max(k, 1))
    return sum((error_stats(xs[i:i + step], ys[i:i + step]) for i in range(0, xs.shape[0], step)), ErrorStats())


def _source(src) -> tuple[str, list[tuple[str, tuple, torch.dtype]], Callable[[str], torch.Tensor]]:
    """``(label, [(name, shape, dtype)], get(name))`` for a checkpoint path, a dict of
    tensors or an ``nn.Module`` (the weights of its ``nn.Linear`` layers)."""
    from torch import nn

    if isinstance(src, (str, os.PathLike)):
        from .._paths import open_regular
        from ..io.checkpoint import open_checkpoint

        path = os.fspath(src)
        magic = b""
        if os.path.isfile(path):
            with open_regular(path) as fh:
                magic = fh.read(4)
        if magic == b"GGUF":
            raise ValueError(f"error_report: {path} is a GGUF file (quantized); give the float safetensors checkpoint "
                             "it was made from")
        ck = open_checkpoint(path)
        if ck.convention != "float":
            raise ValueError(f"error_report: {path} is a quantized checkpoint (convention {ck.convention}); the "
                             "error of a format is measured against the float source: give the float checkpoint")
        rows = [(n, tuple(ck.info(n).shape), ck.info(n).dtype) for n in ck.names]
        return path, rows, ck.get
    if isinstance(src, nn.Module):
        src = {(n + "." if n else "") + "weight": m.weight.detach() for n, m in src.named_modules()
               if type(m) is nn.Linear}
    if isinstance(src, dict):
        bad = [k for k, v in src.items() if not isinstance(v, torch.Tensor)]
        if bad:
            raise TypeError(f"error_report: tensors {bad[:3]} are not torch.Tensors (QTensors are already quantized)")
        rows = [(n, tuple(t.shape), t.dtype) for n, t in src.items()]
        return "(tensors)", rows, src.__getitem__
    raise TypeError(f"error_report: src must be a checkpoint path, a dict of tensors or an nn.Module, got "
                    f"{type(src).__name__}")


def _select(rows, fmts: list[Format], patterns) -> tuple[list, list]:
    """The tensors every format quantizes, and ``(name, reason)`` for the others."""
    from ..io.checkpoint import should_quantize
    from .._names import skip_matches

    keep, left = [], []
    for name, shape, dtype in rows:
        p = skip_matches(name, patterns)
        if p is not None:
            left.append((name, f"matched skip pattern {p!r}"))
            continue
        no = [f.name for f in fmts if not should_quantize(name, shape, dtype, f, ())]
        if not no:
            keep.append((name, shape, dtype))
        elif len(no) == len(fmts) or not dtype.is_floating_point or len(shape) < 2:
            left.append((name, "not a float matrix with a whole block per row"))
        else:
            left.append((name, f"too small for {', '.join(no)} (every format ranks the same tensors)"))
    return keep, left


def _ranked(rows: list[dict]) -> list[dict]:
    """Rows by SQNR (highest first; bits break ties), each marked ``pareto``: no other row
    has as few bits or fewer and as high an SQNR or higher, one of them strictly. Bits are
    compared to 0.001 (as printed), so a global scale's 32 bits per tensor do not count."""
    mark_front(rows, "sqnr_db")
    return sorted(rows, key=lambda r: (-r["sqnr_db"], r["bits_per_element"], r["format"], r["method"]))


def _row(stats: ErrorStats, nbytes: int) -> dict:
    d = stats.as_dict()
    return {"bits_per_element": 8.0 * nbytes / max(stats.count, 1), "sqnr_db": d["sqnr_db"], "rel_fro": d["rel_fro"],
            "cosine": d["cosine"], "max_abs": d["max_abs"], "elements": stats.count, "bytes": nbytes}


def error_report(src, formats: Iterable[str | Format] | None = None, methods: Iterable[str] = ("rtn",), *,
                 skip: Iterable[str] = (), default_skip: bool = True, progress: bool = False) -> dict:
    """Quantize every selected tensor of ``src`` to each format with each method and measure
    the error (see the module doc).

    Args:
        src: a checkpoint (a ``.safetensors`` file or a directory of them; only read), a dict
            ``name -> float tensor``, or an ``nn.Module`` (its ``nn.Linear`` weights).
        formats: presets or Formats (default :data:`DEFAULT_FORMATS`).
        methods: of ``ms.quantize`` (``rtn``, ``mse``, ``4over6``); a pair whose method does
            not apply to the format is listed under ``not_applicable``.
        skip, default_skip: skip patterns, in the dialect of ``microscale quantize --skip``;
            ``default_skip`` adds the converter's defaults (embeddings, norms, biases, lm_head).
        progress: a tqdm bar on stderr (shown once a run passes one second).

    Returns:
        ``{"source", "formats", "methods", "tensors", "skipped", "not_applicable", "results",
        "per_tensor"}``: ``results`` holds one model-total row per (format, method), ranked
        by SQNR, each with ``format``, ``method``, ``bits_per_element``, ``sqnr_db``,
        ``rel_fro``, ``cosine``, ``max_abs``, ``elements``, ``bytes``, ``pareto``;
        ``per_tensor`` the same per tensor with ``name``. An exact reconstruction has
        ``sqnr_db`` ``inf`` (``null`` in JSON).
    """
    from ..io.checkpoint import DEFAULT_SKIP
    from ..ops import quantize

    fmts = [get_format(f) for f in (DEFAULT_FORMATS if formats is None else formats)]
    methods = list(dict.fromkeys(methods))
    if not fmts or not methods:
        raise ValueError("error_report: give at least one format and one method")
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"error_report: method {m!r} is not known; expected one of {', '.join(METHODS)} "
                             "(GPTQ needs calibration data: quantize_model(..., method='gptq'))")
    fmts = list({f.name: f for f in fmts}.values())
    pairs, not_applicable = [], []
    for f in fmts:
        for m in methods:
            why = method_reason(f, m)
            if why is None:
                pairs.append((f, m))
            else:
                not_applicable.append({"format": f.name, "method": m, "reason": why})
    if not pairs:
        raise ValueError(f"error_report: no method applies to the formats asked for: {not_applicable[0]['reason']}")
    label, rows, get = _source(src)
    patterns = tuple(skip) + (DEFAULT_SKIP if default_skip else ())
    keep, left = _select(rows, fmts, patterns)
    if not keep:
        raise ValueError(f"error_report: no tensor of {label} to measure ({len(left)} left out: "
                         f"{'; '.join(sorted({r for _, r in left})[:3])}); see --skip / --no-default-skip")
    total = {(f.name, m): [ErrorStats(), 0] for f, m in pairs}
    per_tensor = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(math.prod(s) for _, s, _ in keep) * len(pairs), unit="elem", unit_scale=True,
                   desc="error", delay=_BAR_DELAY)
    try:
        for name, shape, _ in keep:
            t = get(name)
            x = t.detach().to(torch.float32) if t.dtype != torch.float32 else t.detach()
            for f, m in pairs:
                q = quantize(t, f, method=m, pad=True)
                st = _stats(x, q)
                acc = total[(f.name, m)]
                acc[0] = acc[0] + st
                acc[1] += q.nbytes
                per_tensor.append({"name": name, "format": f.name, "method": m, **_row(st, q.nbytes)})
                del q
                if bar is not None:
                    bar.update(st.count)
            del t, x
    finally:
        if bar is not None:
            bar.close()
    results = _ranked([{"format": f, "method": m, **_row(st, nb)} for (f, m), (st, nb) in total.items()])
    return {"source": label, "formats": [f.name for f in fmts], "methods": methods,
            "tensors": [{"name": n, "shape": list(s), "dtype": str(d).removeprefix("torch.")} for n, s, d in keep],
            "skipped": [{"name": n, "reason": r} for n, r in left], "not_applicable": not_applicable,
            "results": results, "per_tensor": per_tensor}


def _fmt_db(v: float) -> str:
    return "inf" if math.isinf(v) else f"{v:.2f}"


def _table(header: list[str], lines: list[list[str]], numeric: set[int]) -> str:
    """Aligned columns; those in ``numeric`` flush right."""
    w = [max(len(r[i]) for r in [header] + lines) for i in range(len(header))]
    return "\n".join("  ".join(c.rjust(w[i]) if i in numeric else c.ljust(w[i])
                               for i, c in enumerate(r)).rstrip() for r in [header] + lines) + "\n"


def format_report(report: dict, per_tensor: bool = False) -> str:
    """The ranking as an aligned text table (and, with ``per_tensor``, one line per tensor
    and pair, worst SQNR first within each tensor)."""
    n = len(report["tensors"])
    elems = report["results"][0]["elements"]
    out = [f"{report['source']}: {n} tensors, {elems / 1e6:.2f} M elements quantized per format "
           f"(methods: {', '.join(report['methods'])}); ranked by SQNR; * = no other row has as few bits and "
           "as low an error\n"]
    hdr = ["rank", "format", "method", "bits/elem", "SQNR dB", "rel. error", "cosine", "max abs", "front"]
    lines = [[str(i + 1), r["format"], r["method"], f"{r['bits_per_element']:.3f}", _fmt_db(r["sqnr_db"]),
              f"{r['rel_fro']:.5f}", f"{r['cosine']:.6f}", f"{r['max_abs']:.4g}", "*" if r["pareto"] else ""]
             for i, r in enumerate(report["results"])]
    out.append(_table(hdr, lines, {0, 3, 4, 5, 6, 7}))
    na: dict[str, list[str]] = {}
    for d in report["not_applicable"]:
        na.setdefault(d["method"], []).append(d["format"])
    for m, fs in na.items():
        out.append(f"{m} does not apply to {', '.join(fs)} (reasons in --json)\n")
    if report["skipped"]:
        reasons: dict[str, int] = {}
        for d in report["skipped"]:
            reasons[d["reason"]] = reasons.get(d["reason"], 0) + 1
        out.append(f"left out {len(report['skipped'])} tensors: "
                   + "; ".join(f"{c} {r}" for r, c in sorted(reasons.items(), key=lambda kv: -kv[1])) + "\n")
    if per_tensor:
        hdr = ["tensor", "format", "method", "bits/elem", "SQNR dB", "rel. error", "cosine", "max abs"]
        rows = sorted(report["per_tensor"], key=lambda r: (r["name"], -r["sqnr_db"]))
        out.append("\n" + _table(hdr, [[r["name"], r["format"], r["method"], f"{r['bits_per_element']:.3f}",
                                        _fmt_db(r["sqnr_db"]), f"{r['rel_fro']:.5f}", f"{r['cosine']:.6f}",
                                        f"{r['max_abs']:.4g}"] for r in rows], {3, 4, 5, 6, 7}))
    return "".join(out)


def _finite(obj):
    """``obj`` with every non-finite float as None (strict JSON has no Infinity)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def write_json(report: dict, path: str | os.PathLike, overwrite: bool = False, src=None) -> None:
    """Write ``report`` as JSON to ``path``, atomically (refused: an existing file without
    ``overwrite``, a link, a path inside or equal to ``src``; docs/safety.md)."""
    from .._paths import atomic_output, check_output

    check_output(src, path, overwrite, "error --json", kind="file")
    text = json.dumps(_finite(report), indent=1, allow_nan=False) + "\n"
    with atomic_output(path, "file", overwrite) as tmp:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(text)


def write_plot(report: dict, path: str | os.PathLike, overwrite: bool = False, src=None) -> None:
    """A PNG of SQNR (dB) against bits per element, one point per (format, method), the
    front joined by a line; written atomically like :func:`write_json`. Needs matplotlib."""
    title = (f"{os.path.basename(str(report['source']).rstrip(os.sep)) or report['source']}: "
             f"{len(report['tensors'])} tensors")
    write_points_plot([r for r in report["results"] if math.isfinite(r["sqnr_db"])], path, y="sqnr_db",
                      ylabel="SQNR (dB), higher is better", title=title, overwrite=overwrite, src=src,
                      what="error --plot")


def parse_formats(names: Iterable[str]) -> list[str]:
    """Format names from the command line: comma- or space-separated, case-insensitive;
    ``all`` for every registry preset."""
    out = []
    for n in names:
        for p in str(n).split(","):
            p = p.strip().lower()
            if not p:
                continue
            if p == "all":
                out.extend(registry)
            elif p in registry:
                out.append(p)
            else:
                raise ValueError(f"--formats: {p!r} is not in the registry; see `microscale formats` "
                                 "(or 'all')")
    return list(dict.fromkeys(out))


def mark_front(rows: list[dict], key: str) -> list[dict]:
    """Set each row's ``pareto``: no other row has as few ``bits_per_element`` or fewer and
    as high a ``key`` or higher, one of them strictly (bits compared to 0.001, as printed,
    so a global scale's 32 bits per tensor do not count). Returns ``rows``."""
    def bits(r):
        return round(r["bits_per_element"], 3)

    for r in rows:
        r["pareto"] = not any(o is not r and bits(o) <= bits(r) and o[key] >= r[key]
                              and (bits(o) < bits(r) or o[key] > r[key]) for o in rows)
    return rows


def format_table(header: list[str], lines: list[list[str]], numeric: Iterable[int]) -> str:
    """Aligned text columns (``numeric``: the column indices flushed right), one line per row
    after the header, as ``microscale error`` prints them."""
    return _table(header, lines, set(numeric))


def format_markdown(header: list[str], lines: list[list[str]], numeric: Iterable[int] = ()) -> str:
    """The same table in Markdown (``numeric`` columns right-aligned)."""
    num = set(numeric)
    rule = ["---:" if i in num else "---" for i in range(len(header))]
    return "".join("| " + " | ".join(r) + " |\n" for r in [header, rule] + lines)


def write_points_plot(rows: list[dict], path: str | os.PathLike, *, y: str, ylabel: str, title: str,
                      cosine_axis: bool = False, overwrite: bool = False, src=None, what: str = "--plot") -> None:
    """A PNG of ``row[y]`` against ``row["bits_per_element"]``, one labelled point per
    (``format``, ``method``) row, the rows whose ``pareto`` is set in blue and joined by a
    line (see :func:`mark_front`). ``cosine_axis``: ``y`` is a cosine similarity, drawn as
    ``1 - y`` on a log scale turned upside down, so values near 1 spread out, higher is
    still up and the ticks read as cosines. Written atomically under the output rules
    (an existing ``path`` only with ``overwrite``). Needs matplotlib."""
    from .._paths import atomic_output, check_output

    check_output(src, path, overwrite, what, kind="file")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError as e:
        raise ImportError(f"{what} needs matplotlib: pip install matplotlib (or microscale[plot])") from e

    def pos(r):  # the plotted value, and the one rows within a label's rounding share
        if not cosine_axis:
            return r[y], round(r[y], 1)
        d = max(1.0 - r[y], 1e-7)  # 1 - cos below float rounding draws at 1e-7
        return d, round(math.log10(d), 2)

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    try:
        points: dict[tuple, list[dict]] = {}  # rows that would draw on top of each other share one label
        for r in rows:
            points.setdefault((round(r["bits_per_element"], 2), pos(r)[1]), []).append(r)
        labels = []
        for (bits, _), rs in points.items():
            front = any(r.get("pareto") for r in rs)
            yv = pos(rs[0])[0]
            ax.scatter(bits, yv, s=28, color="C0" if front else "C7", zorder=4 if front else 3)
            names: dict[str, list[str]] = {}
            for r in rs:
                names.setdefault(r["format"], []).append(r["method"])
            labels.append((bits, yv, "; ".join(f if ms == ["rtn"] else f"{f} ({', '.join(ms)})"
                                               for f, ms in names.items())))
        front = sorted((r for r in rows if r.get("pareto")), key=lambda r: r["bits_per_element"])
        ax.plot([r["bits_per_element"] for r in front], [pos(r)[0] for r in front], color="C0", lw=1, zorder=2)
        if cosine_axis:
            ax.set_yscale("log")
            ax.invert_yaxis()

            def as_cos(v, _=None):
                return f"{1.0 - v:.{max(0, math.ceil(-math.log10(v) - 1e-9))}f}"

            def minor(v, _=None):  # label 2 and 5 of each decade only, so ticks stay readable
                return as_cos(v) if round(v / 10 ** math.floor(math.log10(v))) in (2, 5) else ""

            ax.yaxis.set_major_formatter(FuncFormatter(as_cos))
            ax.yaxis.set_minor_formatter(FuncFormatter(minor))
        ax.autoscale_view()
        lo, hi = ax.get_xlim()
        ax.set_xlim(lo, hi + 0.25 * (hi - lo))  # room for the labels of the rightmost points
        _place_labels(ax, labels, fig.dpi)
        ax.set_xlabel("storage bits per element (scales included)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        with atomic_output(path, "file", overwrite) as tmp:
            with open(tmp, "xb") as f:
                fig.savefig(f, format="png", dpi=110)
    finally:
        plt.close(fig)


def _place_labels(ax, labels: list[tuple[float, float, str]], dpi: float) -> None:
    """Annotate each ``(x, y, text)`` beside its point, moving a label up (in steps of one
    line) while it would overlap one placed before, lowest points first."""
    placed: list[tuple[float, float, float]] = []  # (left, bottom, right) in points
    to_pt = 72.0 / dpi
    line, char = 8.5, 3.9  # height of a line and mean glyph width of 7-point text, in points
    for x, y, text in sorted(labels, key=lambda t: ax.transData.transform((t[0], t[1]))[1]):
        px, py = (v * to_pt for v in ax.transData.transform((x, y)))
        left, right, dy = px + 4, px + 4 + char * len(text), 3.0
        while any(left < r and lo < right and abs(py + dy - b) < line for lo, b, r in placed):
            dy += line
        placed.append((left, py + dy, right))
        lead = {"arrowprops": {"arrowstyle": "-", "lw": 0.4, "color": "0.6"}} if dy > 3 else {}
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, dy), fontsize=7, va="bottom", **lead)


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation of two 1-D tensors of equal length: the Pearson correlation
    of their ranks (tied values share the mean of their ranks), in float64. ``nan`` when
    either has fewer than two distinct values (the correlation is undefined)."""
    if a.dim() != 1 or tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"spearman: a {tuple(a.shape)} and b {tuple(b.shape)} must be 1-D of equal length")

    def ranks(x):
        x = x.detach().to(torch.float64).cpu()
        order = torch.argsort(x, stable=True)
        _, inv, counts = torch.unique_consecutive(x[order], return_inverse=True, return_counts=True)
        avg = counts.cumsum(0).to(torch.float64) - (counts.to(torch.float64) - 1) / 2  # mean of 1-based ranks
        r = torch.empty_like(x)
        r[order] = avg[inv]
        return r - r.mean()

    ra, rb = ranks(a), ranks(b)
    den = math.sqrt(float((ra * ra).sum()) * float((rb * rb).sum()))
    return float((ra * rb).sum()) / den if den > 0 else math.nan


def embedding_agreement(ref: torch.Tensor, emb: torch.Tensor) -> dict:
    """How well embeddings ``emb`` ``[N, D]`` of N texts agree with the reference ``ref``
    (same texts, e.g. the float model), in float64:

    * ``cos_mean``, ``cos_min``: cosine of each text's two embeddings, mean and min;
    * ``spearman``: :func:`spearman` of the N(N-1)/2 pairwise cosine similarities
      ``cos(e_i, e_j)``, ``i < j``, of ``emb`` against those of ``ref``;
    * ``top1``: the share of texts ``i`` whose nearest other text (``argmax_{j != i}
      cos(e_i, e_j)``, the lowest ``j`` on ties) is the same under both.
    """
    if ref.dim() != 2 or tuple(ref.shape) != tuple(emb.shape) or ref.shape[0] < 3:
        raise ValueError(f"embedding_agreement: ref {tuple(ref.shape)} and emb {tuple(emb.shape)} must be "
                         "[N, D] of equal shape with N >= 3 texts")
    r = torch.nn.functional.normalize(ref.detach().to(torch.float64).cpu(), dim=1)
    e = torch.nn.functional.normalize(emb.detach().to(torch.float64).cpu(), dim=1)
    cos = (r * e).sum(1)
    sr, se = r @ r.T, e @ e.T
    i, j = torch.triu_indices(len(r), len(r), 1)
    eye = torch.eye(len(r), dtype=torch.bool)
    nn_r = sr.masked_fill(eye, -math.inf).argmax(1)
    nn_e = se.masked_fill(eye, -math.inf).argmax(1)
    return {"cos_mean": float(cos.mean()), "cos_min": float(cos.min()), "spearman": spearman(sr[i, j], se[i, j]),
            "top1": float((nn_r == nn_e).double().mean())}
