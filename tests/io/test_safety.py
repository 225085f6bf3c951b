"""Data safety of every writer (docs/safety.md): outputs never replace or sit inside the
input, existing outputs need overwrite, metadata paths stay inside SRC, only regular
files are read, side files come from an allow-list, replacement is atomic, abandoned
temporaries are cleaned only when their lock is free."""
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest
import torch

import microscale as ms
from microscale import io as msio
from microscale import _paths

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tree(root):
    """{relative path: bytes} of every regular file under root (symlinks not followed)."""
    out = {}
    for dp, dirs, fs in os.walk(root):
        for f in fs:
            p = os.path.join(dp, f)
            if os.path.isfile(p) and not os.path.islink(p):
                out[os.path.relpath(p, root)] = open(p, "rb").read()
    return out


def _small(tmp_path, make_checkpoint, name="src", **kw):
    g = torch.Generator().manual_seed(1)
    return make_checkpoint(tmp_path / name, {"model.safetensors": {"l.weight": torch.randn(32, 64, generator=g)}},
                           index=False, **kw)


# ---- DST: never SRC, never its container, never silently replaced ------------------------
def test_existing_dst_is_refused_and_kept(tmp_path, make_checkpoint):
    src = _small(tmp_path, make_checkpoint)
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="--overwrite"):
        msio.convert(src, dst, fmt="nvfp4", progress=False)
    assert (dst / "precious.txt").read_text() == "keep me"
    with pytest.raises(FileExistsError):
        msio.save({"w": torch.ones(2)}, dst)
    assert sorted(os.listdir(dst)) == ["precious.txt"]
    f = tmp_path / "a_file"
    f.write_text("x")
    with pytest.raises(FileExistsError):
        msio.convert(src, f, fmt="nvfp4", progress=False)
    assert f.read_text() == "x"


def test_empty_dst_directory_is_fine(tmp_path, make_checkpoint):
    src = _small(tmp_path, make_checkpoint)
    (tmp_path / "out").mkdir()
    msio.convert(src, tmp_path / "out", fmt="nvfp4", progress=False)
    assert "model.safetensors" in os.listdir(tmp_path / "out")


@pytest.mark.parametrize("where", ["parent", "same", "inside", "file_dir", "file_itself"])
def test_dst_never_contains_equals_or_sits_in_src(tmp_path, make_checkpoint, where):
    src = _small(tmp_path, make_checkpoint)
    (tmp_path / "other.txt").write_text("other data")
    before = _tree(tmp_path)
    s, d = {"parent": (src, tmp_path), "same": (src, src), "inside": (src, os.path.join(src, "q")),
            "file_dir": (os.path.join(src, "model.safetensors"), src),
            "file_itself": (os.path.join(src, "model.safetensors"), os.path.join(src, "model.safetensors"))}[where]
    for overwrite in (False, True):  # overwrite never allows it
        with pytest.raises(msio.UnsafePathError, match="must differ from SRC"):
            msio.convert(s, d, fmt="nvfp4", progress=False, overwrite=overwrite)
    assert _tree(tmp_path) == before


def test_dst_symlink_is_refused(tmp_path, make_checkpoint):
    src = _small(tmp_path, make_checkpoint)
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(msio.UnsafePathError, match="symbolic link"):
        msio.convert(src, tmp_path / "link", fmt="nvfp4", progress=False, overwrite=True)


@pytest.mark.parametrize("exchange", [True, False])
def test_overwrite_replaces_atomically(tmp_path, make_checkpoint, monkeypatch, exchange):
    src = _small(tmp_path, make_checkpoint)
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "old.txt").write_text("old")
    calls = []
    real = _paths._renameat2

    def spy(a, b, flags):
        calls.append(flags)
        return real(a, b, flags) if exchange else False  # False: as on a system without renameat2

    monkeypatch.setattr(_paths, "_renameat2", spy)
    msio.convert(src, dst, fmt="nvfp4", progress=False, overwrite=True)
    assert sorted(os.listdir(dst)) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert calls == [_paths._RENAME_EXCHANGE]
    assert [f for f in os.listdir(tmp_path) if ".partial-" in f] == []


