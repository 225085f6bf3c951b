"""Peak RSS of a streaming checkpoint conversion (``microscale.io.convert``).

Builds a synthetic sharded bf16 checkpoint (index json + shards, written tensor by
tensor), converts it in a child process and reports the child's peak RSS (VmHWM)
against the bound ``2 x largest tensor + 500 MB``. The input is hashed before and
after to show it is not modified.

    python benchmarks/convert_rss.py                       # ~2.1 GB, largest 256 MB, mxfp4
    python benchmarks/convert_rss.py --size-mb 100 --largest-mb 32 --format nvfp4 --json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, {root!r})
def rss(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
import torch
from microscale import io as msio
base = rss("VmRSS")
t0 = time.perf_counter()
s = msio.convert({src!r}, {dst!r}, fmt={fmt!r}, convention={conv!r}, progress=False)
print(json.dumps({{"baseline_rss": base, "peak_rss": rss("VmHWM"), "seconds": time.perf_counter() - t0,
                   "quantized": len(s["quantized"]), "copied": len(s["copied"]) + len(s["skipped"]),
                   "bytes_out": s["bytes_out"]}}))
"""


def build(root: str, size_mb: int, largest_mb: int, shard_mb: int = 512, dtype: str = "bfloat16") -> dict:
    """Write a synthetic checkpoint (bf16 by default); returns {name: nbytes}."""
    import torch

    dt = getattr(torch, dtype)

    from microscale.io import SafetensorsWriter

    os.makedirs(root, exist_ok=True)
    k = 4096
    sizes = [largest_mb]
    rest = size_mb - largest_mb
    while rest > 0:
        s = min(rest, max(largest_mb // 2, 8))
        sizes.append(s)
        rest -= s
    names, shards, cur, cur_mb = {}, [], [], 0
    for i, mb in enumerate(sizes):
        rows = mb * 2**20 // (dt.itemsize * k)
        cur.append((f"model.layers.{i}.mlp.up_proj.weight", rows))
        cur_mb += mb
        if cur_mb >= shard_mb:
            shards.append(cur)
            cur, cur_mb = [], 0
    if cur:
        shards.append(cur)
    shards[0].append(("model.norm.weight", None))
    wm = {}
    g = torch.Generator().manual_seed(0)
    for si, items in enumerate(shards):
        fname = f"model-{si + 1:05d}-of-{len(shards):05d}.safetensors"
        w = SafetensorsWriter(os.path.join(root, fname), {"format": "pt"})
        for name, rows in items:
            t = torch.randn(k, generator=g) if rows is None else torch.randn(rows, k, generator=g)
            t = t.to(dt)
            w.add(name, t)
            names[name] = t.numel() * dt.itemsize
            wm[name] = fname
            del t
        w.close()
    with open(os.path.join(root, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(names.values())}, "weight_map": wm}, f)
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump({"model_type": "synthetic"}, f)
    return names


def digest(root: str) -> str:
    import hashlib

    h = hashlib.sha256()
    for f in sorted(os.listdir(root)):
        with open(os.path.join(root, f), "rb") as fh:
            while chunk := fh.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=2112)
    ap.add_argument("--largest-mb", type=int, default=256)
    ap.add_argument("--format", default="mxfp4")
    ap.add_argument("--convention", default="native")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", action="store_true", help="print one JSON line only")
    a = ap.parse_args(argv)
    work = a.workdir or tempfile.mkdtemp(prefix="ms_rss_")
    src, dst = os.path.join(work, "src"), os.path.join(work, "dst")
    try:
        t0 = time.perf_counter()
        names = build(src, a.size_mb, a.largest_mb, dtype=a.dtype)
        build_s = time.perf_counter() - t0
        before = digest(src)
        code = CHILD.format(root=ROOT, src=src, dst=dst, fmt=a.format, conv=a.convention)
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if p.returncode:
            print(p.stderr, file=sys.stderr)
            return p.returncode
        r = json.loads(p.stdout.strip().splitlines()[-1])
        largest = max(names.values())
        r.update(total_bytes=sum(names.values()), largest_tensor=largest, tensors=len(names), format=a.format,
                 dtype=a.dtype,
                 bound=2 * largest + 500 * 2**20, input_unchanged=digest(src) == before, build_seconds=build_s)
        r["within_bound"] = r["peak_rss"] <= r["bound"]
        r["peak_minus_baseline"] = r["peak_rss"] - r["baseline_rss"]
        if a.json:
            print(json.dumps(r))
        else:
            mb = lambda b: f"{b / 2**20:.0f} MB"  # noqa: E731
            print(f"checkpoint: {r['tensors']} tensors, {mb(r['total_bytes'])} {a.dtype}, largest tensor "
                  f"{mb(largest)}; format {a.format} ({a.convention})")
            print(f"convert: {r['seconds']:.1f} s; RSS after imports {mb(r['baseline_rss'])}, peak {mb(r['peak_rss'])} "
                  f"(peak - baseline {mb(r['peak_minus_baseline'])})")
            print(f"bound 2 x largest + 500 MB = {mb(r['bound'])}: {'OK' if r['within_bound'] else 'EXCEEDED'}; "
                  f"input unchanged: {r['input_unchanged']}")
        return 0 if r["within_bound"] and r["input_unchanged"] else 1
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
