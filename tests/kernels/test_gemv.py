"""Decode-path GEMV on the canonical weight layout, against float64 math.

Under TRITON_INTERPRET=1 the plain-Triton twin of the PTX decode runs; on a GPU machine
the same tests run on CUDA tensors, the PTX path too (the benchmark suite checks it at real
shapes). The PTX text is checked here for the pieces the twin cannot see (shifts,
masks, operand numbering).
"""
import pytest
import torch

import microscale as ms
from microscale.linear.backends import gemv as gv
from microscale.runtime import target
from microscale.linear import tuning
from microscale.formats import registry
from microscale.linear._kernels import _gemv_kernels as kern
from microscale.linear.backends.gemv import GemvConfig
from microscale.linear.eligibility import gemv_kind as _gemv_kind
from microscale.linear.backends.gemv import gemv

SUPPORTED = [n for n, f in registry.items() if _gemv_kind(f) is not None and f.block_rows == 1]
DEV = "cuda" if torch.cuda.is_available() else "cpu"
ASM = [False, True] if DEV == "cuda" else [False]  # the PTX decode needs the GPU


def rel(a, b):
    return float((a.double().cpu() - b.cpu()).norm() / b.norm())


def test_supported_covers_every_kind():
    kinds = {_gemv_kind(registry[n]) for n in SUPPORTED}
    assert kinds == {kern.F4, kern.E4M3, kern.E5M2, kern.I8, kern.I4, kern.U8Z, kern.U4Z}
    assert "mxfp6_e2m3" not in SUPPORTED and "int4_affine_g128" in SUPPORTED


@pytest.mark.parametrize("asm", ASM)
@pytest.mark.parametrize("name", SUPPORTED)
@pytest.mark.parametrize("m,split,tokens", [(1, 1, 0), (3, 2, 0), (5, 1, 2)])
def test_gemv_matches_float64(name, m, split, tokens, asm, gen):
    n, k = 40, 256
    w = torch.randn(n, k, generator=gen)
    q = ms.quantize(w, name)
    x = (torch.randn(m, k, generator=gen) * 3).to(torch.bfloat16)
    x[0, :8] = 0.0  # a zero run, and a tiny value far below the row max
    x[0, 9] = 1e-6
    bias = torch.randn(n, generator=gen)
    ref = x.double() @ q.dequantize(torch.float64).T + bias.double()
    words = q.fmt.block_size * q.fmt.element.bits // 32
    cfg = GemvConfig(block_n=16, block_kw=max(16, words), split_k=split, tokens=tokens)
    out = gemv(x.to(DEV), q.to(DEV), bias.to(DEV), cfg, use_asm=asm)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    assert not torch.isnan(out).any()
    assert rel(out, ref) < 1e-2