def test_replace_failure_keeps_the_old_dst(tmp_path, make_checkpoint, monkeypatch):
    """A failure while building the new output leaves the old DST untouched."""
    src = _small(tmp_path, make_checkpoint)
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "old.txt").write_text("old")

    def boom(name):
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        msio.convert(src, dst, fmt="nvfp4", progress=False, overwrite=True, on_tensor=boom)
    assert os.listdir(dst) == ["old.txt"]
    assert [f for f in os.listdir(tmp_path) if ".partial-" in f] == []


def test_degraded_replace_interrupted_between_renames_is_restored(tmp_path):
    """Without RENAME_EXCHANGE the old DST is moved aside first; if the writer dies before
    the new one is in place, the next run for DST puts the old one back."""
    dst = tmp_path / "out"
    stem = tmp_path / ".out.partial-h-1-abc"
    stem.mkdir()  # the new, complete output that never got renamed
    old = tmp_path / ".out.partial-h-1-abc.old"
    old.mkdir()
    (old / "model.safetensors").write_text("the user's old output")
    (tmp_path / ".out.partial-h-1-abc.lock").write_text("")  # its writer is gone: the lock is free
    _paths.clean_abandoned(dst)
    assert (dst / "model.safetensors").read_text() == "the user's old output"
    assert sorted(os.listdir(tmp_path)) == ["out"]


_HOLD = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(120)
""")


def test_cleanup_spares_a_live_writer_in_another_process(tmp_path, make_checkpoint):
    """A temporary whose lock is held (a writer in another container, whatever its pid
    says) survives a run for the same DST; one whose lock is free is removed."""
    src = _small(tmp_path, make_checkpoint)
    live = tmp_path / ".out.partial-999999-live"  # a pid that does not exist here
    live.mkdir()
    (live / "model.safetensors").write_text("in progress")
    dead = tmp_path / ".out.partial-999998-dead"
    dead.mkdir()
    (tmp_path / ".out.partial-999998-dead.lock").write_text("")
    p = subprocess.Popen([sys.executable, "-c", _HOLD, str(live) + ".lock"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        msio.convert(src, tmp_path / "out", fmt="nvfp4", progress=False)
        assert (live / "model.safetensors").read_text() == "in progress"
        assert not dead.exists() and not (tmp_path / ".out.partial-999998-dead.lock").exists()
    finally:
        p.kill()
        p.wait()


def test_outputs_respect_the_umask(tmp_path, make_checkpoint):
    src = _small(tmp_path, make_checkpoint)
    old = os.umask(0o022)
    try:
        msio.convert(src, tmp_path / "out", fmt="nvfp4", progress=False)
        msio.save({"w": torch.ones(2)}, tmp_path / "saved")
    finally:
        os.umask(old)
    for d in ("out", "saved"):
        assert stat.S_IMODE(os.stat(tmp_path / d).st_mode) == 0o755
        assert stat.S_IMODE(os.stat(tmp_path / d / "model.safetensors").st_mode) == 0o644


# ---- paths from metadata stay inside SRC -------------------------------------------------
@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_weight_map_cannot_leave_src(tmp_path, make_checkpoint, kind):
    victim = make_checkpoint(tmp_path / "victim", {"model.safetensors": {"x.weight": torch.randn(16, 64)}},
                             index=False)
    before = _tree(tmp_path / "victim")
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    target = {"dotdot": "../victim/model.safetensors", "absolute": os.path.join(victim, "model.safetensors"),
              "symlink": "link.safetensors"}[kind]
    if kind == "symlink":
        os.symlink(os.path.join(victim, "model.safetensors"), src / "link.safetensors")
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x.weight": target}}))
    with pytest.raises(msio.UnsafePathError, match="outside|absolute|climbs"):
        msio.open_checkpoint(src)
    with pytest.raises(msio.UnsafePathError):
        msio.convert(src, tmp_path / "out", fmt="mxfp4", progress=False)
    assert _tree(tmp_path / "victim") == before
    assert not (tmp_path / "out").exists()


def test_shard_symlink_outside_src_without_index_is_refused(tmp_path, make_checkpoint):
    other = _small(tmp_path, make_checkpoint, name="other")
    src = tmp_path / "src"
    src.mkdir()
    os.symlink(os.path.join(other, "model.safetensors"), src / "model.safetensors")
    with pytest.raises(msio.UnsafePathError, match="outside"):
        msio.open_checkpoint(src)


def test_hf_cache_snapshot_symlinks_into_blobs_are_followed(tmp_path, make_checkpoint):
    """A Hugging Face cache snapshot links every file into the repository's blobs folder."""
    real = _small(tmp_path, make_checkpoint, name="real")
    repo = tmp_path / "models--org--toy"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(os.listdir(real))):
        os.rename(os.path.join(real, f), repo / "blobs" / f"blob{i}")
        os.symlink(f"../../blobs/blob{i}", snap / f)
    s = msio.convert(snap, tmp_path / "out", fmt="nvfp4", progress=False)
    assert s["quantized"] == ["l.weight"] and sorted(s["files_copied"]) == ["config.json", "tokenizer.json"]
    assert not os.path.islink(tmp_path / "out" / "tokenizer.json")


