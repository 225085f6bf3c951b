"""The tensor-core decode path (``linear.gemv_mma``) without a GPU.

Its arithmetic is PTX inside ``tl.inline_asm_elementwise``, which the Triton interpreter
cannot run. So these tests execute the generated PTX text itself: a small interpreter
for the instructions the generators emit (per lane, 32 lanes at once, ``mma.sync``
with the fragment layout of the PTX ISA), driven by a Python mirror of the kernel's
per-lane addressing, and compare with float64 ``x @ dequant(W)^T``. The GPU tests check the
kernel itself (``bash benchmarks/run_gpu.sh`` runs them on an H100 / H200).
"""
from __future__ import annotations

import dataclasses

import re

import ml_dtypes
import numpy as np
import pytest
import torch

import microscale as ms
from microscale.linear.backends import gemv_mma as gmma
from microscale.linear import tuning
from microscale.linear import weight_state as wst
from microscale.linear._kernels import _gemv_mma as kern


def _f16_bits_to_f64(b: np.ndarray) -> np.ndarray:
    return b.astype(np.uint16).view(np.float16).astype(np.float64)


def _bf16_bits_to_f64(h: np.ndarray) -> np.ndarray:
    return (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _f64_to_bf16_bits(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)


def _f32(bits: np.ndarray) -> np.ndarray:
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def _bits32(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float32).view(np.uint32)


class Warp:
    """Runs inline-asm PTX of the generators for the 32 lanes of one warp. Registers hold
    uint32 bit patterns per lane; ``mem`` is the byte image addresses index into."""

    def __init__(self, mem: np.ndarray):
        self.mem = mem
        lane = np.arange(32)
        self.g, self.t = lane // 4, lane % 4

    def run(self, asm: str, cons: str, args: list[np.ndarray]) -> list[np.ndarray]:
        kinds = cons.split(",")
        nout = sum(k.startswith("=") for k in kinds)
        regs: dict[str, np.ndarray] = {}
        for i, a in enumerate(args):
            if kinds[nout + i] == "f":
                a = _bits32(np.asarray(a, dtype=np.float64))
            regs[f"${nout + i}"] = np.asarray(a).astype(np.uint64 if kinds[nout + i] == "l" else np.uint32)
        body = asm.strip().strip("{}")
        for stmt in (s.strip() for s in body.replace("\n", " ").split(";")):
            if stmt and not stmt.startswith(".reg"):
                self._exec(stmt, regs)
        outs = [regs[f"${i}"] for i in range(nout)]
        return [_f32(o) if kinds[i] == "=f" else o for i, o in enumerate(outs)]

    def _val(self, tok: str, regs) -> np.ndarray:
        tok = tok.strip()
        if tok.startswith("0f"):
            return np.full(32, int(tok[2:], 16), dtype=np.uint32)
        if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", tok):
            return np.full(32, int(tok, 0) & 0xFFFFFFFF, dtype=np.uint32)
        return regs[tok]

    def _load(self, addr: np.ndarray, nbytes: int) -> np.ndarray:
        idx = addr.astype(np.int64)[:, None] + np.arange(nbytes)[None, :]
        return self.mem[idx]

    def _exec(self, stmt: str, regs) -> None:
        op, _, rest = stmt.partition(" ")
        groups = re.findall(r"\{([^}]*)\}", rest)
        flat = re.sub(r"\{[^}]*\}", "#", rest)
        ops = [o.strip() for o in flat.split(",")]
        v = lambda o: self._val(o, regs)  # noqa: E731
        u32 = np.uint32
        if op.startswith("ld.global.nc"):
            m = re.match(r"\[(\$\d+)(?:\+(\d+))?\]", ops[-1])
            addr = regs[m.group(1)].astype(np.int64) + int(m.group(2) or 0)
            if op.endswith("v4.b32"):
                b = self._load(addr, 16).view(np.uint32)
                for j, r in enumerate(x.strip() for x in groups[0].split(",")):
                    regs[r] = b[:, j].astype(u32)
            else:
                nb = {"u8": 1, "u16": 2, "u32": 4}[op.split(".")[-1]]
                b = self._load(addr, nb)
                regs[ops[0]] = (b.astype(u32) << (8 * np.arange(nb, dtype=u32))).sum(1).astype(u32)
        elif op == "mov.b32" and groups:  # {lo, hi} <- b32
            lo, hi = (x.strip() for x in groups[0].split(","))
            w = v(ops[1])
            regs[lo], regs[hi] = w & 0xFFFF, w >> 16
        elif op == "cvt.u16.u32":
            regs[ops[0]] = v(ops[1]) & u32(0xFFFF)
        elif op in ("mov.b32", "mov.f32", "mov.u32"):
            regs[ops[0]] = v(ops[1]).copy()
        elif op == "shl.b32":
            regs[ops[0]] = (v(ops[1]).astype(np.uint64) << int(ops[2])).astype(u32) & u32(0xFFFFFFFF)
        elif op == "shr.u32":
            regs[ops[0]] = v(ops[1]) >> u32(int(ops[2]))
        elif op in ("shf.l.wrap.b32", "shf.r.wrap.b32"):  # funnel shift of (hi:lo) = (ops[2]:ops[1])
            lo, hi, n = v(ops[1]).astype(np.uint64), v(ops[2]).astype(np.uint64), int(ops[3]) & 31
            both = (hi << np.uint64(32)) | lo
            sh = (both << np.uint64(n)) >> np.uint64(32) if op.startswith("shf.l") else both >> np.uint64(n)
            regs[ops[0]] = (sh & np.uint64(0xFFFFFFFF)).astype(u32)
        elif op == "lop3.b32":  # bit i: LUT bit (a_i << 2 | b_i << 1 | c_i), as the PTX ISA defines it
            a, b, cc, lut = v(ops[1]), v(ops[2]), v(ops[3]), int(ops[4], 0)
            r = np.zeros(32, dtype=u32)
            for i in range(8):
                if lut >> i & 1:
                    r |= (a if i & 4 else ~a) & (b if i & 2 else ~b) & (cc if i & 1 else ~cc)
            regs[ops[0]] = r
        elif op == "and.b32":
            regs[ops[0]] = v(ops[1]) & v(ops[2])
        elif op == "xor.b32":
            regs[ops[0]] = v(ops[1]) ^ v(ops[2])
        elif op == "or.b32":
            regs[ops[0]] = v(ops[1]) | v(ops[2])
        elif op == "add.u32":
            regs[ops[0]] = (v(ops[1]).astype(np.uint64) + v(ops[2])).astype(u32)
        elif op == "sub.s32":
            regs[ops[0]] = ((v(ops[1]).astype(np.int64) - v(ops[2]).astype(np.int64)) & 0xFFFFFFFF).astype(u32)
        elif op == "mad.lo.u32":  # the low 32 bits of a * b + c
            regs[ops[0]] = ((v(ops[1]).astype(np.uint64) * v(ops[2]) + v(ops[3])) & 0xFFFFFFFF).astype(u32)
        elif op == "max.s32":
            regs[ops[0]] = np.maximum(v(ops[1]).view(np.int32), v(ops[2]).view(np.int32)).view(u32)
        elif op == "cvt.rn.f32.s32":  # (exact for the small integers the generators convert)
            val = v(ops[1]).view(np.int32).astype(np.float64)
            assert (np.abs(val) < 2 ** 24).all()
            regs[ops[0]] = _bits32(val)
        elif op == "prmt.b32":
            a, b, sel = v(ops[1]), v(ops[2]), int(ops[3], 0)
            src = np.stack([(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)])
            out = np.zeros(32, dtype=u32)
            for i in range(4):
                s = (sel >> (4 * i)) & 0xF
                assert s < 8, "sign-replicate selectors are not emitted"
                out |= src[s].astype(u32) << u32(8 * i)
            regs[ops[0]] = out
        elif op in ("cvt.rn.f16x2.e4m3x2", "cvt.rn.f16x2.e5m2x2"):
            h = v(ops[1])
            t8 = ml_dtypes.float8_e4m3fn if op.endswith("e4m3x2") else ml_dtypes.float8_e5m2
            f8 = lambda b: (b.astype(np.uint8).view(t8).astype(np.float16)  # noqa: E731
                            .view(np.uint16).astype(u32))
            regs[ops[0]] = f8(h & 0xFF) | (f8((h >> 8) & 0xFF) << u32(16))
        elif op == "cvt.f32.f16":
            f = v(ops[1]).astype(np.uint16).view(np.float16).astype(np.float32)
            regs[ops[0]] = f.view(u32)
        elif op == "mul.f32":
            regs[ops[0]] = _bits32(_f32(v(ops[1])) * _f32(v(ops[2])))
        elif op == "add.f32":
            regs[ops[0]] = _bits32(_f32(v(ops[1])) + _f32(v(ops[2])))
        elif op == "sub.f32":
            regs[ops[0]] = _bits32(_f32(v(ops[1])) - _f32(v(ops[2])))
        elif op == "cvt.rn.bf16x2.f32":  # d.hi <- a, d.lo <- b
            regs[ops[0]] = (_f64_to_bf16_bits(_f32(v(ops[1]))) << u32(16)) | _f64_to_bf16_bits(_f32(v(ops[2])))
        elif op in ("mul.rn.bf16x2", "sub.rn.bf16x2", "fma.rn.bf16x2"):
            # each half's exact result rounded once to bf16 (exact in float64, and within float32's
            # precision where the generators use them, so the float32 step does not round twice)
            half = lambda w, h: _bf16_bits_to_f64((w >> u32(16 * h)) & 0xFFFF)  # noqa: E731
            f = {"mul.rn.bf16x2": lambda a, b: a * b, "sub.rn.bf16x2": lambda a, b: a - b,
                 "fma.rn.bf16x2": lambda a, b, c: a * b + c}[op]
            srcs = [v(o) for o in ops[1:]]
            res = [f(*(half(w, h) for w in srcs)) for h in (0, 1)]
            assert all((r.astype(np.float32).astype(np.float64) == r).all() for r in res), "not exact in float32"
            regs[ops[0]] = _f64_to_bf16_bits(res[0]) | (_f64_to_bf16_bits(res[1]) << u32(16))
        elif op in ("mul.rn.f16x2", "sub.rn.f16x2", "add.rn.f16x2", "fma.rn.f16x2"):
            # each half's result in float64 rounded to f16 (one rounding where float64 holds the
            # exact result, as for the decodes checked with it: integers, powers of two)
            half = lambda w, h: _f16_bits_to_f64((w >> u32(16 * h)) & 0xFFFF)  # noqa: E731
            f = {"mul.rn.f16x2": lambda a, b: a * b, "sub.rn.f16x2": lambda a, b: a - b,
                 "add.rn.f16x2": lambda a, b: a + b, "fma.rn.f16x2": lambda a, b, c: a * b + c}[op]
            srcs = [v(o) for o in ops[1:]]
            res = [f(*(half(w, h) for w in srcs)).astype(np.float16).view(np.uint16).astype(u32) for h in (0, 1)]
            regs[ops[0]] = res[0] | (res[1] << u32(16))
        elif op == "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32":
            d, a, b, c = ([x.strip() for x in gr.split(",")] for gr in groups)
            A = np.zeros((16, 16))
            B = np.zeros((16, 8))
            C = np.zeros((16, 8))
            g, t = self.g, self.t
            lo = lambda r: _bf16_bits_to_f64(v(r) & 0xFFFF)  # noqa: E731
            hi = lambda r: _bf16_bits_to_f64(v(r) >> u32(16))  # noqa: E731
            for i, (ro, co) in enumerate([(0, 0), (8, 0), (0, 8), (8, 8)]):
                A[g + ro, 2 * t + co] = lo(a[i])
                A[g + ro, 2 * t + co + 1] = hi(a[i])
            for i, ko in enumerate([0, 8]):
                B[2 * t + ko, g] = lo(b[i])
                B[2 * t + ko + 1, g] = hi(b[i])
            for i, (ro, co) in enumerate([(0, 0), (0, 1), (8, 0), (8, 1)]):
                C[g + ro, 2 * t + co] = _f32(v(c[i]))
            D = A @ B + C
            for i, (ro, co) in enumerate([(0, 0), (0, 1), (8, 0), (8, 1)]):
                regs[d[i]] = _bits32(D[g + ro, 2 * t + co])
        else:
            raise NotImplementedError(f"PTX op {op!r} in {stmt!r}")


def emulate(x: torch.Tensor, q, c: gmma.GemvMmaConfig) -> np.ndarray:
    """The kernel's per-lane schedule (``_gemv_mma_kernel``) over one warp at a time."""
    m, k = x.shape
    n = q.shape[0]
    f = q.fmt
    wpg = f.block_size // 8
    kw = k // 8
    rg, wpl, tg = c.row_groups, c.words_per_lane, -(-m // 8)
    step = 4 * wpl
    codes = q.data.contiguous().view(torch.uint8).numpy().reshape(-1)
    scales = q.scales.contiguous().view(torch.uint8).numpy().reshape(-1)
    xb = x.contiguous().view(torch.uint8).numpy().reshape(-1)
    mem = np.concatenate([codes, scales, xb, np.zeros(64, np.uint8)])
    w0, s0, x0 = 0, codes.size, codes.size + scales.size
    sk, ke, post = gmma.gemv_mma_scale_args(q)
    lasm, lcons, _ = kern.load_asm(rg, wpl, 0, wpl // wpg)
    xasm, xcons, _ = kern.load_asm(0, wpl, tg, 0, 16)
    sasm, scons = kern.step_asm(rg, wpl, tg, wpg, sk)
    warp = Warp(mem)
    out = np.zeros((m, n))
    g, t = warp.g, warp.t
    per = gmma.split_words(kw, c.split_k, wpl)  # words a split (the host's rule)
    even = per * c.split_k == kw
    for pid_n in range(-(-n // (16 * rg * c.num_warps))):
        for pid_k in range(c.split_k):
            for wi in range(c.num_warps):
                base = pid_n * 16 * rg * c.num_warps + wi * 16 * rg + g
                k0 = pid_k * per + t * wpl
                ws = [w0 + np.minimum(base + 8 * r, n - 1) * (kw * 4) + k0 * 4 for r in range(2 * rg)]
                ss = [s0 + np.minimum(base + 8 * r, n - 1) * (kw // wpg) + k0 // wpg for r in range(2 * rg)]
                xs = [x0 + np.minimum(g + 8 * qq, m - 1) * (k * 2) + k0 * 16 for qq in range(tg)]
                accs = [np.zeros(32) for _ in range(4 * rg * tg)]
                last_w = kw - wpl - k0
                for i in range(0, per, step):
                    off = np.full(32, i) if even else np.minimum(i, last_w)  # past the row: its last words
                    d = warp.run(lasm, lcons, [a + off * 4 for a in ws] + [a + off // wpg for a in ss])
                    dx = warp.run(xasm, xcons, [a + off * 16 for a in xs])
                    if not even:  # (and zeroed activations)
                        dx = [np.where(k0 + i < kw, v, 0).astype(np.uint32) for v in dx]
                    extra = [np.full(32, ke)] if sk == kern.SK_E8M0 else []
                    accs = warp.run(sasm, scons, d + dx + accs + extra)
                for i in range(rg):
                    for qq in range(tg):
                        for cc in range(4):
                            row = base + 16 * i + 8 * (cc // 2)
                            tok = 8 * qq + 2 * t + cc % 2
                            ok = (row < n) & (tok < m)
                            np.add.at(out, (tok[ok], row[ok]), accs[(i * tg + qq) * 4 + cc][ok] * post)
    if q.global_scale is not None:
        out *= float(q.global_scale.reshape(-1)[0])
    return out


def _case(name, n, k, m, gen):
    w = torch.randn(n, k, generator=gen)
    q = ms.quantize(w, name)
    x = (torch.randn(m, k, generator=gen) * 2).to(torch.bfloat16)
    return q, x


def _check(out, x, q):
    wd = q.dequantize(torch.float64)
    ref = (x.double() @ wd.T).numpy()
    cond = (x.double().abs() @ wd.abs().T).numpy()
    err = np.abs(out - ref)
    assert (err <= 2.0 ** -20 * cond + 1e-30).all(), float((err / (cond + 1e-30)).max())


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m,cfg", [
    (1, gmma.GemvMmaConfig(2, 8, 2)),
    (5, gmma.GemvMmaConfig(1, 4, 1, split_k=2)),
    (16, gmma.GemvMmaConfig(2, 4, 1)),
])
def test_generated_ptx_matches_float64(name, m, cfg, gen):
    q, x = _case(name, 40, 1024, m, gen)  # 40 rows: a partial row group
    _check(emulate(x, q, cfg), x, q)


def test_interpreter_bit_ops():
    """The interpreter's ``lop3`` against the ISA's definition on its canonical inputs
    (a = 0xF0, b = 0xCC, c = 0xAA), its funnel shifts against rotations."""
    w = Warp(np.zeros(1, np.uint8))
    for lut in (0xE4, 0xC0, 0x96, 0x01):
        r = w.run(f"{{ lop3.b32 $0, $1, $2, $3, {lut}; }}", "=r,r,r,r",
                  [np.full(32, 0xF0), np.full(32, 0xCC), np.full(32, 0xAA)])[0]
        assert int(r[0]) & 0xFF == lut
    x = np.arange(32, dtype=np.uint32) * np.uint32(0x9E3779B9)
    left, right = w.run("{ shf.l.wrap.b32 $0, $2, $2, 6; shf.r.wrap.b32 $1, $2, $2, 2; }", "=r,=r,r", [x])
    assert (left == ((x << np.uint32(6)) | (x >> np.uint32(26)))).all()
    assert (right == ((x >> np.uint32(2)) | (x << np.uint32(30)))).all()


def test_select_decode_places_every_code(gen):
    """The select decode (the Gluon prefill's): all 8 nibble slots x 16 codes give the same pairs as the shift decode."""
    w = Warp(np.zeros(1, np.uint8))
    one = "0x3F803F80"  # bf16x2 (1, 1): the scale multiply leaves the bits as placed
    words = np.array([int("".join("%x" % ((c + 5 * i) % 16) for i in range(8)), 16) for c in range(32)],
                     dtype=np.uint32)
    words = np.concatenate([words, np.random.default_rng(0).integers(0, 2**32, 32 * 7, dtype=np.uint32)])
    for chunk in words.reshape(-1, 32):
        ref = "\n".join(ln for j in range(4) for ln in kern._pair_lines("$4", f"${j}", j, one))
        sel = "\n".join(kern._word_lines_select("$4", "q", one)) + "".join(f"mov.b32 ${j}, q{j};" for j in range(4))
        regs = ".reg .b32 m, s, r, z, q0, q1, q2, q3;"
        a = w.run("{" + regs + ref + "}", "=r,=r,=r,=r,r", [chunk])
        b = w.run("{" + regs + sel + "}", "=r,=r,=r,=r,r", [chunk])
        for x, y in zip(a, b):
            assert (x == y).all()


def test_generated_ptx_k_not_a_multiple_of_1024(gen):
    q, x = _case("mxfp4", 24, 768, 2, gen)  # 3 steps of 256 elements
    _check(emulate(x, q, gmma.GemvMmaConfig(2, 8, 1)), x, q)


@pytest.mark.parametrize("name,k,m,cfg", [
    ("mxfp4", 2880, 1, gmma.GemvMmaConfig(2, 8, 1)),  # gpt-oss hidden size: 11.25 steps
    ("nvfp4", 576, 3, gmma.GemvMmaConfig(1, 8, 1, split_k=2)),  # split ranges of whole steps, the last short
    ("mxfp4", 320, 9, gmma.GemvMmaConfig(1, 4, 1, split_k=2)),  # a split past the row's end
])
def test_generated_ptx_k_not_a_multiple_of_the_step(name, k, m, cfg, gen):
    """K a multiple of a lane's words only: lanes past the row re-read its last words with zeroed activations."""
    q, x = _case(name, 24, k, m, gen)
    assert gmma.gemv_mma_reason(q, x, cfg) in (None, "needs CUDA tensors")
    _check(emulate(x, q, cfg), x, q)
    assert "empty" in gmma.gemv_mma_reason(q, x, dataclasses.replace(cfg, split_k=8))  # a range past the row


def test_emulator_catches_a_wrong_pairing(gen, monkeypatch):
    """The check can fail: pairing activations (j, j+1) instead of (j, j+4) is caught."""
    q, x = _case("nvfp4", 16, 512, 1, gen)
    real = kern.step_asm.__wrapped__

    def bad(*a):
        asm, cons = real(*a)
        return asm.replace("0x5410", "0x3210"), cons

    monkeypatch.setattr(kern, "step_asm", bad)
    with pytest.raises(AssertionError):
        _check(emulate(x, q, gmma.GemvMmaConfig(1, 4, 1)), x, q)


def test_subnormal_placement_and_extreme_scales(gen):
    """Codes +-0.5 (bf16 subnormals after placement), UE4M3 subnormal / largest scales,
    E8M0 scales spread over 120 binades."""
    for name in ("nvfp4", "mxfp4"):
        q, x = _case(name, 32, 512, 3, gen)
        q.data.copy_(torch.where(torch.rand(q.data.shape, generator=gen) < 0.5, 0x11, 0x99).to(q.data.dtype))
        sc = q.scales.view(torch.uint8)
        if name == "nvfp4":
            sc.copy_(torch.randint(1, 8, sc.shape, generator=gen).to(torch.uint8))
            sc[::2] = 0x7E
        else:
            sc.copy_(torch.randint(60, 180, sc.shape, generator=gen).to(torch.uint8))
        _check(emulate(x, q, gmma.GemvMmaConfig(1, 4, 1)), x, q)


def test_e8m0_window():
    q = ms.quantize(torch.randn(8, 64), "mxfp4")
    sc = q.scales.view(torch.uint8)
    sc.fill_(127)
    sc[0, 0] = 100
    assert wst.e8m0_window(q) == -1  # D = max - 128
    sc[0, 0] = 0  # 127 binades apart: outside [D + 2, D + 128]
    assert wst.e8m0_window(q) is None
    sc[0, 0] = 127
    sc[1, 1] = 255  # NaN scale
    assert wst.e8m0_window(q) is None


def test_supported_and_config_rules(gen):
    """Unserved calls name their reason (device-independent ones are checked first)."""
    q = ms.quantize(torch.randn(64, 1024, generator=gen), "nvfp4")
    x = torch.randn(4, 1024, generator=gen).to(torch.bfloat16)
    assert not gmma.gemv_mma_supported(q, x)  # CPU tensors
    for args, msg in [((x, q), "needs CUDA tensors"),
                      ((x.half(), q), "needs bfloat16"),
                      ((torch.randn(17, 1024).to(torch.bfloat16), q), "1..16 tokens"),
                      ((x, ms.quantize(torch.randn(64, 1024, generator=gen), "mxfp8_e4m3")), "serves E2M1"),
                      ((torch.randn(2, 48).to(torch.bfloat16), ms.quantize(torch.randn(8, 48, generator=gen),
                                                                            "nvfp4")), "multiple of a lane's words")]:
        with pytest.raises(ValueError, match=msg):
            gmma.gemv_mma(*args)
    with pytest.raises(ValueError, match="bias has shape"):
        gmma.gemv_mma(x, q, torch.randn(3))
    c = gmma.choose_gemv_mma_config(28672, 8192, torch.device("cpu"), 1)
    assert (c.row_groups, c.words_per_lane, c.num_warps) == (2, 8, 2)
    assert c.split_k >= 1 and (8192 // 8) % (4 * c.words_per_lane * c.split_k) == 0
    c = gmma.choose_gemv_mma_config(8192, 512, torch.device("cpu"), 16)
    assert c.words_per_lane == 4 and 512 // 8 % (16 * c.split_k) == 0


def test_short_rows_split_finer_and_take_one_token():
    """Rows of fewer than 16 K steps (gpt-oss's 2880) split into 2-step slices up to 1.5x the warps wanted
    (an H100 sweep: [5120, 2880] best at 4, [23040, 2880] at 2); longer rows keep the 4-step rule. Where the
    f16x2 GEMV would take 8-word steps, gemv_mma serves one token too."""
    from microscale.linear.backends.gemv_mma import _choose_gemv_mma_config
    from microscale.linear.routing import Call, _gemv_short_steps

    assert [_choose_gemv_mma_config(n, 2880, 1, 132).split_k for n in (5120, 23040)] == [4, 2]
    assert _choose_gemv_mma_config(28672, 8192, 1, 132).split_k == 2  # (16+ steps: as before)
    gen = torch.Generator().manual_seed(0)
    for k, short in ((2880, True), (4096, False)):
        q = ms.quantize(torch.randn(64, k, generator=gen), "nvfp4")
        assert _gemv_short_steps(Call(torch.randn(1, k).to(torch.bfloat16), q, None)) is short


@pytest.mark.parametrize("m,cfg", [(1, gmma.GemvMmaConfig(2, 8, 2)), (5, gmma.GemvMmaConfig(1, 4, 1, split_k=2)),
                                   (16, gmma.GemvMmaConfig(2, 4, 1))])
def test_multiply_add_scales_match_float64(m, cfg, gen, monkeypatch):
    """``SK_UE4M3N`` (``tuning.gemv_mma_scale_imad``): NVFP4 through the generated PTX with the multiply-add scales
    matches float64 as the conversion does; a weight with subnormal scales over nonzero codes keeps the
    conversion (and forced onto the multiply-add, the emulation fails: the scan is what keeps it right)."""
    tuning.set_tuning(gemv_mma_scale_imad=True)
    q, x = _case("nvfp4", 40, 1024, m, gen)
    assert gmma.gemv_mma_scale_args(q)[0] == kern.SK_UE4M3N
    _check(emulate(x, q, cfg), x, q)
    w = torch.randn(40, 1024, generator=gen)
    w[:, :64] *= 2.0 ** -16  # subnormal UE4M3 scales over nonzero codes
    q2 = ms.quantize(w, "nvfp4")
    assert gmma.gemv_mma_scale_args(q2)[0] == kern.SK_UE4M3
    _check(emulate(x, q2, cfg), x, q2)
    monkeypatch.setattr(gmma, "ue4m3_normal", lambda q: True)
    with pytest.raises(AssertionError):
        _check(emulate(x, q2, cfg), x, q2)


def test_ptx_operands_are_all_bound():
    """Every ``$i`` an asm text names is one of its constraints' operands, and every
    output is written."""
    for rg, wpl, tg, wpg, sk in [(1, 4, 1, 2, 2), (2, 8, 2, 4, 1), (2, 4, 1, 2, 2), (2, 8, 1, 2, 5)]:
        for asm, cons in [kern.step_asm(rg, wpl, tg, wpg, sk),
                          kern.load_asm(rg, wpl, 0, wpl // wpg)[:2], kern.load_asm(0, wpl, tg, 0)[:2]]:
            n = len(cons.split(","))
            used = {int(i) for i in re.findall(r"\$(\d+)", asm)}
            assert used <= set(range(n))
            nout = cons.count("=")
            assert set(range(nout)) <= used


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Hopper)")
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4"])
def test_gpu_kernel_and_routing(name):
    """The kernel on the GPU: configs x token counts (ragged rows, bias), ``ms.linear``'s
    routing, and a CUDA-graph capture of the routed call."""
    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev) < (9, 0):
        pytest.skip("Hopper or newer")
    g = torch.Generator(device=dev).manual_seed(3)
    w = torch.randn(200, 2048, device=dev, generator=g)
    q = ms.quantize(w, name)
    wd = q.dequantize(torch.float64)
    bias = torch.randn(200, device=dev, generator=g)
    for m in (1, 3, 8, 9, 16):
        x = torch.randn(m, 2048, device=dev, generator=g).to(torch.bfloat16)
        ref = x.double() @ wd.T + bias.double()
        cond = x.double().abs() @ wd.abs().T + bias.double().abs()
        for cfg in (None, gmma.GemvMmaConfig(1, 4, 1, split_k=4), gmma.GemvMmaConfig(2, 8, 2),
                    gmma.GemvMmaConfig(1, 4, 2, split_k=4), gmma.GemvMmaConfig(2, 4, 4)):
            out = gmma.gemv_mma(x, q, bias, cfg)
            assert out.dtype == torch.bfloat16 and out.shape == (m, 200)
            assert ((out.double() - ref).abs() <= 2.0 ** -8 * ref.abs() + 2.0 ** -16 * cond).all(), (m, cfg)
    x = torch.randn(1, 3, 2048, device=dev, generator=g).to(torch.bfloat16)  # 3 tokens: routed here
    assert gmma.gemv_mma_supported(q, x) and 3 < tuning.get().decode_tma_small_min_m  # (also inside a graph)
    y = ms.linear(x, q)
    torch.testing.assert_close(y, gmma.gemv_mma(x.reshape(3, -1), q).reshape(1, 3, 200), rtol=0, atol=0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = ms.linear(x, q)
    graph.replay()
    torch.testing.assert_close(yg, y, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Hopper)")
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4"])
def test_gpu_k_not_a_multiple_of_the_step(name):
    """K a multiple of a lane's words only (gpt-oss's 2880; 576 with a split past the row): the kernel on
    the GPU over configs and token counts, and ``ms.linear`` routes such a weight here."""
    from microscale.linear.routing import explain

    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev) < (9, 0):
        pytest.skip("Hopper or newer")
    g = torch.Generator(device=dev).manual_seed(5)
    for k in (2880, 576):
        q = ms.quantize(torch.randn(136, k, device=dev, generator=g), name)
        wd = q.dequantize(torch.float64)
        bias = torch.randn(136, device=dev, generator=g)
        for m in (1, 5, 16):
            x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            ref = x.double() @ wd.T + bias.double()
            cond = x.double().abs() @ wd.abs().T + bias.double().abs()
            for cfg in (None, gmma.GemvMmaConfig(1, 4, 1, split_k=2), gmma.GemvMmaConfig(2, 8, 2, split_k=2),
                        gmma.GemvMmaConfig(2, 8, 2, split_k=4 if k == 2880 else 1)):
                out = gmma.gemv_mma(x, q, bias, cfg)
                assert ((out.double() - ref).abs() <= 2.0 ** -8 * ref.abs() + 2.0 ** -16 * cond).all(), (k, m, cfg)
        for m in (1, tuning.get().gemv_mma_min_m):  # (one token too: the GEMV's K steps would be short)
            x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            assert explain(x, q)[-1] == ("gemv_mma", None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Hopper)")
def test_gpu_scale_imad_bit_identical(monkeypatch):
    """NVFP4 with the UE4M3 scales made by one multiply-add (``tuning.gemv_mma_scale_imad``) gives the same bits
    as the conversion sequence, over the configs and token counts (ragged rows, bias), with an all-zero
    block whose scale byte the multiply-add gets wrong (times zero codes: still zero)."""
    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev) < (9, 0):
        pytest.skip("Hopper or newer")
    g = torch.Generator(device=dev).manual_seed(4)
    w = torch.randn(200, 2048, device=dev, generator=g)
    w[3, 32:48] = 0  # an all-zero block, given a subnormal scale byte (allowed: it scales zero codes)
    q = ms.quantize(w, "nvfp4")
    q.scales.view(torch.uint8).reshape(200, -1)[3, 2] = 3
    assert wst.ue4m3_normal(q)  # (else both runs take the conversion)
    bias = torch.randn(200, device=dev, generator=g)
    for m in (2, 5, 8, 16):
        x = torch.randn(m, 2048, device=dev, generator=g).to(torch.bfloat16)
        for cfg in (None, gmma.GemvMmaConfig(1, 4, 1, split_k=4), gmma.GemvMmaConfig(2, 8, 2),
                    gmma.GemvMmaConfig(2, 4, 4)):
            outs = []
            for on in (False, True):
                tuning.set_tuning(gemv_mma_scale_imad=on)
                assert gmma.gemv_mma_scale_args(q)[0] == (kern.SK_UE4M3N if on else kern.SK_UE4M3)
                outs.append(gmma.gemv_mma(x, q, bias, cfg))
            torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0, msg=f"{m} {cfg}")


def test_weight_views_follow_in_place_updates(gen):
    """The decode wrappers' cached views of a weight are rebuilt when any of its tensors
    changes in place (data, scales, global scale)."""
    q = ms.quantize(torch.randn(16, 64, generator=gen), "nvfp4")
    a = wst.views(q)
    assert wst.views(q) is a
    q.global_scale.mul_(2)
    b = wst.views(q)
    assert b is not a and torch.equal(b.global_scale, q.global_scale.reshape(1).float())
    q.scales.view(torch.uint8)[0, 0] ^= 1
    c = wst.views(q)
    assert c is not b and torch.equal(c.scales_u8, q.scales.view(torch.uint8))
    q.data.view(torch.uint8)[0, 0] ^= 1
    assert wst.views(q) is not c