@pytest.mark.parametrize("asm", ASM)
@pytest.mark.parametrize("name", SUPPORTED)
def test_gemv_default_config_matches_float64(name, asm, gen, monkeypatch):
    """The configuration ``gemv`` picks by itself for one and two tokens (2 rows per program
    on a short weight, 4 on a tall one; the next step's loads issued early, for two tokens
    only with 4-bit codes; one warp per program for 8-bit codes at one token on a short
    weight, with 512-word steps on long rows), against float64. The height that counts as
    tall is lowered to 32 rows so that the interpreter runs both on small weights."""

    tuning.set_tuning(gemv_programs_per_sm=1)
    monkeypatch.setattr(target, "num_sms", lambda device: 8)
    try:
        bits = registry[name].element.bits
        for n, rows in ((24, 2), (40, 4)):
            k = 256
            for m in (1, 2):
                c = gv.choose_gemv_config(n, k, torch.device(DEV), m, bits)
                want = (rows, True) if m == 1 or bits == 4 else (4, False)
                assert (c.block_n, c.prefetch) == want, (m, c)
                assert c.num_warps == (1 if (m, bits, rows) == (1, 8, 2) else 2), (m, c)
                q = ms.quantize(torch.randn(n, k, generator=gen), name)
                x = (torch.randn(m, k, generator=gen) * 3).to(torch.bfloat16)
                ref = x.double() @ q.dequantize(torch.float64).T
                out = gemv(x.to(DEV), q.to(DEV), None, use_asm=asm)
                assert out.shape == (m, n) and rel(out, ref) < 1e-2, (n, m, rows)
        steps = [gv.choose_gemv_config(24, 32 * kw // bits, torch.device(DEV), 1, bits).block_kw for kw in (2048, 4096)]
        assert steps == ([256, 512] if bits == 8 else [256, 256]), steps
    finally:
        tuning.reset()  # (the config cache keys on the tuning and target facts: nothing stale)


@pytest.mark.parametrize("name", ["nvfp4", "mxfp8_e4m3", "int8_fp16", "mxfp8_e5m2", "int8_affine_g32"])
def test_gemv_large_activations_do_not_overflow(name, gen):
    q = ms.quantize(torch.randn(16, 256, generator=gen), name)
    x = (torch.randn(1, 256, generator=gen) * 3e4).to(torch.bfloat16)  # f16 would overflow unscaled
    ref = x.double() @ q.dequantize(torch.float64).T
    out = gemv(x.to(DEV), q.to(DEV), None, GemvConfig(block_n=16, block_kw=32), use_asm=False)
    assert torch.isfinite(out).all() and rel(out, ref) < 1e-2


def test_gemv_ragged_rows_and_fp16(gen):
    q = ms.quantize(torch.randn(37, 256, generator=gen), "mxfp4")
    x = torch.randn(2, 256, generator=gen).to(torch.float16)
    out = gemv(x.to(DEV), q.to(DEV), None, GemvConfig(block_n=8, block_kw=16), use_asm=False)
    assert out.dtype == torch.float16 and out.shape == (2, 37)
    assert rel(out, x.double() @ q.dequantize(torch.float64).T) < 1e-2


def test_x_exponent_bounds_the_chain():
    # worst case of a chain: products per f16 lane x max |pair value| x 2^XE < 65504
    for kind, wmax in kern._WMAX.items():
        for chain in (1, 2, 4):
            xe = kern.x_exponent(kind, chain)
            per_lane = chain * (8 if kern.XREGS[kind] == 4 else 4) // 2
            assert per_lane * wmax * 2.0**xe < 65504 and 2.0**xe <= 2.0**15
    # nvfp4: two chains, each times an E4M3 scale (<= 448), summed in f16
    xe = kern.x_exponent(kern.F4, 2, 2 * 448.0)
    assert 2 * (8 * kern._WMAX[kern.F4] * 448.0) * 2.0**xe < 65504


def test_asm_text():
    a = kern.word_asm(kern.F4, 1, tokens=1)
    assert "shl.b32 m, $1, 9;" in a and "shl.b32 m, $1, 5;" in a and "shl.b32 m, $1, 1;" in a
    assert "shr.u32 m, $1, 3;" in a and hex((7 << 9) | (7 << 25)) in a and "$5" in a and "$6" not in a
    assert a.count("fma.rn.f16x2") == 3 and a.count("mul.rn.f16x2") == 1
    a = kern.word_asm(kern.E4M3, 3, tokens=2)
    assert a.count("cvt.rn.f16x2.e4m3x2") == 2 and a.count("fma.rn.f16x2") + a.count("mul.rn.f16x2") == 4
    assert "$6" in a and "$7" not in a  # 2 outputs + 1 word + 2 tokens x 2 activation pairs
    assert kern.word_constraints(kern.E4M3, 2) == "=r,=r,r,r,r,r,r"
    a = kern.word_asm(kern.I8, 0, tokens=1)
    assert "0x64806480" in a and "0x4140" in a and "0x4342" in a
    a = kern.word_asm(kern.U4Z, 0, tokens=1)  # zero point operands $2, $3, activations $4..$7
    assert "mov.b32 k, $2; mov.b32 k2, $3;" in a and "$7" in a and "$8" not in a
    assert a.count("sub.rn.f16x2") == 2 and a.count("fma.rn.f16x2") == 2 + 3 and a.count("shr.u32") == 1
    assert kern.word_constraints(kern.U4Z, 1) == "=r,r,r,r,r,r,r,r"
    assert "cvt.rn.f16x2.e4m3x2" in kern.FINISH_E4M3_ASM.value


@pytest.mark.parametrize("kind,k", [(0, 256), (0, 200), (1, 256), (3, 100)])
def test_prep_layout_and_chunk_scales(kind, k, gen):
    """The activation planes, and one power of two per chunk of CW words."""
    epw = 8 if kind in (kern.F4, kern.I4) else 4
    xr = kern.XREGS[kind]
    cw = 8
    kw = k // epw
    nch = -(-kw // cw)
    x = torch.randn(2, k, generator=gen).to(torch.bfloat16)
    x[1, : cw * epw] *= 1e-3  # a quiet first chunk gets its own, smaller power of two
    xp = torch.empty(2, k, dtype=torch.float16, device=DEV)
    xs = torch.empty(2, nch, dtype=torch.float32, device=DEV)
    kern._prep_x_kernel[(2, nch)](x.to(DEV), xp, xs, x.stride(0), K=k, XE=5, KIND=kind, CW=cw)
    xp, xs = xp.cpu(), xs.cpu()
    w = torch.arange(kw)
    xf = torch.empty(2, k)
    for c in range(nch):
        seg = x[:, c * cw * epw:(c + 1) * cw * epw].float()
        e = torch.floor(torch.log2(seg.abs().amax(1)))
        assert torch.equal(xs[:, c], torch.exp2(e + 1 - 5))
        xf[:, c * cw * epw:(c + 1) * cw * epw] = xs[:, c:c + 1]
    assert xs[1, 0] < xs[1, 1] / 100
    for j in range(xr):
        for h in range(2):
            src = w * 8 + j + 4 * h if epw == 8 else w * 4 + 2 * j + h
            got = xp[:, j * 2 * kw + w * 2 + h]
            want = (x[:, src].float() / xf[:, src]).to(torch.float16)
            assert torch.equal(got, want)


def test_gemv_rejects_bad_config(gen):
    q = ms.quantize(torch.randn(16, 128, generator=gen), "mxfp4").to(DEV)
    x = torch.randn(1, 128, generator=gen).to(torch.bfloat16).to(DEV)
    with pytest.raises(ValueError, match="block_kw"):
        gemv(x, q, None, GemvConfig(block_kw=2), use_asm=False)
    with pytest.raises(ValueError, match="K="):
        gemv(torch.randn(1, 64).to(torch.bfloat16).to(DEV), q, None, use_asm=False)
    with pytest.raises(ValueError, match="no decode"):
        gemv(x, ms.quantize(torch.randn(16, 128, generator=gen), "mxfp6_e2m3").to(DEV), None, use_asm=False)


def _run_int_ptx(lines: list[str], regs: dict) -> dict:
    """The integer PTX the 4-bit float decode emits (shl / shr / and / or / lop3 / mov / shf wrap on b32),
    lane-parallel over numpy uint32 arrays."""
    import numpy as np

    def val(tok):
        tok = tok.strip()
        return regs[tok] if tok in regs else np.uint32(int(tok, 0) & 0xFFFFFFFF)

    for stmt in (s.strip() for s in " ".join(lines).split(";")):
        if not stmt:
            continue
        op, _, rest = stmt.partition(" ")
        d, *src = (t.strip() for t in rest.split(","))
        if op == "shl.b32":
            regs[d] = (val(src[0]).astype(np.uint64) << int(src[1])).astype(np.uint32)
        elif op == "shr.u32":
            regs[d] = val(src[0]) >> np.uint32(int(src[1]))
        elif op == "and.b32":
            regs[d] = val(src[0]) & val(src[1])
        elif op == "or.b32":
            regs[d] = val(src[0]) | val(src[1])
        elif op == "lop3.b32":  # bit i of the result: LUT bit (a_i << 2 | b_i << 1 | c_i) of the
            # immediate, as the PTX ISA defines it (a = 0xF0, b = 0xCC, c = 0xAA)
            a, b, c, lut = val(src[0]), val(src[1]), val(src[2]), int(src[3], 0)
            r = np.zeros_like(a)
            for i in range(8):
                if lut >> i & 1:
                    r |= (a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c)
            regs[d] = r
        elif op in ("shf.l.wrap.b32", "shf.r.wrap.b32"):  # funnel shift of (src1:src0) = a rotation when equal
            assert src[0] == src[1], stmt
            x, r = val(src[0]).astype(np.uint64), int(src[2]) % 32
            r = r if op.startswith("shf.l") else (32 - r) % 32
            regs[d] = ((x << np.uint64(r)) | (x >> np.uint64(32 - r))).astype(np.uint32)
        elif op == "mov.b32":
            regs[d] = val(src[0]).copy()
        else:
            raise NotImplementedError(op)
    return regs


def test_lop3_model():
    """The interpreter's lop3 against the ISA's definition on its three canonical inputs."""
    import numpy as np

    for lut in (0xE4, 0xC0, 0xF8, 0x96, 0x01, 0xFE):
        r = _run_int_ptx([f"lop3.b32 d, 0xF0, 0xCC, 0xAA, {lut};"], {})
        assert int(np.uint32(r["d"])) & 0xFF == lut


@pytest.mark.parametrize("select", [False, True])
def test_f4_decode_ptx_bit_placement(gen, select):
    """The GEMV's E2M1 word decode (the PTX the GPU runs): f16 pair ``j`` holds elements
    ``j`` (low half) and ``j + 4`` (high half), each as sign -> bit 15 and the three
    magnitude bits at ``10 - MBITS``: checked bit for bit on every nibble in every slot."""
    import ml_dtypes
    import numpy as np

    words = torch.randint(-2**31, 2**31, (4096,), generator=gen, dtype=torch.int64).numpy().astype(np.uint32)
    every = np.array([v * 0x11111111 for v in range(16)], dtype=np.uint32)  # each nibble value in each slot
    w = np.concatenate([words, every, np.arange(16, dtype=np.uint32) << 28])
    out = [f"p{j}" for j in range(4)]
    lines = kern._decode_word_ptx(kern.F4, 1, "w", out, select)
    assert sum(ln.count(";") for ln in lines) == (13 if select else 19)
    regs = _run_int_ptx(lines, {"w": w})
    pos = 10 - 1
    for j in range(4):
        for half, e in ((0, j), (1, j + 4)):
            nib = (w >> np.uint32(4 * e)) & np.uint32(0xF)
            want = ((nib >> np.uint32(3)) << np.uint32(15)) | ((nib & np.uint32(7)) << np.uint32(pos))
            got = (regs[out[j]] >> np.uint32(16 * half)) & np.uint32(0xFFFF)
            assert (got == want).all(), (j, half)
            # the value: the E2M1 element times 2^(BIAS - 15) (ml_dtypes as the oracle)
            ref = nib.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64) * 2.0 ** -14
            assert (got.astype(np.uint16).view(np.float16).astype(np.float64) == ref).all()


def _int4_decode(kind: int, w, z):
    """The GEMV's 4-bit integer word decode PTX (constants included) run by the PTX
    emulator on uint32 words ``w`` with zero points ``z`` (per word): four f16x2 pairs."""
    import numpy as np
    from test_gemv_mma import Warp

    lines = (kern._decode_constants_ptx(kind, "$5", "$6")
             + kern._decode_word_ptx(kind, 0, "$4", ["$0", "$1", "$2", "$3"]))
    asm = "{" + " ".join(lines) + "}"
    warp = Warp(np.zeros(1, np.uint8))
    outs = []
    for lo in range(0, w.size, 32):
        zz = z[lo:lo + 32].astype(np.int64)
        ka = ((zz + 0x6400) * 0x10001).astype(np.uint32)
        kb = (((-(zz + 64.0)).astype(np.float16).view(np.uint16).astype(np.int64)) * 0x10001).astype(np.uint32)
        outs.append(np.stack(warp.run(asm, "=r,=r,=r,=r,r,r,r", [w[lo:lo + 32], ka, kb])))
    return np.concatenate(outs, axis=1)


@pytest.mark.parametrize("kind", [kern.U4Z, kern.I4])
def test_int4_decode_ptx_is_exact(kind, gen):
    """The GEMV's 4-bit integer decode (the PTX the GPU runs): f16 pair ``j`` holds elements
    ``j`` and ``j + 4`` as exactly ``code - z`` (U4Z: every zero point 0..255; I4: the
    two's-complement value), every nibble value in every slot; the ``zero_point_operands``
    of the kernel (U4Z) are checked against the numpy construction used here."""
    import numpy as np

    every = np.array([v * 0x11111111 for v in range(16)], dtype=np.uint32)
    rnd = torch.randint(-2**31, 2**31, (512,), generator=gen, dtype=torch.int64).numpy().astype(np.uint32)
    w = np.concatenate([np.tile(every, 16), rnd])  # 256 + 512 words
    z = (np.arange(w.size) % 256).astype(np.uint32) if kind == kern.U4Z else np.zeros(w.size, np.uint32)
    out = _int4_decode(kind, w, z)
    for j in range(4):
        for half, e in ((0, j), (1, j + 4)):
            nib = ((w >> np.uint32(4 * e)) & np.uint32(0xF)).astype(np.int64)
            want = nib - z if kind == kern.U4Z else np.where(nib >= 8, nib - 16, nib)
            got = ((out[j] >> np.uint32(16 * half)) & np.uint32(0xFFFF)).astype(np.uint16).view(np.float16)
            assert (got.astype(np.float64) == want).all(), (j, half)


def test_int4_decode_emulation_catches_a_wrong_constant(gen, monkeypatch):
    """The check can fail: 1/16 replaced by 1/8 for the high nibbles is caught."""
    import numpy as np

    src = kern._decode_word_ptx
    monkeypatch.setattr(kern, "_decode_word_ptx", lambda *a, **kw: [s.replace("0x2C002C00", "0x30003000")
                                                                     for s in src(*a, **kw)])
    w = np.array([v * 0x11111111 for v in range(16)] * 2, dtype=np.uint32)
    out = _int4_decode(kern.U4Z, w, np.full(32, 3, np.uint32))
    got = ((out[1] & np.uint32(0xFFFF)).astype(np.uint16).view(np.float16)).astype(np.float64)
    assert not (got == ((w >> np.uint32(4)) & np.uint32(0xF)).astype(np.float64) - 3).all()


@pytest.mark.parametrize("asm", ASM)
@pytest.mark.parametrize("m,n", [(1, 40), (3, 37)])
def test_scale_pairs_and_select_match_the_plain_path(m, n, asm, gen):
    """``GemvConfig.scale_pairs`` (UE4M3 scales loaded as 16-bit chain pairs) and, on a GPU
    where the PTX runs, ``f4_select`` (the select decode; on CPU
    its PTX is checked by :func:`test_f4_decode_ptx_bit_placement`): the same results as
    byte-loaded scales and the shift decode, and within the GEMV's bound of float64, ragged
    rows included."""

    k = 512
    q = ms.quantize(torch.randn(n, k, generator=gen), "nvfp4")
    x = (torch.randn(m, k, generator=gen) * 3).to(torch.bfloat16)
    ref = x.double() @ q.dequantize(torch.float64).T
    base = GemvConfig(block_n=8, block_kw=32, f4_select=False, scale_pairs=False)
    want = gemv(x.to(DEV), q.to(DEV), None, base, use_asm=asm)
    for cfg in (GemvConfig(block_n=8, block_kw=32, f4_select=False, scale_pairs=True),
                GemvConfig(block_n=8, block_kw=32, scale_pairs=True, f4_select=True, prefetch=True)):
        got = gemv(x.to(DEV), q.to(DEV), None, cfg, use_asm=asm)
        assert rel(got, ref) < 1e-2
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-3, atol=1e-3)


def _gemv_ptx(run_tool, tmp_path, tune: dict, config: str, fmt: str = "nvfp4") -> dict:
    """PTX of the 1-token GEMV and its prep, compiled for sm_90 in a subprocess
    (``tools/gemv_ptx.py``: the interpreter mode of this process cannot compile); ``tune``:
    tuning fields set first."""
    r = run_tool("gemv_ptx.py", str(tmp_path), "--k", "2048", "--fmt", fmt, "--config", config, "--set", repr(tune))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {n: (tmp_path / f"{n}.ptx").read_text() for n in ("_gemv_kernel", "_prep_x_kernel")}


def test_pdl_weight_loads_go_out_before_the_wait(run_tool, tmp_path):
    """With a programmatic dependent launch the GEMV issues its first step's code loads
    (16-byte) before ``griddepcontrol.wait`` and lets the next kernel launch at its start;
    the prep, launched as a dependent of the kernel before it, waits before reading x.
    With ``tuning.gemv_early_w`` / ``tuning.gemv_pdl_chain`` off the old order comes back (so the
    check can fail)."""
    def first(ptx, s):
        return ptx.index(s) if s in ptx else len(ptx)

    p = _gemv_ptx(run_tool, tmp_path / "on", {}, "{'pdl': True}")
    g, prep = p["_gemv_kernel"], p["_prep_x_kernel"]
    assert first(g, "ld.global.v4") < first(g, "griddepcontrol.wait") < len(g)
    assert first(g, "griddepcontrol.launch_dependents") < first(g, "griddepcontrol.wait")
    assert first(prep, "griddepcontrol.wait") < first(prep, "ld.global") < len(prep)
    p = _gemv_ptx(run_tool, tmp_path / "off", {"gemv_early_w": False, "gemv_pdl_chain": False},
                  "{'pdl': True}")
    g, prep = p["_gemv_kernel"], p["_prep_x_kernel"]
    assert first(g, "griddepcontrol.wait") < first(g, "ld.global") and "launch_dependents" not in g
    assert "griddepcontrol.wait" not in prep and "launch_dependents" in prep


@pytest.mark.skipif(DEV == "cpu", reason="programmatic launches: GPU only")
@pytest.mark.parametrize("name", ["nvfp4", "mxfp8_e4m3"])
def test_back_to_back_calls_read_their_own_x(name, gen):
    """Twenty 1-token calls on one weight with a new x each, queued without a sync (the
    prep's scratch reused call after call, each prep launched while the GEMV before it
    runs): every output matches float64 on its own x, so no GEMV read a neighbour's
    activations."""
    n = 4096
    q = ms.quantize(torch.randn(n, n, generator=gen).to(DEV) / 64, name)
    xs = torch.randn(20, 1, n, generator=gen).to(DEV, torch.bfloat16)
    ref = (xs.double() @ q.dequantize(torch.float64).T).cpu()
    outs = [ms.linear(xs[i], q) for i in range(20)]
    torch.cuda.synchronize()
    for i, y in enumerate(outs):
        assert rel(y, ref[i]) < 1e-2, i


@pytest.mark.skipif(DEV == "cpu", reason="CUDA graphs and programmatic launches: GPU only")
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "mxfp8_e4m3"])
def test_chained_calls_in_a_cuda_graph(name, gen):
    """Three 1-token ``ms.linear`` calls, each reading the one before's output (what the
    programmatic-launch chain must wait for), eager and as a CUDA-graph replay on new input:
    the replay equals eager bit for bit, and each step is within the GEMV's bound of
    float64 on its own (bf16-rounded) input."""
    n = 4096
    # weights ~ N(0, 1/n): each output ~ N(0, 1); calls back to back, nothing in between
    qs = [ms.quantize(torch.randn(n, n, generator=gen).to(DEV) / 64, name) for _ in range(3)]
    x = torch.randn(1, n, generator=gen).to(DEV, torch.bfloat16)

    def chain(v):
        outs = []
        for q in qs:
            v = ms.linear(v, q)
            outs.append(v)
        return outs

    eager = chain(x)
    prev = x
    for q, y in zip(qs, eager):
        ref = prev.double() @ q.dequantize(torch.float64).T
        assert rel(y, ref.cpu()) < 1e-2
        prev = y
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = chain(x)
    x.copy_(torch.randn(1, n, generator=gen).to(DEV, torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    for y, y_eager in zip(got, chain(x)):
        assert torch.equal(y, y_eager)


@pytest.mark.parametrize("fmt,load", [("nvfp4", "ld.global.nc.u16"), ("mxfp4", "ld.global.nc.u8"),
                                      ("int8_fp16", "ld.global.nc.u16"), ("fp8_e4m3_fp32", "ld.global.nc.u32"),
                                      ("int4_affine_g128", "ld.global.nc.u8")])
def test_scale_direct_drops_the_loop_layout_conversion(fmt, load, run_tool, tmp_path):
    """``GemvConfig.scale_direct`` (the default): the block scales come from a PTX load in
    the layout of their use, so the K loop loses the shared-memory conversion and its
    barriers (two or more; sm_90 PTX; the epilogue's barriers stay)."""
    base = _gemv_ptx(run_tool, tmp_path / "base", {}, "{'pdl': True, 'scale_direct': False}", fmt)["_gemv_kernel"]
    direct = _gemv_ptx(run_tool, tmp_path / "direct", {}, "{'pdl': True}", fmt)["_gemv_kernel"]
    assert load not in base and load in direct
    assert direct.count("bar.sync") <= base.count("bar.sync") - 2


@pytest.mark.skipif(DEV == "cpu", reason="the PTX scale loads need the GPU")
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "mxfp8_e4m3", "mxint8", "int8_fp16", "int4_fp32", "fp8_e4m3_fp32",
                                  "int4_affine_g128", "int8_affine_g32"])