# ---- only regular files, side files from an allow-list --------------------------------------
def test_side_files_allow_list_and_no_symlink_escape(tmp_path, make_checkpoint):
    src = _small(tmp_path, make_checkpoint)
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY")
    os.remove(os.path.join(src, "tokenizer.json"))
    os.symlink(secret, os.path.join(src, "tokenizer.json"))
    os.symlink("/dev/zero", os.path.join(src, "vocab.txt"))
    for name, data in {"pytorch_model.bin": b"full precision", "model.onnx": b"x", "special_tokens_map.json": b"{}",
                       "modules.json": b"[]", "README.md": b"# toy", "LICENSE": b"Apache", "merges.txt": b"a b",
                       "data_config.json": b"{}", ".gitattributes": b"*"}.items():
        open(os.path.join(src, name), "wb").write(data)
    for d, files in {"onnx": ["model.onnx"], ".git": ["HEAD"], "1_Pooling": ["config.json"],
                     "2_Dense": ["config.json", "pytorch_model.bin"]}.items():
        os.makedirs(os.path.join(src, d))
        for f in files:
            open(os.path.join(src, d, f), "wb").write(b"{}")
    s = msio.convert(src, tmp_path / "out", fmt="nvfp4", progress=False)
    out = _tree(tmp_path / "out")
    assert sorted(out) == sorted(["model.safetensors", "config.json", "special_tokens_map.json", "modules.json",
                                  "README.md", "LICENSE", "merges.txt", "1_Pooling/config.json",
                                  "2_Dense/config.json"])
    assert b"PRIVATE KEY" not in b"".join(out.values())
    skipped = dict(s["files_skipped"])
    assert "outside" in skipped["tokenizer.json"] and "outside" in skipped["vocab.txt"]
    for name in ("pytorch_model.bin", "model.onnx", "onnx/", ".git/", "data_config.json", ".gitattributes",
                 os.path.join("2_Dense", "pytorch_model.bin")):
        assert name in skipped, name
    assert sorted(s["files_copied"]) == sorted(n for n in out if n != "model.safetensors")


def test_special_files_inside_src_are_not_read(tmp_path, make_checkpoint):
    src = _small(tmp_path, make_checkpoint)
    os.remove(os.path.join(src, "tokenizer.json"))
    os.mkfifo(os.path.join(src, "tokenizer.json"))
    s = msio.convert(src, tmp_path / "out", fmt="nvfp4", progress=False)
    assert "FIFO" in dict(s["files_skipped"])["tokenizer.json"]
    assert not (tmp_path / "out" / "tokenizer.json").exists()


