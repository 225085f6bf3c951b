"""Outputs of a run: JSON (the source of truth), CSV, a roofline plot, and
``benchmarks/RESULTS.md`` regenerated from the JSON.

:func:`render_markdown` and :func:`write_csv` depend only on the JSON document, so
``python -m microscale.bench report DIR/results.json`` reproduces RESULTS.md from a
saved run on any machine. The plot needs matplotlib, an optional import.
"""
from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import torch

from ._clocks import ClockState

__all__ = [
    "collect_env",
    "write_json",
    "load_json",
    "write_csv",
    "plot_roofline",
    "render_markdown",
    "write_text_atomic",
    "default_results_md",
    "regenerate",
    "write_outputs",
]

_OP_ORDER = ("quantize", "dequantize", "linear")


# ---- environment ----------------------------------------------------------------------

def _driver_version() -> Optional[str]:
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0].strip()
        except Exception:
            pass
    return None


def _git_commit() -> Optional[str]:
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=10"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except Exception:
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def collect_env(device: torch.device | str) -> dict:
    """Device, driver, CUDA, torch, triton, Python and microscale versions, and the date
    (UTC), for the JSON and the header of RESULTS.md."""
    device = torch.device(device)
    try:
        import triton
        triton_version: Optional[str] = triton.__version__
    except Exception:
        triton_version = None
    try:
        import microscale
        ms_version: Optional[str] = getattr(microscale, "__version__", None)
    except Exception:
        ms_version = None
    env: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda_runtime": torch.version.cuda,
        "microscale": ms_version,
        "git": _git_commit(),
        "cpu": _cpu_name(),
        "cpu_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update({
            "device": p.name,
            "capability": f"{p.major}.{p.minor}",
            "sm_count": p.multi_processor_count,
            "memory_gib": round(p.total_memory / 2**30, 1),
            "l2_mib": round(getattr(p, "L2_cache_size", 0) / 2**20, 1),
            "driver": _driver_version(),
        })
    else:
        env.update({"device": f"CPU: {env['cpu']}", "driver": None})
    return env


# ---- JSON / CSV -----------------------------------------------------------------------

