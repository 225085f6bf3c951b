"""The TMA-fed Gluon decode kernel (``linear.decode_tma``, 2-64 tokens) without a GPU.

Gluon kernels do not run under the Triton interpreter. What runs here: the step-major scale
repack against direct indexing, the host's choices and refusals, and the compile for sm_90a
(the codes land in the ``mma.sync`` operand layout without a data movement -- asserted at
compile time --, every operand by TMA, no spills). Its decode arithmetic is the prefill's
(``_prefill_gluon._decode``, emulated in ``test_prefill_gluon.py``). The GPU tests check the
kernel itself against float64.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

import microscale as ms
from microscale.linear.backends import decode_tma as dt
from microscale.linear import packed
from microscale.linear import routing
from microscale.runtime import target
from microscale.linear import tuning
from microscale.linear import weight_state as wst

pytest.importorskip("microscale.linear._kernels._decode_tma")
from microscale.linear._kernels import _ptx  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from sass import loop_counts  # noqa: E402


@pytest.mark.parametrize("rows", [128, 256])
@pytest.mark.parametrize("name,n", [("nvfp4", 300), ("mxfp4", 128)])
def test_step_scales_layout(name, n, rows, gen, monkeypatch):
    """Row tile ``t``, step ``s``: bytes ``[rows, 4]``, byte ``(r, j)`` = the scale of elements
    ``64 s + 16 j ..`` of row ``t rows + r`` (zero past the last row). The weight's TMA
    descriptors (codes, these scales) are made once per weight, tile height and version of its
    tensors, the heights kept side by side (each with its own table: ``_DT_ONE_TABLE`` off; with it
    on, both read the 256-row table, the 128-row tiles through a 4-d view)."""
    tuning.set_tuning(dt_one_table=False)
    k = 512
    q = ms.quantize(torch.randn(n, k, generator=gen), name)
    st = dt.step_scales(q, rows)
    sc = q.scales.view(torch.uint8)
    g = q.fmt.block_size
    tiles, steps = -(-n // rows), k // 64
    assert st.shape == (tiles * steps * rows // 64, 256) and st.dtype == torch.uint8
    t, s, r, j = torch.meshgrid(torch.arange(tiles), torch.arange(steps), torch.arange(rows), torch.arange(4),
                                indexing="ij")
    row = t * rows + r  # every byte by its formula: the scale of elements 64 s + 16 j.. of that row
    want = torch.where(row < n, sc[row.clamp(max=n - 1), (64 * s + 16 * j) // g], 0)
    assert torch.equal(st.reshape(tiles, steps, rows, 4), want.to(torch.uint8))
    other = dt.dt_weight_descs(q, wst.views(q), 384 - rows)
    descs = dt.dt_weight_descs(q, wst.views(q), rows)
    assert torch.equal(descs[1].base, st) and list(descs[1].block_shape) == [tuning.get().dt_sbox * rows // 64, 256]
    assert list(descs[0].block_shape) == [rows, 8 * tuning.get().dt_wide] and descs[0].base.dtype == torch.int32
    assert dt.dt_weight_descs(q, wst.views(q), rows) is descs  # kept on the weight
    assert dt.dt_weight_descs(q, wst.views(q), 384 - rows) is other  # (both heights)
    q.scales.view(torch.uint8).add_(0)  # an in-place change (its version) makes new ones
    assert dt.dt_weight_descs(q, wst.views(q), rows) is not descs
    tuning.set_tuning(dt_one_table=True)
    one = dt.dt_weight_descs(q, wst.views(q), rows)[1]
    assert torch.equal(one.base, dt.step_scales(q, 256)) and len(one.block_shape) == (4 if rows == 128 else 2)


def test_weight_caches_not_filled_while_capturing(monkeypatch, gen):
    """While a CUDA graph is captured, a weight's tables (views, decode_tma descriptors and
    step-major scales, the packed weight) are made for the call but not kept: their contents
    would only be written when that graph replays (here a capture is stood in for)."""
    q = ms.quantize(torch.randn(256, 512, generator=gen), "nvfp4")
    monkeypatch.setattr(wst, "capturing", lambda t: True)
    wv, hit = wst.views_hit(q)
    assert not hit and wst.views_hit(q)[0] is not wv
    d = dt.dt_weight_descs(q, wv)
    assert torch.equal(d[1].base, dt.step_scales(q, dt.dt_table_rows(q, tuning.get().dt_rows)))
    assert dt.dt_weight_descs(q, wv) is not d and not wst.kept_facts(q, "dt_descs")
    pw = packed.cached_prepare(q)
    assert packed.cached_prepare(q) is not pw and not wst.kept_facts(q, "packed")
    monkeypatch.setattr(wst, "capturing", lambda t: False)
    wv = wst.views(q)
    again, hit = wst.views_hit(q)
    assert again is wv and hit
    d = dt.dt_weight_descs(q, wv)
    assert dt.dt_weight_descs(q, wv) is d
    pw = packed.cached_prepare(q)
    assert packed.cached_prepare(q) is pw


@pytest.mark.parametrize("tiles, nct, programs", [(224, 32, 264), (64, 32, 264), (224, 32, 224), (3, 32, 5),
                                                (1, 4, 3), (7, 9, 13), (264, 32, 264), (5, 1, 5)])
def test_stream_k_shares(tiles, nct, programs):
    """The kernel's chunk arithmetic, emulated: program ``p`` takes chunks ``[p T // P,
    (p + 1) T // P)`` (every chunk exactly once, shares within one chunk of each other); a
    tile's parts are programs ``pf .. pl`` by the kernel's closed forms, in K order, so its
    workspace slots ``p - pf`` are below ``_dt_parts`` (the launch's bound), which is tight."""
    total = tiles * nct
    share = [(p * total // programs, (p + 1) * total // programs) for p in range(programs)]
    assert [c for a, b in share for c in range(a, b)] == list(range(total))
    assert max(b - a for a, b in share) - min(b - a for a, b in share) <= 1
    maxp = dt.dt_parts(tiles, nct, programs)
    worst = 0
    for t in range(tiles):
        owners = [p for p, (a, b) in enumerate(share) if a < (t + 1) * nct and b > t * nct]
        pf = ((t * nct + 1) * programs - 1) // total
        pl = ((t + 1) * nct * programs - 1) // total
        assert owners == list(range(pf, pl + 1))
        whole = share[pf][0] <= t * nct and share[pf][1] >= (t + 1) * nct
        assert whole == (pf == pl)  # the kernel's test for a whole tile: its chunks are one program's
        worst = max(worst, len(owners))
    assert maxp == worst


@pytest.mark.parametrize("n, k, sms, want", [
    (28672, 8192, 132, 224),  # 224 tiles: one each (two per SM on 92 SMs)
    (8192, 8192, 132, 256), (8192, 28672, 132, 256),  # 64 tiles in 4 parts
    (16896, 8192, 132, 132),  # one tile per SM
    (22528, 8192, 132, 264),  # 176 tiles: 44 SMs would run two, 88 one -> equal shares
    (10240, 8192, 132, 264),  # 80 tiles in 2 parts: 160 units, as uneven
    (57344, 8192, 132, 224),  # 448 tiles: two per program
    (1000, 512, 132, 16),  # 8 tiles, K has 2 chunks: 2 parts
    (256, 256, 132, 2)])  # never more programs than chunks
def test_choose_programs(n, k, sms, want):
    assert dt.choose_decode_tma_programs(n, k, sms) == want


def test_token_window():
    """2 tokens and up on large weights, ``DECODE_TMA_SMALL_MIN_M`` on smaller ones; 8-bit codes
    from ``DECODE_TMA_MIN_M_8BIT`` on any, 4-bit integers from ``DECODE_TMA_MIN_M_INT4`` (affine) or
    ``DECODE_TMA_MIN_M_INT4_SYM`` (signed)."""
    from types import SimpleNamespace as NS
    f4, f8 = ms.get_format("nvfp4"), ms.get_format("mxfp8_e4m3")
    assert dt.dt_min_m(NS(shape=(28672, 8192), fmt=f4)) == tuning.get().decode_tma_min_m == 2
    assert dt.dt_min_m(NS(shape=(8192, 8192), fmt=f4)) == tuning.get().decode_tma_small_min_m > 2
    assert dt.dt_min_m(NS(shape=(28672, 8192), fmt=f8)) == tuning.get().decode_tma_min_m_8bit == 4
    for name, least in (("int4_affine_g128", 3), ("int4_fp16", 4)):  # 4-bit integers: 2 (3) tokens on the GEMV
        i4 = ms.get_format(name)
        assert dt.dt_min_m(NS(shape=(28672, 8192), fmt=i4)) == least
        assert dt.dt_min_m(NS(shape=(8192, 8192), fmt=i4)) == tuning.get().decode_tma_small_min_m
    assert (tuning.get().decode_tma_min_m_int4, tuning.get().decode_tma_min_m_int4_sym) == (3, 4)


def test_post_scale_choice(monkeypatch):
    """The MMA results are scaled for integers with fp16 scales and one block per K step (blocks
    of 64 or more), at most 16 token columns; per pair otherwise or when switched off."""
    names = ("int4_affine_g128", "int4_affine_g64", "int4_affine_g32", "int4_fp16", "nvfp4", "int8_affine_g128",
             "int8_affine_g32", "int8_fp16", "mxint8", "mxfp8_e4m3")
    g128, *rest = (ms.quantize(torch.randn(8, 256), n) for n in names)
    signed = [ms.quantize(torch.randn(8, 256), n, block_size=128) for n in ("int4_fp16", "int8_fp16")]
    assert [dt.dt_post(q, 16) for q in [g128, *rest, *signed]] == [True, True, False, False, False, True, False,
                                                                   False, False, False, True, True]
    assert dt.dt_post(g128, 8) and not dt.dt_post(g128, 32) and not dt.dt_post(g128, 64)
    tuning.set_tuning(dt_post_scale=False)
    assert not dt.dt_post(g128, 16)


def test_token_columns():
    assert [dt.dt_tokens(m) for m in (1, 8, 9, 16, 17, 32, 33, 64)] == [8, 8, 16, 16, 32, 32, 64, 64]


@pytest.mark.parametrize("name,n,nps", [("int4_affine_g128", 300, 1), ("int4_affine_g64", 128, 1),
                                        ("int4_affine_g32", 300, 2), ("int4_fp16", 128, 2)])
def test_step_scales_layout_int4(name, n, nps, gen):
    """4-bit integers with fp16 scales: row tile ``t``, step ``s`` holds ``[nps, rows]`` int32,
    entry ``(j, r)`` the fp16 bits of the scale of elements ``64 s + 64 j / nps ..`` of row
    ``t rows + r`` | its zero point << 16 (8 for two's-complement codes; zero past the last row):
    as many bytes as the E2M1 formats' ``[rows, 4]`` for blocks of 64+, twice that for 32."""
    k, rows = 512, 128
    q = ms.quantize(torch.randn(n, k, generator=gen), name)
    assert dt.dt_nps(q) == nps
    st = dt.step_scales(q, rows)
    tiles, steps = -(-n // rows), k // 64
    assert st.shape == (tiles * steps * nps * rows // 64, 256) and st.dtype == torch.uint8
    t, s, j, r = torch.meshgrid(torch.arange(tiles), torch.arange(steps), torch.arange(nps), torch.arange(rows),
                                indexing="ij")
    row = (t * rows + r).clamp(max=n - 1)
    blk = (64 * s + 64 * j // nps) // q.fmt.block_size
    sc = q.scales.view(torch.int16)[row, blk].to(torch.int32) & 0xFFFF
    zp = q.zero_points[row, blk].to(torch.int32) if q.zero_points is not None else 8
    want = torch.where(t * rows + r < n, sc | (zp << 16), 0)
    assert torch.equal(st.view(torch.int32).reshape(tiles, steps, nps, rows), want)
    assert list(dt.dt_weight_descs(q, wst.views(q))[1].block_shape) == [tuning.get().dt_sbox * nps * rows // 64, 256]


def test_reasons(monkeypatch):
    q = ms.quantize(torch.randn(64, 512), "mxfp6_e2m3")
    x = torch.randn(16, 512).to(torch.bfloat16)
    with pytest.raises(ValueError, match="serves E2M1"):
        dt.decode_tma(x, q)
    q = ms.quantize(torch.randn(64, 512), "nvfp4")
    with pytest.raises(ValueError, match="Hopper"):  # float16 activations are served (the f16 decodes)
        dt.decode_tma(x.half(), q)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        dt.decode_tma(x.float(), q)
    with pytest.raises(ValueError, match="Hopper"):
        dt.decode_tma(x, q)
    for bad in (12, 8):  # not a tile width; fewer columns than tokens
        with pytest.raises(ValueError, match="tokens in"):
            dt.decode_tma(x, q, tokens=bad)
    monkeypatch.setattr(dt, "prefill_ws_reason", lambda q, x: None)  # as if on a Hopper
    assert dt.decode_tma_reason(q, x) is None
    assert dt.decode_tma_reason(q, torch.randn(64, 512).to(torch.bfloat16)) is None
    assert "1 to 64 tokens" in dt.decode_tma_reason(q, torch.randn(65, 512).to(torch.bfloat16))
    q = ms.quantize(torch.randn(64, 320), "nvfp4")
    assert "multiple of 256" in dt.decode_tma_reason(q, torch.randn(16, 320).to(torch.bfloat16))
    assert dt.decode_tma_reason(ms.quantize(torch.randn(64, 512), "int4_affine_g128"), x) is None
    assert dt.decode_tma_reason(ms.quantize(torch.randn(64, 512), "int4_affine_g32"), x) is None
    assert "blocks of 32 or" in dt.decode_tma_reason(ms.quantize(torch.randn(64, 512), "int4_fp16", block_size=16), x)
    q = ms.quantize(torch.randn(64, 512), "mxfp8_e4m3")  # 8-bit codes: up to 32 tokens (shared memory)
    assert dt.decode_tma_reason(q, torch.randn(32, 512).to(torch.bfloat16)) is None
    assert dt.dt_min_m(q) == tuning.get().decode_tma_min_m_8bit == 4  # (2-3 tokens: the GEMV)
    for name in ("mxint8", "int8_fp16", "int8_affine_g128", "int8_affine_g32"):  # 8-bit integers alike
        q8 = ms.quantize(torch.randn(64, 512), name)
        assert dt.decode_tma_reason(q8, torch.randn(32, 512).to(torch.bfloat16)) is None, name
        assert "1 to 32 tokens" in dt.decode_tma_reason(q8, torch.randn(33, 512).to(torch.bfloat16))
        assert dt.dt_min_m(q8) == tuning.get().decode_tma_small_min_m_int8 == 5  # (4 tokens on small weights: the GEMV)
        with tuning.override(decode_tma_eager_min_nk=64 * 512):  # as if a large weight
            assert dt.dt_min_m(q8) == 4 and dt.dt_min_m(q) == 4
    assert "blocks of 32 or" in dt.decode_tma_reason(ms.quantize(torch.randn(64, 512), "int8_fp16", block_size=16), x)
    tuning.set_tuning(decode_tma_8bit=False)
    assert "decode_tma_8bit" in dt.decode_tma_reason(q, x)
    tuning.set_tuning(decode_tma_8bit=True)
    assert "1 to 32 tokens with 8-bit" in dt.decode_tma_reason(q, torch.randn(33, 512).to(torch.bfloat16))


@pytest.mark.parametrize("fmt,n,m", [("nvfp4", 256, 16), ("mxfp4", 1000, 16), ("nvfp4", 1000, 5), ("nvfp4", 1000, 32),
                                     ("nvfp4", 1000, 64), ("int4_affine_g128", 1000, 16), ("int4_fp16", 1000, 16),
                                     ("int4_affine_g32", 1000, 64), ("mxfp8_e4m3", 1000, 16), ("mxfp8_e4m3", 264, 32),
                                     ("int8_fp16", 1000, 16), ("mxint8", 264, 32), ("mxint4", 1000, 16)])
def test_compiles_for_sm90_without_movement_or_spills(fmt, n, m, tmp_path, run_tool):
    """Compiled as ``decode_tma`` launches it: the code words reach the ``mma.sync`` operand
    with no layout conversion (``assert_trivial``: a failure would stop the compile), codes,
    scales and activations by TMA (no global loads in the K loop), activations by
    ``LDSM``, no spills up to 32 token columns (64 spill a little, measured and kept); the
    arrivals of tiles shared by programs are atomics; shared memory for two programs per SM."""
    r = run_tool("gemv_ptx.py", str(tmp_path), "--dtma", "--fmt", fmt, "--m", str(m), "--n", str(n), "--k", "1024",
                 "--config", "{'programs': 5}", "--sass",
                 "--set", "{'dt_warp_arrive': True, 'dt_one_table': False}")  # (the 128-row tile, own table)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Used 80 registers" in r.stdout, r.stdout[-2000:]
    smem = int(r.stdout.split("shared memory: ")[1].split()[0])
    assert smem <= (228 * 1024) // tuning.get().dt_per_sm - 1024, smem  # per SM 228 KB, 1 KB of it reserved per program
    sass = (tmp_path / "_decode_tma_kernel.sass").read_text()
    assert "UTMALDG.2D" in sass and "HMMA.16816.F32.BF16" in sass and "LDSM" in sass and "ATOMG" in sass
    if m <= 32:
        assert "0 bytes spill stores" in r.stdout and "STL" not in sass, r.stdout[-2000:]
    # per-warp slot release (kernels._ptx): no partition barrier before a ring wait, an arrive per warp,
    # the empty barriers counting the consumer warps
    ptx = (tmp_path / "_decode_tma_kernel.ptx").read_text()
    assert _ptx.MARKER in ptx and "%ms_lane0 mbarrier.arrive" in ptx
    assert not re.search(r"bar\.sync[^\n]*\n(\s*(//[^\n]*|\{|\.reg[^\n]*|waitLoop:|)\n)*\s*mbarrier\.try_wait", ptx)
    counts = re.findall(r"mbarrier\.init\.shared::cta\.b64 \[%r\d+\], (\d+);", ptx)
    assert counts and sorted(set(counts)) == ["1", "8"] and counts.count("1") == counts.count("8"), counts
    k_loop = min((lp for lp in loop_counts(sass) if lp["hist"].get("HMMA", 0)), key=lambda lp: lp["count"])
    assert "BAR" not in k_loop["hist"] and "SYNCS" in k_loop["hist"], k_loop


@pytest.mark.parametrize("fmt,m", [("nvfp4", 16), ("mxfp4", 16), ("nvfp4", 8), ("nvfp4", 64)])
def test_two_slice_tile_compiles(fmt, m, tmp_path, run_tool):
    """The 256-row tile (``rows=256``): 8 consumer warps of two 16-row slices, one program per SM at 160
    registers, no spills; each warp's activation fragments serve both slices (4 ``HMMA`` per ``LDSM`` in the
    K loop, against 2 with one slice per warp); the empty barriers count the 8 warps. A shared tile's later
    parts signal by reductions (no value back, no ``ATOMG``) and its first program polls for them."""
    r = run_tool("gemv_ptx.py", str(tmp_path), "--dtma", "--fmt", fmt, "--m", str(m), "--n", "1000", "--k", "1024",
                 "--config", "{'programs': 3, 'rows': 256}", "--sass", "--set", "{'dt_warp_arrive': True}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Used 160 registers" in r.stdout and "0 bytes spill stores" in r.stdout, r.stdout[-2000:]
    smem = int(r.stdout.split("shared memory: ")[1].split()[0])
    assert smem <= 227 * 1024, smem
    sass = (tmp_path / "_decode_tma_kernel.sass").read_text()
    assert "UTMALDG.2D" in sass and "REDG.E.ADD.STRONG.GPU" in sass and "LDG.E.STRONG.GPU" in sass
    assert "ATOMG" not in sass
    k_loop = min((lp for lp in loop_counts(sass) if lp["hist"].get("HMMA", 0)), key=lambda lp: lp["count"])
    assert k_loop["hist"]["HMMA"] == 4 * k_loop["hist"]["LDSM"], k_loop
    assert "BAR" not in k_loop["hist"] and "LDG" not in k_loop["hist"], k_loop
    ptx = (tmp_path / "_decode_tma_kernel.ptx").read_text()
    counts = re.findall(r"mbarrier\.init\.shared::cta\.b64 \[%r\d+\], (\d+);", ptx)
    assert sorted(set(counts)) == ["1", "8"], counts


def test_two_slice_tile_without_waits_beyond_residency(tmp_path, run_tool):
    """More 256-row programs than fit at once (9 on the 8 "SMs" the CPU stand-in reports, one per SM): a
    first program waiting for a later one could hold the SM that one needs, so the last part to arrive adds
    the parts (atomics with a value back, no polling loop). K 2048: 4 tiles x 2 ring chunks of 8 steps would cap
    the grid at 8."""
    r = run_tool("gemv_ptx.py", str(tmp_path), "--dtma", "--fmt", "nvfp4", "--m", "16", "--n", "1000", "--k", "2048",
                 "--config", "{'programs': 9, 'rows': 256}", "--sass", "--set", "{'dt_warp_arrive': True}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "0 bytes spill stores" in r.stdout, r.stdout[-2000:]
    sass = (tmp_path / "_decode_tma_kernel.sass").read_text()
    assert "ATOMG" in sass and "REDG" not in sass and "LDG.E.STRONG.GPU" not in sass


def test_ring_of_the_two_slice_tile(monkeypatch):
    """256-row tiles take 8-step ring chunks in 2 stages up to 16 token columns where K is a multiple of 512
    (4-bit codes); elsewhere 4-step chunks in as many stages as shared memory holds;
    ``_DT_BIG_CHUNK_MAX_TOK = 0`` turns the longer chunks off."""
    big = tuning.get().dt_tile_big[0]
    assert dt.dt_ring(big, 16, 8192, 4) == (8, 2) and dt.dt_ring(big, 8, 512, 4) == (8, 2)
    assert dt.dt_ring(big, 32, 8192, 4) == (4, 3) and dt.dt_ring(big, 64, 8192, 4) == (4, 2)
    assert dt.dt_ring(big, 16, 768, 4) == (4, 3)
    assert dt.dt_ring(128, 16, 8192, 4) == (4, 3) and dt.dt_ring(128, 64, 8192, 4) == (4, 2)
    assert dt.dt_ring(128, 16, 8192, 8) == (4, 2)
    assert dt.choose_decode_tma_programs(28672, 8192, 132, 256, 1, 8) == 112  # whole tiles either way
    tuning.set_tuning(dt_big_chunk_max_tok=0)
    assert dt.dt_ring(big, 8, 8192, 4) == (4, 3)


def test_two_slice_tile_choice(monkeypatch):
    """``_dt_tile``: the 256-row tile for E2M1 weights and bf16 activations (every token count) when one
    256-row tile per SM keeps 80-100% of the SMs busy (28672 rows on 132 SMs); the 128-row tile otherwise;
    its programs: whole tiles, or one equal share per SM where whole tiles would leave SMs idle;
    ``rows=256`` is refused for other formats and fp16 activations, other heights always."""
    monkeypatch.setattr(target, "num_sms", lambda device: 132)
    x = torch.zeros(16, 256, dtype=torch.bfloat16)
    big = ms.quantize(torch.randn(28672, 256), "nvfp4")
    assert dt.dt_tile(big, x) == tuning.get().dt_tile_big == (256, 2, 1, 160)
    assert dt.dt_tile(big, x[:3]) == dt.dt_tile(big, torch.zeros(64, 256, dtype=torch.bfloat16))  # any token count
    assert dt.choose_decode_tma_programs(28672, 8192, 132, 256, 1) == 112  # whole tiles
    assert dt.choose_decode_tma_programs(34048, 8192, 132, 256, 1) == 132  # 133 tiles: equal shares, no idle SMs
    assert dt.choose_decode_tma_programs(57344, 8192, 132, 256, 1) == 112  # two whole tiles each (85% of the SMs)
    small = ms.quantize(torch.randn(8192, 256), "mxfp4")
    assert dt.dt_tile(small, x)[0] == 128  # (and so for every token count: one scale table per weight)
    assert dt.dt_tile(big, x.half())[0] == 128
    assert dt.dt_tile(ms.quantize(torch.randn(28672, 256), "int4_affine_g128"), x)[0] == 128
    assert dt.dt_tile(ms.quantize(torch.randn(34048, 256), "nvfp4"), x)[0] == 128  # 133 tiles: two waves
    monkeypatch.setattr(dt, "decode_tma_reason", lambda q, x: None)  # (the device checks)
    for q, xx, rows in ((small, x.half(), 256), (ms.quantize(torch.randn(64, 256), "mxfp8_e4m3"), x, 256),
                        (small, x, 64)):
        with pytest.raises(ValueError, match="rows="):
            dt.decode_tma(xx, q, rows=rows)


@pytest.mark.parametrize("name,n", [("nvfp4", 300), ("mxfp4", 520), ("nvfp4", 128)])
def test_one_table_serves_both_heights(name, n, gen):
    """``_DT_ONE_TABLE``: the 4-d view the 128-row tiles read of the 256-row step-major table
    (``[tiles256 x steps, half, 2, 256]``, strides 1024 / 512 / 256 / 1, as ``_dt_weight_descs`` builds
    it) holds, at ``(tile // 2) * steps + step, tile % 2``, the bytes of the 128-row table's box of that
    tile and step (odd tile counts included: the 256-row table's padding rows)."""
    k = 512
    steps = k // 64
    q = ms.quantize(torch.randn(n, k, generator=gen), name)
    t128, t256 = dt.step_scales(q, 128), dt.step_scales(q, 256)
    view = t256.as_strided((t256.shape[0] // 4, 2, 2, 256), (1024, 512, 256, 1))
    for t in range(-(-n // 128)):
        for s in range(steps):
            row = (t * steps + s) * 2
            assert torch.equal(view[(t // 2) * steps + s, t % 2], t128[row:row + 2]), (t, s)
    assert not torch.equal(view[0, 1], view[0, 0]) or n <= 128  # (the halves differ: the check can fail)


def test_one_table_routing(monkeypatch):
    """With ``_DT_ONE_TABLE`` (the default) an E2M1 weight's 128-row tiles read the 256-row table, and
    33-64 tokens take 256-row tiles on every E2M1 weight with bf16 activations, 9-32 where K >= 2 N (fewer
    tokens keep the weight's own tile); other formats keep their own table and tile."""
    monkeypatch.setattr(target, "num_sms", lambda device: 132)
    tuning.set_tuning(dt_one_table=True)
    small = ms.quantize(torch.randn(8192, 256), "nvfp4")
    x = torch.zeros(16, 256, dtype=torch.bfloat16)
    assert dt.dt_tile(small, x)[0] == 128 and dt.dt_table_rows(small, 128) == 256
    assert dt.dt_tile(small, torch.zeros(33, 256, dtype=torch.bfloat16)) == tuning.get().dt_tile_big
    assert dt.dt_tile(small, torch.zeros(32, 256, dtype=torch.bfloat16))[0] == 128
    assert dt.dt_tile(small, torch.zeros(64, 256, dtype=torch.float16))[0] == 128
    deep = ms.quantize(torch.randn(128, 256), "nvfp4")  # K = 2 N
    assert [dt.dt_tile(deep, torch.zeros(m, 256, dtype=torch.bfloat16))[0] for m in (1, 8, 9, 16, 32, 64)] == \
        [128, 128, 256, 256, 256, 256]
    assert dt.dt_tile(deep, torch.zeros(16, 256, dtype=torch.float16))[0] == 128
    assert dt.dt_tile(ms.quantize(torch.randn(129, 256), "nvfp4"), x)[0] == 128  # K < 2 N
    i4 = ms.quantize(torch.randn(8192, 256), "int4_affine_g128")
    assert dt.dt_table_rows(i4, 128) == 128 and dt.dt_tile(i4, torch.zeros(64, 256, dtype=torch.bfloat16))[0] == 128
    tuning.set_tuning(dt_one_table=False)
    assert dt.dt_table_rows(small, 128) == 128
    assert dt.dt_tile(small, torch.zeros(64, 256, dtype=torch.bfloat16))[0] == 128
    assert dt.dt_tile(deep, x)[0] == 128


@pytest.mark.parametrize("m", [8, 32])
def test_one_table_compiles(m, tmp_path, run_tool):
    """The 128-row kernel on the 256-row table (``tuning.dt_one_table``) compiles for sm_90 with its
    scale boxes by 4-d TMA (the codes and activations by 2-d), no spills; without the switch, 2-d only
    (1-32 tokens: from 33 the switch takes 256-row tiles, on their own table)."""
    def sass(tune):
        r = run_tool("gemv_ptx.py", str(tmp_path), "--dtma", "--fmt", "nvfp4", "--m", str(m), "--n", "1000",
                     "--k", "1024", "--config", "{'programs': 5}", "--sass", "--set", repr(tune))
        assert r.returncode == 0, r.stderr[-2000:]
        assert "0 bytes spill stores" in r.stdout, r.stdout[-2000:]
        return (tmp_path / "_decode_tma_kernel.sass").read_text()

    on = sass({"dt_one_table": True})
    assert "UTMALDG.4D" in on and "UTMALDG.2D" in on
    assert "UTMALDG.4D" not in sass({"dt_one_table": False})


@pytest.mark.parametrize("post", [True, False])
def test_int4_post_scale_compiles_without_bf16_scaling(post, tmp_path, run_tool):
    """int4_affine_g128 (one block per K step), 16 token columns: with the post-MMA scale the K loop has no bf16
    scale multiply (``HMUL2`` / ``HFMA2``) and one ``FFMA`` per accumulator element and step;
    with ``tuning.dt_post_scale`` off the per-pair scaling comes back (so the check can fail)."""
    r = run_tool("gemv_ptx.py", str(tmp_path), "--dtma", "--fmt", "int4_affine_g128", "--m", "16", "--n", "1000",
                 "--k", "1024", "--config", "{'programs': 5}", "--sass",
                 "--set", repr({"dt_post_scale": post}))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "0 bytes spill stores" in r.stdout, r.stdout[-2000:]
    sass = (tmp_path / "_decode_tma_kernel.sass").read_text()
    assert ("HMUL2" in sass) == (not post) and ("FFMA" in sass) == post


def _gpu():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU (sm_90)")
    return torch.device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Hopper)")
@pytest.mark.parametrize("name,post", [("nvfp4", True), ("mxfp4", True), ("int4_affine_g128", True),
                                       ("int4_affine_g128", False), ("int4_affine_g64", True),
                                       ("int4_affine_g32", True), ("int4_fp16", True), ("int4_fp16@128", True),
                                       ("mxfp8_e4m3", True), ("mxint8", True), ("int8_fp16", True),
                                       ("int8_fp16@128", True), ("int8_affine_g128", True),
                                       ("int8_affine_g128", False), ("int8_affine_g32", True),
                                       ("mxfp8_e5m2", True), ("mxint4", True), ("nvfp4/256", True),
                                       ("mxfp4/256", True), ("nvfp4/own", True), ("mxfp4/own", True)])
def test_gpu_decode_tma(name, post, monkeypatch):
    """The kernel on an H200: 1-64 tokens (8, 16, 32 and 64 token columns), ragged rows, bias,
    whole tiles and tiles shared by 2-5 programs (stream-K shares), one program for all; each
    output element within bf16 rounding of float64 plus an fp32 accumulation bound, a second
    call bit-identical (parts added in a fixed order, counters left at zero). Integers with fp16
    scales and one block per K step scale the MMA result (``post``: against the exact weights),
    or with ``tuning.dt_post_scale`` off each pair (against the bf16-rounded weights; 8-bit
    integers within 2^-15 of a rounding tie may take the other neighbour: a looser bound).
    ``name@B``: the format with blocks of ``B``; ``name/256``: the 256-row tile of two row slices per warp;
    E2M1 weights by default read one 256-row scale table (``_DT_ONE_TABLE``: 128-row tiles through a 4-d view,
    256-row tiles at 33-64 tokens or where K >= 2 N); ``name/own``: that switch off (each height its own table)."""
    dev = _gpu()
    tuning.set_tuning(dt_post_scale=post)
    if name.endswith("/own"):
        tuning.set_tuning(dt_one_table=False)
        name = name[:-4]
    g = torch.Generator(device=dev).manual_seed(12)
    cases = [(16, 1000, 2048, None), (9, 300, 1024, 3), (16, 4096, 8192, None), (1, 520, 4096, 5),
             (13, 3000, 4096, 50), (16, 256, 256, 1), (16, 28672, 1024, 264), (11, 1000, 2048, 13),
             (17, 1000, 2048, None), (32, 4096, 8192, None), (29, 3000, 4096, 50), (33, 520, 4096, 5),
             (64, 1000, 2048, 13), (48, 28672, 1024, 264), (64, 256, 256, 1), (8, 1000, 2048, None),
             (3, 300, 1024, 3), (5, 28672, 1024, 264), (8, 4096, 8192, None), (2, 3000, 4096, 50)]
    name, _, rows = name.partition("/")
    fmt, _, block = name.partition("@")
    kw = {"block_size": int(block)} if block else {}
    for (m, n, k, programs) in cases:
        if ms.get_format(fmt).element.bits == 8 and m > tuning.get().decode_tma_max_m_8bit:
            continue
        q = ms.quantize(torch.randn(n, k, device=dev, generator=g), fmt, **kw)
        wd = q.dequantize(torch.float64)
        tol = 2.0 ** -16
        if q.fmt.scale.name == "fp16" and not dt.dt_post(q, dt.dt_tokens(m)):
            wd = wd.to(torch.bfloat16).double()  # the per-pair decode rounds (code - z) * s once to bf16
            tol = 2.0 ** -12 if q.fmt.element.bits == 8 else tol
        x = (torch.randn(m, k, device=dev, generator=g) * 2).to(torch.bfloat16)
        bias = torch.randn(n, device=dev, generator=g)
        kw_t = {"programs": programs, "rows": int(rows) if rows else None}
        out = dt.decode_tma(x, q, bias, **kw_t)
        assert torch.equal(out, dt.decode_tma(x, q, bias, **kw_t))
        ref = x.double() @ wd.T + bias.double()
        cond = x.double().abs() @ wd.abs().T + bias.double().abs()
        assert out.dtype == torch.bfloat16 and out.shape == (m, n) and torch.isfinite(out).all()
        assert ((out.double() - ref).abs() <= 2.0 ** -8 * ref.abs() + tol * cond).all(), (m, n, k, programs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Hopper)")
def test_gpu_routing_and_graph(monkeypatch):
    """``ms.linear`` routes 4-64 tokens (leading batch dims) on a small weight here while a CUDA
    graph is captured (``graph``; the default ``auto`` also takes eager calls on large weights),
    also eager calls with ``1``; 2 and 65 tokens elsewhere; the captured route replays; a bad program
    count is refused."""
    dev = _gpu()
    g = torch.Generator(device=dev).manual_seed(7)
    q = ms.quantize(torch.randn(512, 1024, device=dev, generator=g), "nvfp4")
    tuning.set_tuning(decode_tma="graph")
    calls = []
    real = routing.decode_tma_run
    monkeypatch.setattr(routing, "decode_tma_run", lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))
    x = torch.randn(2, 6, 1024, device=dev, generator=g).to(torch.bfloat16)
    ms.linear(x, q)
    assert calls == []  # eager: gemv_mma
    tuning.set_tuning(decode_tma="always")
    y = ms.linear(x, q)
    assert calls == [12]
    torch.testing.assert_close(y, real(x.reshape(12, 1024), q).reshape(2, 6, 512), rtol=0, atol=0)
    ms.linear(x[:, :1], q)  # 2 tokens on a small weight: the GEMV
    assert calls == [12]
    y8 = ms.linear(x[:, :4], q)  # 8 tokens: 8 token columns
    assert calls == [12, 8]
    torch.testing.assert_close(y8, real(x[:, :4].reshape(8, 1024), q).reshape(2, 4, 512), rtol=0, atol=0)
    x40 = torch.randn(40, 1024, device=dev, generator=g).to(torch.bfloat16)  # 64 token columns
    torch.testing.assert_close(ms.linear(x40, q), real(x40, q), rtol=0, atol=0)
    ms.linear(torch.randn(65, 1024, device=dev, generator=g).to(torch.bfloat16), q)
    assert calls == [12, 8, 40]
    tuning.set_tuning(decode_tma="graph")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = ms.linear(x, q)
    assert calls == [12, 8, 40, 12]
    x.copy_(torch.randn(2, 6, 1024, device=dev, generator=g).to(torch.bfloat16))
    graph.replay()
    torch.testing.assert_close(yg, real(x.reshape(12, 1024), q).reshape(2, 6, 512), rtol=0, atol=0)
    with pytest.raises(ValueError, match="programs"):
        real(x[0], q, programs=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Hopper)")
def test_gpu_eager_auto_routes(monkeypatch):
    """Default ``auto``, eager calls with plans: a weight of ``DECODE_TMA_EAGER_MIN_NK``
    elements takes :func:`decode_tma` from 2 tokens (its plan replays bit-identical to the
    kernel called directly, with bound launches), not at 1; a smaller weight not at 8 tokens."""
    dev = _gpu()
    g = torch.Generator(device=dev).manual_seed(8)
    tuning.set_tuning(decode_tma="auto")
    big = ms.quantize(torch.randn(tuning.get().decode_tma_eager_min_nk // 8192, 8192, device=dev, generator=g), "nvfp4")
    small = ms.quantize(torch.randn(1024, 8192, device=dev, generator=g), "mxfp4")
    calls = []
    real = routing.decode_tma_run
    monkeypatch.setattr(routing, "decode_tma_run", lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))
    for m in (2, 8):
        for _ in range(4):  # marked, recorded, then replayed
            x = torch.randn(m, 8192, device=dev, generator=g).to(torch.bfloat16)
            torch.testing.assert_close(ms.linear(x, big), real(x, big), rtol=0, atol=0)
        assert calls == [m, m]
        calls.clear()
    ms.linear(torch.randn(1, 8192, device=dev, generator=g).to(torch.bfloat16), big)
    ms.linear(torch.randn(8, 8192, device=dev, generator=g).to(torch.bfloat16), small)
    assert calls == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Hopper)")
def test_gpu_graphs_make_their_own_tables(monkeypatch):
    """A weight first used inside a CUDA graph capture: each graph makes the weight's
    step-major scales itself, so a second graph replayed alone (the first never replayed)
    and eager calls after the captures are right. An eager call in the kernel's token range that takes
    another kernel makes the tables ahead, so a graph captured later finds them."""
    dev = _gpu()
    g = torch.Generator(device=dev).manual_seed(11)
    tuning.set_tuning(decode_tma="graph")
    real = routing.decode_tma_run
    q = ms.quantize(torch.randn(512, 1024, device=dev, generator=g), "nvfp4")
    x12 = torch.randn(12, 1024, device=dev, generator=g).to(torch.bfloat16)
    x10 = torch.randn(10, 1024, device=dev, generator=g).to(torch.bfloat16)
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        ms.linear(x12, q)
    assert not wst.kept_facts(q, "dt_descs")
    with torch.cuda.graph(g2):
        y10 = ms.linear(x10, q)
    g2.replay()  # g1 never replayed
    want = x10.double() @ ms.dequantize(q).double().T
    assert ((y10.double() - want).norm() / want.norm()).item() < 1e-2
    tuning.set_tuning(decode_tma="always")
    want = x12.double() @ ms.dequantize(q).double().T
    assert ((ms.linear(x12, q).double() - want).norm() / want.norm()).item() < 1e-2
    q2 = ms.quantize(torch.randn(512, 1024, device=dev, generator=g), "mxfp4")
    tuning.set_tuning(decode_tma="graph")
    ms.linear(x12, q2)  # eager: gemv_mma, and the decode_tma tables for later captures
    assert wst.kept_facts(q2, "dt_descs")
    made = []  # step-major scale tables made while capturing (they would be remade at every replay)
    step_scales = dt.step_scales
    monkeypatch.setattr(dt, "step_scales", lambda q, rows: made.append(rows) or step_scales(q, rows))
    g3 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g3):
        y12 = ms.linear(x12, q2)
    assert not made, made
    g3.replay()
    torch.testing.assert_close(y12, real(x12, q2), rtol=0, atol=0)
    monkeypatch.setattr(target, "num_sms", lambda device: 2)  # 512 rows: two 256-row tiles fill the "SMs"
    q3 = ms.quantize(torch.randn(512, 1024, device=dev, generator=g), "nvfp4")
    ms.linear(x12, q3)  # eager: the 256-row table ahead
    assert dt.dt_tile(q3, x12) == tuning.get().dt_tile_big and made == [256] and 256 in [p[0] for p in wst.kept_facts(q3, "dt_descs")]
    made.clear()
    g4 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g4):
        y3 = ms.linear(x10, q3)
    assert not made, made
    g4.replay()
    want = x10.double() @ ms.dequantize(q3).double().T
    assert ((y3.double() - want).norm() / want.norm()).item() < 1e-2


def test_routing_switch(monkeypatch):
    """``tuning.decode_tma``: ``always``, ``never``; ``graph`` while capturing;
    ``auto`` also eager calls on CUDA from ``DECODE_TMA_EAGER_MIN_M`` tokens on weights of at
    least ``DECODE_TMA_EAGER_MIN_NK`` elements, or more than 16 tokens, while call plans are on
    (graphs: from ``_dt_min_m`` tokens); never for CPU tensors otherwise."""
    from types import SimpleNamespace as NS

    f4 = ms.get_format("nvfp4")
    big, small = NS(shape=(28672, 8192), fmt=f4), NS(shape=(8192, 8192), fmt=f4)
    small_int4 = NS(shape=(8192, 8192), fmt=ms.get_format("int4_affine_g128"))  # no gemv_mma: 5-16 tokens too
    bf = torch.bfloat16
    gpu, cpu = NS(is_cuda=True, dtype=bf, shape=(16, 8192), numel=lambda: 16 * 8192), NS(is_cuda=False)
    gpu32 = NS(is_cuda=True, dtype=bf, shape=(32, 8192), numel=lambda: 32 * 8192)  # past gemv_mma: no size limit
    gpu8 = NS(is_cuda=True, dtype=bf, shape=(8, 8192), numel=lambda: 8 * 8192)  # eager: large weights only
    gpu8h = NS(is_cuda=True, dtype=torch.float16, shape=(8, 8192), numel=lambda: 8 * 8192)  # gemv_mma has no fp16
    gpu4h = NS(is_cuda=True, dtype=torch.float16, shape=(4, 8192), numel=lambda: 4 * 8192)  # the GEMV's
    gpu1 = NS(is_cuda=True, dtype=bf, shape=(1, 8192), numel=lambda: 8192)  # eager: below DECODE_TMA_EAGER_MIN_M
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])

    def wanted(mode, x, q, plans=True):
        tuning.set_tuning(decode_tma=mode)
        tuning.set_tuning(plans=plans)
        return routing.decode_tma_wanted(x, q)

    assert wanted("always", cpu, small) and not wanted("never", gpu, big)
    assert [wanted(m, gpu, q) for m in ("graph", "auto") for q in (big, small)] == [False, False, True, False]
    assert not wanted("auto", gpu, big, plans=False) and not wanted("auto", cpu, big)
    assert wanted("auto", gpu32, small) and not wanted("auto", gpu32, small, plans=False)
    assert not wanted("graph", gpu32, small) and not wanted("never", gpu32, big)
    assert wanted("auto", gpu8, big) and not wanted("auto", gpu8, small) and wanted("always", gpu8, small)
    assert wanted("auto", gpu8h, small) and not wanted("auto", gpu4h, small)
    assert not wanted("auto", gpu1, big) and tuning.get().decode_tma_eager_min_m > 1
    assert wanted("auto", gpu8, small_int4) and not wanted("auto", gpu8, small_int4, plans=False)
    assert not wanted("auto", NS(is_cuda=True, dtype=bf, shape=(4, 8192), numel=lambda: 4 * 8192), small_int4)  # the GEMV's
    capturing[0] = True
    assert wanted("graph", gpu, small) and wanted("auto", gpu, small) and not wanted("never", gpu, big)
    assert wanted("auto", gpu8, big) and wanted("graph", gpu8, small)
    assert big.shape[0] * big.shape[1] >= tuning.get().decode_tma_eager_min_nk > small.shape[0] * small.shape[1]