_FIFO_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from microscale import io as msio
    try:
        {call}
    except ValueError as e:
        print("ERROR", e)
""")


@pytest.mark.parametrize("call", ["msio.inspect(P)", "msio.convert(P, P + '.out', fmt='nvfp4', progress=False)",
                                  "msio.load(P)"])
def test_fifo_named_safetensors_fails_fast(tmp_path, call):
    fifo = str(tmp_path / "model.safetensors")
    os.mkfifo(fifo)
    code = _FIFO_CHILD.format(root=ROOT, call=call.replace("P", repr(fifo)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "ERROR" in r.stdout and "FIFO" in r.stdout, r.stdout + r.stderr


def test_open_regular_refuses_specials(tmp_path):
    os.mkfifo(tmp_path / "f")
    with pytest.raises(msio.UnsafePathError, match="FIFO"):
        _paths.open_regular(tmp_path / "f")
    with pytest.raises(msio.UnsafePathError, match="character device"):
        _paths.open_regular("/dev/zero")
    (tmp_path / "r").write_text("x")
    os.symlink(tmp_path / "r", tmp_path / "l")
    with pytest.raises(msio.UnsafePathError, match="symbolic link"):
        _paths.open_regular(tmp_path / "l", follow=False)
    assert _paths.open_regular(tmp_path / "l").read() == b"x"


def test_json_given_as_safetensors(tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_text(json.dumps({"weight_map": {"a": "b"}}))
    with pytest.raises(msio.SafetensorsError, match="not a safetensors file: " + str(p)):
        msio.inspect(p)


# ---- GGUF export temporaries -----------------------------------------------------------------
_GGUF_CHILD = textwrap.dedent("""
    import sys, time, torch, signal
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (a parent started in the background may ignore it)
    sys.path.insert(0, {root!r})
    from microscale.io.gguf_io import save_gguf
    def items():
        for i in range(100):
            yield f"t{{i}}", torch.randn(4, 32)
            print("done", i, flush=True)
            time.sleep(0.3)
    save_gguf({dst!r}, items())
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL])
def test_killed_gguf_export_leaves_no_temp(tmp_path, sig):
    pytest.importorskip("gguf")
    dst = str(tmp_path / "m.gguf")
    p = subprocess.Popen([sys.executable, "-c", _GGUF_CHILD.format(root=ROOT, dst=dst)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().startswith("done")
    p.send_signal(sig)
    p.wait(timeout=60)
    assert p.returncode != 0
    if sig == signal.SIGKILL:  # no chance to clean up: the next export to the same file does
        from microscale.io.gguf_io import save_gguf

        save_gguf(dst, [("w", torch.ones(4, 32))])
        assert os.listdir(tmp_path) == ["m.gguf"]
    else:
        assert os.listdir(tmp_path) == []


def test_gguf_output_exists(tmp_path, make_checkpoint):
    pytest.importorskip("gguf")
    src = _small(tmp_path, make_checkpoint)
    (tmp_path / "m.gguf").write_text("old")
    with pytest.raises(FileExistsError):
        msio.convert(src, tmp_path / "m.gguf", fmt="mxfp4", convention="gguf", progress=False)
    assert (tmp_path / "m.gguf").read_text() == "old"
    msio.convert(src, tmp_path / "m.gguf", fmt="mxfp4", convention="gguf", progress=False, overwrite=True)
    assert msio.inspect(tmp_path / "m.gguf")[0] == "gguf"
    with pytest.raises(FileExistsError):
        msio.save({"w": torch.ones(4, 32)}, tmp_path / "m.gguf", convention="gguf")


# ---- silent results made loud -----------------------------------------------------------------
def test_block_size_is_named_in_the_output(tmp_path, make_checkpoint):
    src = _small(tmp_path, make_checkpoint)
    msio.convert(src, tmp_path / "n64", fmt="nvfp4", quantize_kwargs={"block_size": 64}, progress=False)
    q = msio.load(tmp_path / "n64")["l.weight"]
    assert q.fmt.block_size == 64 and q.fmt.name == "nvfp4_b64"
    assert msio.inspect(tmp_path / "n64")[1][0][1] == "nvfp4_b64"
    with pytest.raises(ValueError, match="block_size=0"):
        msio.convert(src, tmp_path / "z", fmt="nvfp4", quantize_kwargs={"block_size": 0}, progress=False)
    with pytest.raises(ValueError, match="NVFP4 only"):  # the convention sees the real block size
        msio.convert(src, tmp_path / "m", fmt="nvfp4", convention="modelopt", quantize_kwargs={"block_size": 64},
                     progress=False)
    msio.convert(src, tmp_path / "r", fmt="mxfp4", quantize_kwargs={"scale_rule": "rceil"}, progress=False)
    assert msio.load(tmp_path / "r")["l.weight"].fmt.name == "mxfp4_rceil"


def test_gpt_oss_on_a_dense_model_is_an_error(tmp_path, make_checkpoint):
    src = _small(tmp_path, make_checkpoint)
    with pytest.raises(ValueError, match="gpt-oss.*none of the 1 tensors.*MoE expert"):
        msio.convert(src, tmp_path / "o", fmt="mxfp4", convention="gpt-oss", progress=False)
    with pytest.raises(ValueError, match=r"none of the 1 tensors.*1 match the skip patterns"):
        msio.convert(src, tmp_path / "o", fmt="mxfp4", skip=["l.*"], progress=False)
    with pytest.raises(ValueError, match=r"none of the 1 tensors.*128-element block"):
        msio.convert(src, tmp_path / "o", fmt="int4_affine_g128", progress=False)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kw", [{"dequantize": True}, {"convention": "compressed-tensors"}])
def test_float_checkpoint_to_convert_or_dequantize_is_an_error(tmp_path, make_checkpoint, kw):
    src = _small(tmp_path, make_checkpoint)
    with pytest.raises(ValueError, match="no quantized tensors"):
        msio.convert(src, tmp_path / "o", progress=False, **kw)
    assert not (tmp_path / "o").exists()


# ---- cost: linear in the number of tensors, dequantize in chunks ------------------------------
def test_convert_touches_each_written_entry_a_bounded_number_of_times(tmp_path, monkeypatch):
    """The writer's entry table is scanned O(1) times per tensor, not once per tensor per
    tensor (which made 40k tensors per shard take minutes)."""
    n = 300
    w = msio.SafetensorsWriter(str(tmp_path / "m.safetensors"), {"format": "pt"})
    for i in range(n):
        w.add(f"layers.{i}.w.weight", torch.randn(2, 32))
    w.close()
    os.makedirs(tmp_path / "src")
    os.rename(tmp_path / "m.safetensors", tmp_path / "src" / "model.safetensors")
    visits = [0]

    class Counting(dict):
        def __iter__(self):
            visits[0] += len(self)
            return super().__iter__()

        def keys(self):
            visits[0] += len(self)
            return super().keys()

        def items(self):
            visits[0] += len(self)
            return super().items()

    orig = msio.SafetensorsWriter.__init__

    def init(self, *a, **k):
        orig(self, *a, **k)
        self._entries = Counting()

    monkeypatch.setattr(msio.SafetensorsWriter, "__init__", init)
    s = msio.convert(tmp_path / "src", tmp_path / "out", fmt="mxfp4", progress=False)
    assert len(s["quantized"]) == n
    assert visits[0] <= 4 * 2 * n, visits[0]  # 2 stored tensors per QTensor; quadratic would be ~n^2


@pytest.mark.parametrize("fmt,shape", [("nvfp4", (37, 96)), ("mxfp4", (3, 20, 64)), ("int4_affine_g32", (50, 100)),
                                       ("mxfp8_e4m3", (130, 64)), ("fp8_e4m3_block128x128", (256, 256)),
                                       ("fp8_e4m3_block128x128", (200, 256)), ("fp8_e4m3_block128", (5, 256))])
def test_chunked_dequantize_is_bit_identical(fmt, shape):
    from microscale.io.checkpoint import _dequantize_chunked

    if fmt not in ms.formats.registry:
        pytest.skip(f"no preset {fmt}")
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5)).bfloat16()
    q = ms.quantize(x, fmt, pad=True)
    for dt in (torch.bfloat16, torch.float32):
        want = q.dequantize(dt)
        got = _dequantize_chunked(q, dt, chunk=256)
        assert got.dtype == dt and got.shape == want.shape
        assert torch.equal(got.view(torch.int16 if dt == torch.bfloat16 else torch.int32),
                           want.view(torch.int16 if dt == torch.bfloat16 else torch.int32))