def test_scale_direct_is_bit_identical(name, gen):
    """The scale loads change place, not the arithmetic: outputs equal the default's bit
    for bit, 1-4 tokens, with and without paired scales (NVFP4), K split in two (two fp32
    atomic adds onto zero give the same sum in either order), whole and ragged row tiles
    (the ragged one keeps the default loads)."""
    from dataclasses import replace

    from microscale.linear.backends.gemv import choose_gemv_config

    for n, k, split in ((64, 1024, 1), (37, 1024, 1), (64, 2048, 2)):
        q = ms.quantize(torch.randn(n, k, generator=gen), name).to(DEV)
        for m in (1, 2, 3, 4):
            x = (torch.randn(m, k, generator=gen) * 3).to(DEV, torch.bfloat16)
            base = replace(choose_gemv_config(n, k, torch.device(DEV), m), block_kw=64, split_k=split)
            for pairs in ((True, False) if name == "nvfp4" else (True,)):
                c = replace(base, scale_pairs=pairs, scale_direct=False)
                want = gemv(x, q, None, c)
                got = gemv(x, q, None, replace(c, scale_direct=True))
                assert torch.equal(got, want), (n, m, split, pairs)


@pytest.mark.skipif(DEV == "cpu", reason="programmatic launches: GPU only")
def test_quantize_then_linear_back_to_back(gen):
    """A weight quantized on the GPU and used by the very next call (nothing in between,
    eager and in a CUDA graph) gives the right result. (A functional check: a race would
    rarely show here; the guarantees are checked on the compiled code and the host's
    choices: ``test_pdl_weight_loads_go_out_before_the_wait``,
    ``test_first_use_of_a_weight_reads_it_after_the_wait`` and
    ``test_quantize_kernel_never_triggers_its_dependents``.)"""
    n, k = 8192, 4096
    w = torch.empty(n, k, device=DEV)
    x = torch.randn(1, k, generator=gen).to(DEV, torch.bfloat16)
    for name in ("nvfp4", "mxfp4"):
        for _ in range(3):
            w.copy_(torch.randn(n, k, generator=gen))
            q = ms.quantize(w, name)
            y = ms.linear(x, q)
            ref = x.double() @ q.dequantize(torch.float64).T
            assert rel(y, ref.cpu()) < 1e-2, name
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            qg = ms.quantize(w, name)
            yg = ms.linear(x, qg)
        for _ in range(3):
            w.copy_(torch.randn(n, k, generator=gen))
            graph.replay()
            torch.cuda.synchronize()
            ref = x.double() @ qg.dequantize(torch.float64).T
            assert rel(yg, ref.cpu()) < 1e-2, name


def test_first_use_of_a_weight_reads_it_after_the_wait(monkeypatch, gen):
    """The GEMV reads a weight ahead of its programmatic-launch wait (``EARLY_W``) only once
    its views are cached: not on the weight's first use (kernels still in flight may be
    writing it, and the views may be fresh copies) and not after an in-place change."""

    seen = []
    real = gv.launch

    def spy(fn, grid, *a, **kw):
        if "EARLY_W" in kw:
            seen.append(kw["EARLY_W"])
        return real(fn, grid, *a, **kw)

    monkeypatch.setattr(gv, "launch", spy)
    tuning.set_tuning(gemv_early_w=True)
    q = ms.quantize(torch.randn(16, 256, generator=gen), "nvfp4").to(DEV)
    x = torch.randn(1, 256, generator=gen).to(DEV, torch.bfloat16)
    cfg = GemvConfig(block_n=8, block_kw=32)
    for _ in range(2):
        gemv(x, q, None, cfg)
    q.data.view(torch.uint8)[0, 0] ^= 1
    gemv(x, q, None, cfg)
    gemv(x, q, None, cfg)
    assert seen == [False, True, False, True]