def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically: a temporary file in the same folder, then
    ``os.replace`` (readers see the old file or the new one, never half of one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _json_safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def write_json(doc: dict, path: str | os.PathLike) -> Path:
    """Write the result document as JSON (atomically); non-finite floats become strings."""
    return write_text_atomic(path, json.dumps(_json_safe(doc), indent=1, sort_keys=False) + "\n")


def load_json(path: str | os.PathLike) -> dict:
    """Read a result document written by :func:`write_json`, checking its schema."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or doc.get("schema") != 1 or "results" not in doc:
        raise ValueError(f"{path}: not a microscale.bench result file (expected schema 1 with 'results')")
    return doc


def _peer_names(results: Iterable[dict], op: Optional[str] = None) -> list[str]:
    names: list[str] = []
    for r in results:
        if op is None or r["op"] == op:
            for p in r.get("peers") or []:
                if p["name"] not in names:
                    names.append(p["name"])
    return names


_CSV_COLS = ("op", "format", "shape", "status", "reason", "median_us", "p20_us", "p80_us", "method", "n_sets",
             "reps", "host_us", "bytes", "flops", "gbps", "tflops", "pct_copy", "pct_compute", "pct_roofline", "bound",
             "check_metric", "check_value", "sm_mhz_min", "slowed_pct")


def csv_rows(doc: dict) -> tuple[list[str], list[dict]]:
    """Header and rows of the CSV: one row per case, two columns per peer
    (``<peer> ratio`` = peer time / op time, ``<peer> us``)."""
    results = doc["results"]
    peers = _peer_names(results)
    header = list(_CSV_COLS) + [c for p in peers for c in (f"{p} ratio", f"{p} us")]
    rows = []
    for r in results:
        t, th, ck = r.get("timing") or {}, r.get("throughput") or {}, r.get("check") or {}
        row = {"op": r["op"], "format": r["format"], "shape": "x".join(map(str, r["shape"])),
               "status": r["status"], "reason": r.get("reason", ""),
               "median_us": _num(t.get("median_ms"), 1e3), "p20_us": _num(t.get("p20_ms"), 1e3),
               "p80_us": _num(t.get("p80_ms"), 1e3), "method": t.get("method", ""), "n_sets": t.get("n_sets", ""),
               "reps": t.get("reps", ""), "host_us": _num(t.get("host_us")), "bytes": r.get("nbytes") or "", "flops": r.get("flops") or "",
               "gbps": _num(th.get("gbps")), "tflops": _num(th.get("tflops")), "pct_copy": _num(th.get("pct_copy")),
               "pct_compute": _num(th.get("pct_compute")), "pct_roofline": _num(th.get("pct_roofline")),
               "bound": th.get("bound") or "", "check_metric": ck.get("metric", ""),
               "check_value": ck.get("value", ""), "sm_mhz_min": _num((t.get("clocks") or {}).get("sm_mhz_min")),
               "slowed_pct": _num((t.get("clocks") or {}).get("slowed"), 100)}
        by = {p["name"]: p for p in r.get("peers") or []}
        for name in peers:
            p = by.get(name) or {}
            row[f"{name} ratio"] = _num(p.get("ratio"))
            row[f"{name} us"] = _num((p.get("timing") or {}).get("median_ms"), 1e3)
        rows.append(row)
    return header, rows


def _num(v: Any, scale: float = 1.0) -> Any:
    return "" if v is None or isinstance(v, str) else round(float(v) * scale, 4)


def write_csv(doc: dict, path: str | os.PathLike) -> Path:
    """Write the CSV form of ``doc`` (see :func:`csv_rows`) atomically."""
    import io

    header, rows = csv_rows(doc)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=header, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return write_text_atomic(path, buf.getvalue())


# ---- plot -----------------------------------------------------------------------------

def _plot_bandwidth(ax: Any, mem: list[dict], bw: Optional[float]) -> None:
    labels = [f"{r['op']} {r['format']} {'x'.join(map(str, r['shape']))}" for r in mem]
    ax.barh(range(len(mem)), [r["throughput"]["gbps"] for r in mem], color="tab:blue")
    ax.set_yticks(range(len(mem)), labels, fontsize=7)
    ax.invert_yaxis()
    if bw:
        ax.axvline(bw, color="k", ls="--", lw=1, label=f"copy ceiling {bw:.0f} GB/s")
        ax.legend(fontsize=8, loc="best")
    ax.set_xlabel("achieved GB/s (bytes model / median time)")
    ax.set_title("memory-bound ops")


def _plot_roofline(ax: Any, mm: list[dict], ceil: dict, ticker: Any) -> None:
    bw, peak, fp8 = ceil.get("copy_gbps"), ceil.get("bf16_tflops"), ceil.get("fp8_tflops")
    pts = []
    for r in mm:
        pts.append(("microscale", r["format"], r["flops"] / r["nbytes"], r["throughput"]["tflops"]))
        for p in r.get("peers") or []:
            if p["status"] == "ok" and p.get("tflops") and p.get("nbytes"):
                pts.append((p["name"], r["format"], r["flops"] / p["nbytes"], p["tflops"]))
    xs = [p[2] for p in pts]
    lo, hi = min(xs) / 2, max(xs) * 2
    if bw:
        if peak:
            ridge = peak * 1e3 / bw  # FLOP/byte where the bf16 roof meets the copy slope
            lo, hi = min(lo, ridge / 100), max(hi, ridge * 4)
        grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        roof = [min(bw * x / 1e3, peak) if peak else bw * x / 1e3 for x in grid]
        label = f"roofline: {bw:.0f} GB/s" + (f", {peak:.0f} TFLOP/s bf16" if peak else "")
        ax.plot(grid, roof, "k--", lw=1, label=label)
    if fp8:
        ax.axhline(fp8, color="grey", ls=":", lw=1, label=f"fp8 _scaled_mm {fp8:.0f} TFLOP/s")
    colors: dict[str, int] = {}
    for who, fmt_name, x, y in pts:
        key = who if who != "microscale" else f"microscale {fmt_name}"
        first = key not in colors
        colors.setdefault(key, len(colors))
        ax.scatter([x], [y], s=28, marker="o" if who == "microscale" else "x",
                   color=f"C{colors[key] % 10}", label=key if first else None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = ticker.FuncFormatter(lambda v, _: f"{v:.0f}" if v >= 1 else f"{v:.3g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(ticker.NullFormatter())
    ax.legend(fontsize=7, loc="best")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("linear (weight-only) and peers")


def plot_roofline(doc: dict, path: str | os.PathLike) -> bool:
    """Roofline plot (PNG): the memory-bound ops' achieved GB/s against the copy
    ceiling, and the linear cases and their peers on TFLOP/s vs FLOP/byte under
    min(copy bandwidth x intensity, bf16 ceiling) (one panel for each group that ran).
    Returns False (and writes nothing) when matplotlib is not importable or nothing ran."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker as ticker
    except Exception:
        return False
    ok = [r for r in doc["results"] if r["status"] == "ok" and (r.get("throughput") or {}).get("gbps")]
    if not ok:
        return False
    ceil = doc.get("ceilings") or {}
    mem = [r for r in ok if not r.get("flops")]
    mm = [r for r in ok if r.get("flops")]
    panels = [p for p in (("mem", mem), ("mm", mm)) if p[1]]
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), max(4.5, 0.28 * len(mem) + 1.5)),
                             squeeze=False)
    for ax, (kind, rows) in zip(axes[0], panels):
        if kind == "mem":
            _plot_bandwidth(ax, rows, ceil.get("copy_gbps"))
        else:
            _plot_roofline(ax, rows, ceil, ticker)
    env = doc.get("env") or {}
    fig.suptitle(f"microscale.bench — {env.get('device', '?')} — {env.get('date', '')}", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
    return True


# ---- markdown -------------------------------------------------------------------------

def fmt_time(ms: Optional[float]) -> str:
    """A time given in ms, as µs below 1 ms and as ms above ('—' for None)."""
    if ms is None:
        return "—"
    return f"{ms * 1e3:.1f} µs" if ms < 1 else f"{ms:.3f} ms"


_t = fmt_time


def _f(v: Optional[float], spec: str, suffix: str = "") -> str:
    return "—" if v is None or isinstance(v, str) else f"{v:{spec}}{suffix}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return out


def _shape(r: dict) -> str:
    return "×".join(map(str, r["shape"]))


def bf16_mbps(r: dict) -> Optional[float]:
    """MB/s of the bf16 side of a quantize/dequantize (input of quantize, output of dequantize)."""
    t = r.get("timing") or {}
    if not t.get("median_ms") or r["op"] not in ("quantize", "dequantize"):
        return None
    return math.prod(r["shape"]) * 2 / t["median_ms"] / 1e3


def render_markdown(doc: dict, source: Optional[str] = None) -> str:
    """RESULTS.md from a result document: header (device, driver, versions, date),
    ceilings measured in the run, method, one table per op with the peers as ratios
    (peer time / microscale time: above 1 means microscale is faster), and every
    skipped or failed case with its reason."""
    env, ceil = doc.get("env") or {}, doc.get("ceilings") or {}
    detail = doc.get("ceilings_detail") or {}
    cpu = doc.get("mode") == "cpu"
    lines = ["# microscale benchmark results", ""]
    src = f" from `{source}`" if source else ""
    lines += [f"Generated by `python -m microscale.bench report <results.json>`{src}. Do not edit by hand: "
              "re-run the benchmark and regenerate.", ""]
    rows = [("device", env.get("device", "?") + (f" (sm_{env['capability'].replace('.', '')}, "
                                                  f"{env.get('sm_count')} SMs, {env.get('memory_gib')} GiB, "
                                                  f"L2 {env.get('l2_mib')} MiB)" if env.get("capability") else "")),
            ("driver", env.get("driver") or "n/a"), ("CUDA runtime (torch)", env.get("cuda_runtime") or "n/a"),
            ("torch", env.get("torch", "?")), ("triton", env.get("triton") or "n/a"),
            ("python", env.get("python", "?")), ("microscale", f"{env.get('microscale') or '?'} "
                                                               f"({env.get('git') or 'no git'})"),
            ("CPU", f"{env.get('cpu', '?')} ({env.get('cpu_threads', '?')} torch threads)"),
            ("date (UTC)", env.get("date", "?")), ("mode", doc.get("mode", "?")),
            ("suite", f"{doc.get('suite', '?')}" + (f", selection {json.dumps(doc['selection'])}"
                                                      if any((doc.get("selection") or {}).values()) else "")),
            ("seed", str(doc.get("seed", "?"))),
            ("wall time", f"{doc.get('wall_s', '?')} s" + ("" if doc.get("complete", True) else
                                                           " — INCOMPLETE: the run stopped before its last case"))]
    lines += _table(("", ""), rows) + [""]

    lines += ["## Ceilings measured in this run", ""]
    crow = []
    for key, label, unit, val in (("copy", "copy bandwidth (read + write)", "GB/s", ceil.get("copy_gbps")),
                                  ("bf16_mm", "cuBLAS bf16 matmul", "TFLOP/s", ceil.get("bf16_tflops")),
                                  ("fp8_mm", "fp8 `torch._scaled_mm`", "TFLOP/s", ceil.get("fp8_tflops"))):
        d = detail.get(key) or {}
        crow.append((label, f"{val:.0f} {unit}" if val is not None else f"n/a ({d.get('reason', 'not measured')})",
                     d.get("what", "")))
    lines += _table(("ceiling", "value", "how"), crow) + [""]

    m = doc.get("methodology") or {}
    if m:
        lines += ["## Method", ""] + [f"- {k.replace('_', ' ')}: {v}" for k, v in m.items() if k != "peers"]
        lines += [f"- peer {name}: {what}" for name, what in (m.get("peers") or {}).items()]
        lines += ["- bytes model ('MB moved'): quantize reads numel×2 (bf16) and writes q.nbytes; dequantize "
                  "reads q.nbytes and writes numel×2; linear reads the weight's bytes + M×K×2 and writes M×N×2; "
                  "flops 2×M×N×K.",
                  "- % roofline: max(bytes / copy bandwidth, flops / bf16 ceiling) / time. "
                  "Peer columns: peer time / microscale time (above 1: microscale is faster).",
                  "- timing column: method (events, graph or perf_counter), half the 20–80th percentile spread "
                  "relative to the median, rotated input sets, and the host time to launch one call (what an "
                  "eager caller pays when it exceeds the device time; a CUDA graph hides it); where the GPU "
                  "slowed its clock while the op was timed, the reason, the share of samples and the lowest "
                  "SM clock (e.g. 'power cap 80%': the board's power limit held the clock down; each timing "
                  "starts once the clock is free again).", ""]

    results = doc["results"]
    for op in _OP_ORDER + tuple(sorted({r["op"] for r in results} - set(_OP_ORDER))):
        rs = [r for r in results if r["op"] == op]
        if not rs:
            continue
        peers = _peer_names(rs)
        lines += [f"## {op}", ""]
        held = [f"copy {_f(ceil.get('copy_gbps'), '.0f', ' GB/s')}"]
        if any(r.get("flops") for r in rs):
            held += [f"cuBLAS bf16 {_f(ceil.get('bf16_tflops'), '.0f', ' TFLOP/s')}",
                     f"fp8 _scaled_mm {_f(ceil.get('fp8_tflops'), '.0f', ' TFLOP/s')}"]
        lines += [f"Ceilings of this run: {', '.join(held)}.", ""]
        if op == "linear":
            head = ["format", "M×N×K", "MB moved", "GFLOP", "time", "GB/s", "TFLOP/s", "% roofline", "bound"]
        elif cpu:
            head = ["format", "shape", "MB moved", "time", "bf16 MB/s", "GB/s (model)", "% copy"]
        else:
            head = ["format", "shape", "MB moved", "time", "GB/s", "% copy"]
        head += [f"vs {p}" for p in peers] + ["timing"]
        body = []
        notes: dict[str, str] = {}
        for r in rs:
            t, th = r.get("timing") or {}, r.get("throughput") or {}
            if r["status"] != "ok":
                row = [r["format"], _shape(r), f"{r['status']}"] + ["—"] * (len(head) - 4) + [""]
                body.append(row)
                continue
            row = [r["format"], _shape(r), _f((r.get("nbytes") or 0) / 1e6, ".1f")]
            if op == "linear":
                row.append(_f((r.get("flops") or 0) / 1e9, ".2f"))
            row.append(_t(t.get("median_ms")))
            if op == "linear":
                row += [_f(th.get("gbps"), ".0f"), _f(th.get("tflops"), ".1f"), _f(th.get("pct_roofline"), ".0f", "%"),
                        th.get("bound") or "—"]
            elif cpu:
                row += [_f(bf16_mbps(r), ".0f"), _f(th.get("gbps"), ".2f"), _f(th.get("pct_copy"), ".1f", "%")]
            else:
                row += [_f(th.get("gbps"), ".0f"), _f(th.get("pct_copy"), ".0f", "%")]
            by = {p["name"]: p for p in r.get("peers") or []}
            for name in peers:
                p = by.get(name)
                if p and p["status"] == "ok":
                    row.append(_f(p.get("ratio"), ".2f", "×"))
                else:
                    row.append(p["status"] if p else "—")
                    if p and p.get("reason"):
                        notes.setdefault(f"{name}: {p['reason']}", r["format"])
            spread = ""
            if t.get("p20_ms") is not None and t.get("median_ms"):
                spread = f" ±{50 * (t['p80_ms'] - t['p20_ms']) / t['median_ms']:.0f}%"
            n_sets = t.get("n_sets", 1)
            cell = f"{t.get('method', '')}{spread}, {n_sets} input set{'s' if n_sets != 1 else ''}"
            if t.get("host_us") is not None:
                cell += f", host {t['host_us']:.0f} µs/call"
            if (t.get("clocks") or {}).get("slowed"):
                cell += f", {ClockState.from_dict(t['clocks']).summary()}"
            row.append(cell)
            body.append(row)
        lines += _table(head, body) + [""]
        if notes:
            lines += ["Peers not run:", ""] + [f"- {k}" for k in notes] + [""]

    bad = [r for r in results if r["status"] != "ok"]
    if bad:
        lines += ["## Skipped, failed or errored cases", ""]
        lines += [f"- `{r['op']}/{r['format']}/{'x'.join(map(str, r['shape']))}` — {r['status']}: "
                  f"{r.get('reason', '')}" for r in bad] + [""]
    return "\n".join(lines)


def default_results_md() -> Path:
    """``benchmarks/RESULTS.md`` of the source checkout this package lives in (next to
    its ``pyproject.toml``), else of the current directory."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").exists() or (root / ".git").exists():
        return root / "benchmarks" / "RESULTS.md"
    return Path.cwd() / "benchmarks" / "RESULTS.md"


#: Line that separates a hand-written summary (above it, kept) from the generated report
#: (below it, rewritten) in a RESULTS.md.
GENERATED_MARK = "<!-- generated below: `python -m microscale.bench report` rewrites everything after this line -->"


def hand_preamble(md_path: str | os.PathLike) -> str:
    """The hand-written text of an existing RESULTS.md up to and including
    :data:`GENERATED_MARK`, followed by a blank line; ``""`` when the file does not exist or
    has no such line (then the whole file is generated)."""
    try:
        text = Path(md_path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    i = text.find(GENERATED_MARK)
    return "" if i < 0 else text[:i + len(GENERATED_MARK)] + "\n\n"


def regenerate(json_path: str | os.PathLike, md_path: Optional[str | os.PathLike] = None) -> Path:
    """Regenerate RESULTS.md (default :func:`default_results_md`) from a results JSON,
    atomically, keeping a hand-written summary above :data:`GENERATED_MARK`. Returns the
    path written."""
    doc = load_json(json_path)
    md = Path(md_path) if md_path is not None else default_results_md()
    return write_text_atomic(md, hand_preamble(md) + render_markdown(doc, source=str(json_path)))


def write_outputs(doc: dict, out_dir: str | os.PathLike) -> dict[str, Optional[Path]]:
    """Write ``results.json``, ``results.csv`` and ``roofline.png`` (when matplotlib
    imports) into ``out_dir``; returns the paths (``None`` for a plot not written)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Optional[Path]] = {
        "json": write_json(doc, out / "results.json"),
        "csv": write_csv(doc, out / "results.csv"),
    }
    png = out / "roofline.png"
    paths["png"] = png if plot_roofline(doc, png) else None
    return paths