_DEQ_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r})
    def rss(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    import torch
    from microscale import io as msio
    msio.convert({warm_src!r}, {warm_dst!r}, dequantize=True, progress=False)  # imports and first-call caches
    base = rss("VmRSS")
    msio.convert({src!r}, {dst!r}, dequantize=True, dtype=torch.bfloat16, progress=False)
    print(json.dumps({{"base": base, "peak": rss("VmHWM")}}))
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_dequantize_peak_memory(tmp_path, make_checkpoint):
    """Dequantizing a 64 MiB (bf16) NVFP4 weight peaks near one output tensor, not 4-9."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4096, 8192, generator=g).bfloat16()
    nbytes = w.numel() * 2
    make_checkpoint(tmp_path / "f", {"model.safetensors": {"a.weight": w}}, index=False)
    del w
    msio.convert(tmp_path / "f", tmp_path / "q", fmt="nvfp4", progress=False)
    make_checkpoint(tmp_path / "wf", {"model.safetensors": {"a.weight": torch.randn(64, 64)}}, index=False)
    msio.convert(tmp_path / "wf", tmp_path / "wq", fmt="nvfp4", progress=False)
    code = _DEQ_CHILD.format(root=ROOT, src=str(tmp_path / "q"), dst=str(tmp_path / "d"),
                             warm_src=str(tmp_path / "wq"), warm_dst=str(tmp_path / "wd"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout.strip().splitlines()[-1])
    growth = m["peak"] - m["base"]
    assert growth <= 2.0 * nbytes, (growth / nbytes, m)  # output + quantized input + chunk temporaries


def test_inspect_walks_the_groups_a_bounded_number_of_times(tmp_path, monkeypatch):
    """inspect once looked every row's group up by a scan of all groups (quadratic)."""
    from microscale.io import checkpoint

    n = 200
    q = ms.quantize(torch.randn(2, 32), "mxfp4")
    msio.save({f"layers.{i}.weight": q for i in range(n)}, tmp_path / "ck")
    seen = [0]

    class Counting(list):
        def __iter__(self):
            for g in super().__iter__():
                seen[0] += 1
                yield g

    real = checkpoint.open_checkpoint

    def wrapped(*a, **k):
        ck = real(*a, **k)
        ck.groups = Counting(ck.groups)
        return ck

    monkeypatch.setattr(checkpoint, "open_checkpoint", wrapped)
    conv, rows = msio.inspect(tmp_path / "ck")
    assert conv == "native" and len(rows) == n and [r[0] for r in rows] == [f"layers.{i}.weight" for i in range(n)]
    assert seen[0] <= 4 * n, seen[0]


def test_dst_created_meanwhile_is_not_replaced(tmp_path, make_checkpoint):
    """Another program creating DST while the output is built keeps its DST."""
    src = _small(tmp_path, make_checkpoint)
    dst = tmp_path / "out"

    def create(name):
        dst.mkdir()
        (dst / "theirs.txt").write_text("theirs")

    with pytest.raises(FileExistsError, match="appeared"):
        msio.convert(src, dst, fmt="nvfp4", progress=False, on_tensor=create)
    assert os.listdir(dst) == ["theirs.txt"]
    assert [f for f in os.listdir(tmp_path) if ".partial-" in f] == []
