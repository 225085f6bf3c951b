"""Sharded loading reads only each rank's slice, for every safetensors convention microscale reads."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import microscale as ms
import microscale.io as msio
from microscale.distributed import ReadStats, gather, load_sharded, shard

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bytes(t):
    return None if t is None else t.contiguous().reshape(-1).view(torch.uint8)


def _same(a: ms.QTensor, b: ms.QTensor) -> None:
    assert a.fmt == b.fmt and a.shape == b.shape and a.dtype == b.dtype and a.meta == b.meta
    for p in ("data", "scales", "global_scale", "zero_points"):
        x, y = getattr(a, p), getattr(b, p)
        assert (x is None) == (y is None), p
        if x is not None:
            assert x.shape == y.shape and x.dtype == y.dtype and torch.equal(_bytes(x), _bytes(y)), p


def _q(fmt, shape, seed):
    return ms.quantize(torch.randn(shape, generator=torch.Generator().manual_seed(seed)), fmt)


CASES = [  # (convention, format, tensor name, shape)
    ("native", "nvfp4", "l.q_proj.weight", (64, 128)),
    ("native", "int4_affine_g32", "l.q_proj.weight", (64, 128)),
    ("native", "mxfp6_e3m2", "l.q_proj.weight", (64, 128)),
    ("native", "fp8_e4m3_block128x128", "l.q_proj.weight", (512, 512)),
    ("modelopt", "nvfp4", "l.q_proj.weight", (64, 128)),
    ("compressed-tensors", "nvfp4", "l.q_proj.weight", (64, 128)),
    ("compressed-tensors", "mxfp4", "l.q_proj.weight", (64, 128)),
    ("gpt-oss", "mxfp4", "m.experts.up_proj", (4, 64, 128)),
]


@pytest.mark.parametrize("conv,fmt,name,shape", CASES)
def test_sharded_load_equals_shard_of_full(tmp_path, conv, fmt, name, shape):
    q = _q(fmt, shape, 1)
    if conv == "compressed-tensors" and fmt == "mxfp4":
        q = ms.quantize(torch.randn(shape), ms.get_format("mxfp4").replace(scale_rule="even"))
    path = tmp_path / "ck"
    msio.save({name: q, "norm.weight": torch.randn(8)}, path, convention=conv)
    full = msio.load(path)[name]
    for dim in ("n", "k") + ((0,) if len(shape) == 3 else ()):
        for world in (2, 4):
            parts = []
            for rank in range(world):
                st = ReadStats()
                got = load_sharded(path, world, rank, dims={"*": dim}, stats=st)
                want = shard(full, dim, world, rank)
                _same(got[name], want)
                assert torch.equal(got["norm.weight"], msio.load(path)["norm.weight"])
                # only the shard's bytes were read (plus the replicated scalars and the 8-float norm)
                shard_bytes = sum(t.numel() * t.element_size() for t in (want.data, want.scales, want.zero_points)
                                  if t is not None)
                assert shard_bytes <= st.bytes_read <= shard_bytes + 64, (st.bytes_read, shard_bytes)
                parts.append(got[name])
            _same(gather(parts), full)


def test_padding_and_block_errors(tmp_path):
    q = _q("nvfp4", (6, 48), 2)  # 3 blocks along K, 6 rows
    path = tmp_path / "ck"
    msio.save({"w.weight": q}, path)
    with pytest.raises(ValueError, match=r"w.weight.*4 equal shards.*pad=True"):
        load_sharded(path, 4, 0, dims={"*": "k"})
    parts = [load_sharded(path, 4, r, dims={"*": "k"}, pad=True)["w.weight"] for r in range(4)]
    for r, p in enumerate(parts):
        _same(p, shard(q, "k", 4, r, pad=True))
    _same(gather(parts), msio.load(path)["w.weight"])


_PEAK_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r})
    def rss(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    from microscale.distributed import ReadStats, load_sharded
    load_sharded({warm!r}, 4, 1, dims={{"*": {dim!r}}})  # imports and first-call caches
    base = rss("VmRSS")
    stats = ReadStats()
    out = load_sharded({path!r}, 4, 1, dims={{"*": {dim!r}}}, stats=stats)
    print(json.dumps({{"base": base, "peak": rss("VmHWM"), "local": out["w.q_proj.weight"].nbytes,
                      "read": stats.bytes_read, "largest": stats.largest}}))
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
@pytest.mark.parametrize("dim", ["n", "k"])
def test_peak_memory_near_shard_bytes(tmp_path, dim):
    """A rank loading its quarter of a 66 MiB MXFP8 weight reads and holds about that quarter:
    bytes read from the file (ReadStats) and the process's peak resident memory (VmHWM, which
    sees torch's allocations) both stay far below the full tensor."""
    fmt = ms.get_format("mxfp8_e4m3")
    rows = cols = 8192
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 0x7F, (rows, cols), dtype=torch.uint8, generator=g)  # finite e4m3 codes
    scales = torch.randint(110, 140, (rows, cols // 32), dtype=torch.uint8, generator=g)
    q = ms.QTensor(data, scales, fmt, torch.Size((rows, cols)), torch.bfloat16)
    full = q.nbytes
    msio.save({"w.q_proj.weight": q}, tmp_path / "ck")
    del q, data, scales
    msio.save({"w.q_proj.weight": _q("mxfp8_e4m3", (256, 256), 1)}, tmp_path / "warm")
    code = _PEAK_CHILD.format(root=ROOT, warm=str(tmp_path / "warm"), path=str(tmp_path / "ck"), dim=dim)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout.strip().splitlines()[-1])
    assert m["local"] * 4 <= full + 64
    assert m["read"] <= m["local"] + 64, m  # only the shard's bytes (plus scalars) come from the file
    growth = m["peak"] - m["base"]
    # the shard (1/4 of the tensor) plus transient buffers; reading the whole tensor would cost >= full
    assert growth <= 1.5 * m["local"] + 4 * 2**20, (growth / full, m)
