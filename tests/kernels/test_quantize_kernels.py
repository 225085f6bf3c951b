"""Quantize / dequantize kernels vs the reference, bit for bit (Triton interpreter on CPU,
the GPU when there is one). Shapes are tiny; realistic shapes run in
``benchmarks/run_gpu_quantize.py`` on the H200."""
import pytest
import torch
import triton.language as tl

from microscale import reference, reference_fused
from microscale.formats import (
    SCALE_LAYOUTS, NonFinite, Overflow, Rounding, get_format, get_scale_layout, pack_codes, registry, unpack_codes,
)
from microscale import quant as kq
from microscale.quant import params, tuning

DEV = "cuda" if torch.cuda.is_available() else "cpu"
MX = ["mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2", "mxint8", "mxint4"]
TWO_LEVEL_DTYPES = [torch.bfloat16, torch.float32]


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    """Every kernel output starts as garbage (0xA5 bytes), so unwritten elements show."""
    def empty(shape, dtype, device):
        t = torch.empty(shape, dtype=dtype, device=device)
        t.view(torch.uint8).fill_(0xA5)
        return t
    monkeypatch.setattr(params, "_empty", empty)


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_floating_point and t.element_size() == 4:
        return t.view(torch.int32)
    if t.dtype.is_floating_point and t.element_size() == 2:
        return t.view(torch.int16)
    if t.dtype.is_floating_point:
        return t.view(torch.uint8)
    return t


def assert_same(a, b):
    """Two QTensors hold the same bits."""
    assert a.fmt == b.fmt and tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype
    assert torch.equal(a.data.cpu(), b.data.cpu()), _first_diff(a.data, b.data)
    assert a.scales.dtype == b.scales.dtype and a.scales.shape == b.scales.shape
    assert torch.equal(_bits(a.scales.cpu()), _bits(b.scales.cpu())), _first_diff(_bits(a.scales), _bits(b.scales))
    for x, y in ((a.zero_points, b.zero_points), (a.global_scale, b.global_scale)):
        assert (x is None) == (y is None)
        if x is not None:
            assert torch.equal(_bits(x.cpu().reshape(-1)), _bits(y.cpu().reshape(-1)))
    assert a.meta == b.meta


def assert_same_values(a, b):
    """Bit-identical, except that NaNs only need to be NaN (GPU arithmetic returns the
    canonical NaN, the CPU propagates payloads)."""
    a, b = a.cpu(), b.cpu()
    assert a.dtype == b.dtype and a.shape == b.shape
    na, nb = torch.isnan(a), torch.isnan(b)
    assert torch.equal(na, nb)
    assert torch.equal(_bits(a)[~na], _bits(b)[~nb]), _first_diff(_bits(a).masked_fill(na, 0), _bits(b).masked_fill(nb, 0))


def _first_diff(a, b):
    a, b = a.cpu().reshape(-1), b.cpu().reshape(-1)
    i = int((a != b).nonzero()[0]) if a.shape == b.shape and (a != b).any() else -1
    return f"first difference at flat index {i}: {a[i].item() if i >= 0 else ''} vs {b[i].item() if i >= 0 else ''}"


def adversarial(gen, shape, fmt, dtype=torch.bfloat16, nonfinite=False):
    """Heavy-tailed values with per-row magnitudes over a wide range, an all-zero block,
    exact ties of the element grid, tiny (subnormal-scale) blocks, huge blocks, and
    optionally NaN/Inf (one block of each, plus isolated ones)."""
    k = shape[-1]
    b = get_format(fmt).block_size
    x = torch.randn(shape, generator=gen)
    x = x * torch.exp2(torch.randint(-12, 12, shape[:-1] + (1,), generator=gen).float())
    x2 = x.reshape(-1, k)
    n = x2.shape[0]
    x2[0, :b] = 0.0  # zero block
    if k >= 2 * b:
        ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, -2.5, 6.5, 0.0625, 0.1875, 7.0, 13.0, 112.0, 0.5])
        reps = torch.cat([ties, ties * 4]).repeat(b // 32 + 1)[:b]
        x2[0, b:2 * b] = reps * 2.0 ** torch.randint(-3, 3, (1,), generator=gen).float()
    if n > 1:
        x2[1, :b] *= 2.0 ** -120  # far below normal range: subnormal elements and scales
    if n > 2:
        x2[2, :b] *= 2.0 ** 100  # overflow of small scale codecs
    if n > 3 and k >= 2 * b:
        x2[3, b] = 2.0 ** -130  # float32 subnormal next to a normal
    if nonfinite:
        x2[min(1, n - 1), -1] = float("nan")
        x2[min(2, n - 1), -2] = float("inf")
        x2[0, -b + 1] = -float("inf")
        x2[n - 1, 0] = -float("nan")
    return x.reshape(shape).to(dtype).to(DEV)


def run_both(x, fmt, **kw):
    got = kq.quantize(x, fmt, **kw)
    want = reference.quantize(x.cpu(), fmt, **kw)
    return got, want


# ---- every format of the registry --------------------------------------------------
@pytest.mark.parametrize("name", list(registry))
def test_registry_quantize_dequantize(name, gen):
    fmt = registry[name]
    rows = 2 * fmt.block_rows if fmt.block_rows > 1 else 6
    k = 2 * fmt.block_size if fmt.block_rows > 1 else max(4 * fmt.block_size, 128)
    shape = (rows, k) if fmt.block_rows > 1 else (2, rows // 2, k)
    x = adversarial(gen, shape, fmt)
    got, want = run_both(x, name)
    assert_same(got, want)
    for dtype in (torch.float32, torch.bfloat16):
        assert_same_values(kq.dequantize(want.to(DEV), dtype), reference.dequantize(want, dtype))


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2", "mxint8",
                                  "int3_fp16", "int8_affine_g32", "fp8_e5m2_fp32"])
def test_dequantize_every_code(name, gen):
    """Every element code (NaN and Inf codes included) under every kind of scale value:
    E8M0 bytes 0 (2^-127, a float32 subnormal), 254 and 255 (NaN), UE4M3 subnormals and NaN."""
    fmt = registry[name]
    bits = fmt.element.bits
    q = reference.quantize(torch.randn(8, 8 * fmt.block_size, generator=gen), name)
    n = q.padded_shape.numel()
    codes = torch.arange(n, dtype=torch.int64).remainder(1 << bits)
    codes = codes[torch.randperm(n, generator=gen)].to(torch.uint8).reshape(q.padded_shape)
    q.data = pack_codes(codes, bits)
    q.scales = _random_raw_scales(q, gen, ue4m3_top=128, spread=20)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert_same_values(kq.dequantize(q.to(DEV), dtype), reference.dequantize(q, dtype))


@pytest.mark.parametrize("name", ["mxfp4", "nvfp4", "int4_affine_g32", "fp8_e4m3_block128x128"])
def test_ragged_shapes_and_padding(name, gen):
    fmt = registry[name]
    shape = (fmt.block_rows + 3, fmt.block_size * 3 + 5) if fmt.block_rows > 1 else (5, fmt.block_size * 3 + 5)
    x = adversarial(gen, shape, fmt, dtype=torch.float16)
    got, want = run_both(x, name, pad=True)
    assert_same(got, want)
    out = kq.dequantize(want.to(DEV), torch.float32)
    assert out.shape == x.shape
    assert_same_values(out, reference.dequantize(want, torch.float32))


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4"])
def test_strided_input(name, gen):
    base = adversarial(gen, (6, 192), registry[name])
    x = base[:, 32:160]  # rows strided, last dim contiguous
    assert not x.is_contiguous()
    assert_same(*run_both(x, name))


# ---- scale rules ---------------------------------------------------------------------
@pytest.mark.parametrize("rule", ["floor", "ceil", "even", "rceil"])
@pytest.mark.parametrize("name", MX)
def test_e8m0_rules(name, rule, gen):
    x = adversarial(gen, (4, 128), registry[name], dtype=torch.float32)
    assert_same(*run_both(x, name, scale_rule=rule))


@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("convention", ["modelopt", "torchao", "compressed-tensors"])
@pytest.mark.parametrize("dtype", TWO_LEVEL_DTYPES)
def test_two_level(convention, dynamic, dtype, nonfinite, gen):
    x = adversarial(gen, (6, 64), registry["nvfp4"], dtype=dtype, nonfinite=nonfinite)
    a = x.float().abs()
    amax = float(torch.where(torch.isfinite(a), a, 0).amax())
    gs = None if dynamic else amax / 2688.0 * 0.37  # some blocks saturate
    assert_same(*run_both(x, "nvfp4", convention=convention, global_scale=gs))


def test_two_level_block_scale_underflow(gen):
    """Blocks whose scale rounds to E4M3 zero: ModelOpt divides by zero (0/0 NaN codes).
    Also under a given global scale (blocks of 2^-23 with 0.05, which the property test of
    requantization found: saturated codes over a zero scale)."""
    x = torch.randn(4, 64, generator=gen)
    x[1] *= 1e-7
    x[1, :16] = 0.0
    x[0, 0] = 1e3
    tiny = torch.full((2, 64), 2.0 ** -23)
    tiny[1, 16:32] *= -1
    for conv in ("modelopt", "torchao", "compressed-tensors"):
        assert_same(*run_both(x.to(DEV), "nvfp4", convention=conv))
        assert_same(*run_both(tiny.to(DEV), "nvfp4", convention=conv, global_scale=0.05))


# ---- rounding, overflow and non-finite policies ----------------------------------------
@pytest.mark.parametrize("nonfinite", ["propagate", "zero"])
@pytest.mark.parametrize("overflow", ["saturate", "native"])
@pytest.mark.parametrize("rounding", ["nearest_even", "nearest_away"])
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "mxfp8_e4m3", "fp8_e5m2_fp16", "int4_fp32", "int8_affine_g32"])
def test_policies(name, rounding, overflow, nonfinite, gen):
    x = adversarial(gen, (4, 64), registry[name], nonfinite=True)
    assert_same(*run_both(x, name, rounding=rounding, overflow=overflow, nonfinite=nonfinite))


@pytest.mark.parametrize("name", ["nvfp4", "mxfp8_e5m2", "fp8_e4m3_fp16"])
def test_nonfinite_error(name, gen):
    x = adversarial(gen, (4, 64), registry[name], nonfinite=True)
    with pytest.raises(ValueError, match="NaN or Inf") as e1:
        kq.quantize(x, name, nonfinite="error")
    with pytest.raises(ValueError, match="NaN or Inf") as e2:
        reference.quantize(x.cpu(), name, nonfinite="error")
    assert str(e1.value) == str(e2.value)
    # finite input: both succeed identically, or both raise the element encoder's error
    # (ModelOpt divides by a block scale that rounded to zero: x/0 = Inf)
    y = adversarial(gen, (4, 64), registry[name])
    try:
        want = reference.quantize(y.cpu(), name, nonfinite="error")
    except ValueError as e:
        with pytest.raises(ValueError) as e3:
            kq.quantize(y, name, nonfinite="error")
        assert str(e3.value) == str(e)
    else:
        assert_same(kq.quantize(y, name, nonfinite="error"), want)


def test_stochastic_is_unsupported():
    assert kq.unsupported_reason(registry["mxfp4"], "stochastic")
    with pytest.raises(NotImplementedError):
        kq.quantize(torch.ones(2, 32, device=DEV), "mxfp4", rounding="stochastic")


# ---- scale layouts ---------------------------------------------------------------------
@pytest.mark.parametrize("layout", list(SCALE_LAYOUTS))
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "mxfp8_e4m3", "fp8_e4m3_block128"])
def test_gemm_scale_layouts(name, layout, gen):
    fmt = registry[name]
    x = adversarial(gen, (33, fmt.block_size * 5), fmt)  # pads rows and scale columns
    got = kq.quantize_for_gemm(x, name, scale_layout=layout)
    want = reference.quantize(x.cpu(), name)
    assert torch.equal(got.data.cpu(), want.data)
    lay = get_scale_layout(layout)
    assert torch.equal(_bits(got.scales.cpu()), _bits(lay.swizzle(want.scales)))
    assert (got.rows, got.cols) == tuple(want.scales.shape)
    if want.global_scale is not None:
        assert torch.equal(got.global_scale.cpu(), want.global_scale)


def test_config_override(gen):
    x = adversarial(gen, (8, 256), registry["mxfp4"])
    cfg = kq.QuantizeConfig(tile_rows=2, tile_cols=64, num_warps=1)
    assert_same(kq.quantize(x, "mxfp4", config=cfg), reference.quantize(x.cpu(), "mxfp4"))
    with pytest.raises(ValueError, match="does not tile"):
        kq.quantize(x, "mxfp4", config=kq.QuantizeConfig(3, 64))


@pytest.mark.parametrize("name,kw", [("nvfp4", {}), ("nvfp4", {"global_scale": 0.01}), ("mxfp4", {}),
                                     ("mxfp8_e4m3", {}), ("int4_affine_g128", {})])
def test_program_loops(name, kw, gen):
    """Programs that loop over several column tiles (``k_tiles``) give the reference's bits:
    K a multiple of their span (whole tiles: the packed path prefetches the next tile) or
    not (a masked tail)."""
    for cols in (4 * 128, 5 * 128):
        x = adversarial(gen, (6, cols), registry[name])
        for kt in (1, 2, 3, 4):
            cfg = kq.QuantizeConfig(tile_rows=2, tile_cols=128, num_warps=1, k_tiles=kt)
            assert_same(kq.quantize(x, name, config=cfg, **kw), reference.quantize(x.cpu(), name, **kw))
    with pytest.raises(ValueError, match="k_tiles"):
        kq.quantize(x, name, config=kq.QuantizeConfig(2, 128, 1, k_tiles=0), **kw)
    q = reference.quantize(x.cpu(), name, **kw).to(DEV)
    with pytest.raises(ValueError, match="k_tiles"):
        kq.dequantize(q, config=kq.QuantizeConfig(2, 128, 1, k_tiles=2))


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "mxfp8_e4m3", "int4_affine_g128", "fp8_e4m3_block128x128"])
def test_default_configs_tile_every_shape(name):
    """The default tilings (quantize, packed or not; dequantize) are valid for the format and
    bounded in work per program, from one row / one block up to wide tensors."""
    fmt = registry[name]
    b, br = fmt.block_size, fmt.block_rows
    for rows in (br, 3 * br, 1000 * br, 16384):
        for k in (b, 3 * b, 4096 + b, 16384):
            for cfg in (kq.choose_config(fmt, rows, k), kq.choose_config(fmt, rows, k, packed=True),
                        kq.choose_dequantize_config(fmt, rows, k)):
                tuning.check_config(cfg, fmt)
                assert cfg.tile_rows * cfg.tile_cols <= max(32768, br * 1024) and cfg.num_warps in (1, 2, 4, 8)
                assert cfg.tile_rows * cfg.tile_cols >= 128 * cfg.num_warps or cfg.num_warps == 1  # >= 4 per thread
                assert 1 <= cfg.k_tiles <= -(-k // cfg.tile_cols)  # no program past the last column
            assert kq.choose_dequantize_config(fmt, rows, k).k_tiles == 1



# ---- tuning switches and lazy device code ---------------------------------------------
@pytest.fixture
def launches(monkeypatch):
    """The constexprs of every quantize / dequantize launch, by kernel name (launches still run)."""
    from microscale.runtime import launch as rl

    seen = {}
    real = rl.launch

    def spy(kernel, grid, *args, **kw):
        seen.setdefault(kernel.__name__, []).append(kw)
        return real(kernel, grid, *args, **kw)

    monkeypatch.setattr(rl, "launch", spy)
    return seen


def test_tuning_override_switches_paths_bit_identically(launches, gen):
    """Each QuantTuning field reaches its kernel switch, inside ``override`` only, and every
    setting gives the reference's bits."""
    x = adversarial(gen, (8, 4096), registry["mxfp4"])
    want = reference.quantize(x.cpu(), "mxfp4")
    cfg = kq.QuantizeConfig(2, 128, 1, k_tiles=4)  # looping programs: the prefetch applies
    on = tuning.current()
    assert on == tuning.QuantTuning() and on.packed and on.prefetch and on.pdl and on.deq_cache_hints
    for fields in ({}, {"packed": False}, {"prefetch": False}, {"deq_cache_hints": False}, {"pdl": False}):
        launches.clear()
        with tuning.override(**fields) as t:
            assert tuning.current() is t and all(getattr(t, k) == v for k, v in fields.items())
            assert_same(kq.quantize(x, "mxfp4", config=cfg), want)
            assert_same_values(kq.dequantize(want.to(DEV), torch.bfloat16),
                               reference.dequantize(want, torch.bfloat16))
        qk, dk = launches["_quantize_kernel"][0], launches["_dequantize_kernel"][0]
        assert qk["PK"] == t.packed and qk["PREFETCH"] == t.prefetch and dk["HINTS"] == t.deq_cache_hints
        if not t.pdl:
            assert not qk["PDL"] and not dk["PDL"]
    assert tuning.current() == on
    with pytest.raises(TypeError, match="unknown QuantTuning field"):
        with tuning.override(packd=False):
            pass


def test_quant_package_imports_no_device_code():
    """The quant package's host modules import neither Triton nor the launcher nor the device
    code at module level (``import microscale.quant`` works without Triton); the device
    modules load on first launch."""
    import ast
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(kq.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [f"{node.module or ''}.{a.name}" for a in node.names]
            else:
                continue
            for m in mods:
                assert not {"triton", "launch", "_kernels"} & set(m.split(".")), (path.name, m)
    code = ("import sys, microscale.quant as q; from microscale.formats import registry; "
            "q.unsupported_reason(registry['nvfp4']); "
            "print(sorted(m for m in sys.modules if m.startswith('microscale.quant._kernels.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=root.parents[1])
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


# ---- fused quantizers ------------------------------------------------------------------
def _close_codes(got, want, max_frac=0.01):
    """Fused prologues round differently from the torch reference in float32 (reduction
    order, sigmoid): codes may move by one step at rounding boundaries, rarely."""
    assert got.data.shape == want.data.shape and got.scales.shape == want.scales.shape
    bits = want.fmt.element.bits
    ca = unpack_codes(got.data.cpu(), bits, want.padded_shape[-1])
    cb = unpack_codes(want.data, bits, want.padded_shape[-1])
    frac = (ca != cb).float().mean().item()
    assert frac <= max_frac, frac
    a = reference.dequantize(got.to("cpu"))
    b = reference.dequantize(want)
    assert (a - b).norm() <= 1e-2 * b.norm()


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "mxfp8_e4m3", "int8_fp32"])
def test_rmsnorm_quantize(name, gen):
    from microscale.quant import fused
    x = (torch.randn(5, 256, generator=gen) * 3).to(torch.bfloat16)
    w = (torch.rand(256, generator=gen) + 0.5).to(torch.bfloat16)
    gs = 1.0 / 448 if registry[name].global_scale else None
    got = fused.rmsnorm_quantize(x.to(DEV), w.to(DEV), name, eps=1e-5, global_scale=gs,
                                 config=kq.QuantizeConfig(4, 64, 4))
    want = reference_fused.rmsnorm_quantize(x, w, name, eps=1e-5, global_scale=gs)
    _close_codes(got, want)


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "mxfp8_e4m3"])
def test_silu_mul_quantize(name, gen):
    from microscale.quant import fused
    g = (torch.randn(3, 2, 128, generator=gen) * 2).to(torch.bfloat16)
    u = torch.randn(3, 2, 128, generator=gen).to(torch.bfloat16)
    gs = 1.0 / 448 if registry[name].global_scale else None
    got = fused.silu_mul_quantize(g.to(DEV), u.to(DEV), name, global_scale=gs)
    want = reference_fused.silu_mul_quantize(g, u, name, global_scale=gs)
    _close_codes(got, want)


# ---- the element encoder/decoder helpers alone, over all bf16 bit patterns ---------------
import triton  # noqa: E402

from microscale.formats import ELEMENTS  # noqa: E402
from microscale.quant._kernels import common as _kc  # noqa: E402
from microscale.quant._kernels import elements as _ke  # noqa: E402


@triton.jit
def _encode_probe(x_ptr, out_ptr, n, BLOCK: tl.constexpr, BITS: tl.constexpr, IS_INT: tl.constexpr,
                  SIGNED: tl.constexpr, FRAC_SCALE: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                  MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr, OVF_CODE: tl.constexpr, MIN_NORMAL: tl.constexpr,
                  SUB_C: tl.constexpr, SUB_C_BITS: tl.constexpr, INV_MIN_SUB: tl.constexpr, ROUNDING: tl.constexpr,
                  NONFIN: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + o, mask=o < n, other=0.0)
    c = _ke._encode(x, BITS, IS_INT, SIGNED, FRAC_SCALE, MBITS, BIAS, MAX_CODE, NAN_CODE, OVF_CODE, MIN_NORMAL,
                   SUB_C, SUB_C_BITS, INV_MIN_SUB, ROUNDING, NONFIN)
    tl.store(out_ptr + o, c.to(tl.uint8), mask=o < n)


@pytest.mark.parametrize("policy", [("nearest_even", "saturate", "propagate"), ("nearest_away", "native", "zero")])
@pytest.mark.parametrize("elem", ["e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "int4", "uint8", "mxint8"])
def test_element_encode_all_bf16_patterns(elem, policy):
    """The kernels' generic encoder equals ElementCodec.encode on every bf16 bit pattern
    (all magnitudes, subnormals, Inf, NaN of both signs) scaled into the codec's range."""
    e = ELEMENTS[elem]
    rounding, overflow, nonfinite = policy
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    x = torch.cat([x, x * 2.0 ** -100, x * 2.0 ** 100, x * 2.0 ** 120])  # shift subnormal/huge into range
    want = e.encode(x, rounding, overflow, nonfinite)
    p = params._element_params(e, Overflow(overflow))
    p = {k: v for k, v in p.items() if k not in ("ELEM_MAX", "EMAX", "M_ELEM")}
    out = torch.empty(x.numel(), dtype=torch.uint8, device=DEV)
    n = x.numel()
    _encode_probe[(triton.cdiv(n, 4096),)](x.to(DEV), out, n, BLOCK=4096, FRAC_SCALE=float(2.0 ** e.frac_bits),
                                          ROUNDING=0 if rounding == "nearest_even" else 1,
                                          NONFIN=0 if nonfinite == "propagate" else 1, **p, enable_fp_fusion=False)
    got = out.cpu() & ((1 << e.bits) - 1)
    bad = (got != want).nonzero()
    assert bad.numel() == 0, f"{bad.numel()} mismatches, first x={x[bad[0]].item()} got {got[bad[0]].item()} " \
                             f"want {want[bad[0]].item()}"


# ---- the clean-tile fast path ----------------------------------------------------------
def activation_like(gen, shape, fmt, dtype=torch.bfloat16):
    """Finite, moderate inputs (per-row magnitudes 2^-6..2^6) so most tiles take the
    kernels' clean-tile fast path; plus exact ties of the element grid, a zero block,
    float32-subnormal and tiny elements next to normal ones, and one huge row (its tiles
    take the general path)."""
    k = shape[-1]
    b = get_format(fmt).block_size
    x = torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-6, 6, shape[:-1] + (1,), generator=gen).float())
    x2 = x.reshape(-1, k)
    n = x2.shape[0]
    ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0,
                         0.125, 5.5, 7.0, 0.375, -0.0, 13.0, 15.0, 112.0, 448.0, 240.0, 0.0625, 0.1875, 1.0, 2.0, 4.0,
                         -6.0, 0.5])
    x2[0, :b] = ties.repeat(b // 32 + 1)[:b] * 2.0 ** int(torch.randint(-3, 3, (1,), generator=gen))
    if k >= 2 * b:
        x2[0, b:2 * b] = 0.0
    if n > 1:
        x2[1, : b // 2] *= 2.0 ** -40
        x2[1, b // 2] = 2.0 ** -130
    if n > 2 and k >= 3 * b:
        x2[2, 2 * b:3 * b] = ties.repeat(b // 32 + 1)[:b] * 2.0 ** -7  # ties relative to a smaller scale
    if n > 5:
        x2[n - 1] *= 2.0 ** 90  # not clean: the general path
    return x.reshape(shape).to(dtype).to(DEV)


FAST_CASES = [("nvfp4", {}), ("nvfp4", {"convention": "torchao"}), ("nvfp4", {"convention": "compressed-tensors"}),
              ("nvfp4", {"global_scale": "static"}), ("mxfp4", {}), ("mxfp4", {"scale_rule": "rceil"}),
              ("mxfp4", {"scale_rule": "even"}), ("mxfp4", {"scale_rule": "ceil"}), ("mxfp6_e2m3", {}),
              ("mxfp6_e3m2", {}), ("mxfp8_e4m3", {}), ("mxfp8_e5m2", {}), ("mxint8", {}), ("nvfp8", {}),
              ("fp4_fp16", {}), ("int4_fp32", {}), ("mxfp4", {"rounding": "nearest_away"}),
              ("mxfp8_e4m3", {"overflow": "native"}), ("fp8_e4m3_block128x128", {})]


FAST_PARAMS = [(c, d) for c in FAST_CASES for d in (torch.bfloat16, torch.float32, torch.float16)
               if not (d is torch.float16 and registry[c[0]].block_rows > 1)]  # 2-D blocks: two dtypes are enough


@pytest.mark.parametrize("case,dtype", FAST_PARAMS,
                         ids=lambda v: str(v).replace("torch.", "") if isinstance(v, torch.dtype)
                         else v[0] + "-" + "-".join(map(str, v[1].values())))
def test_fast_path_activation_like(case, dtype, gen):
    """Activation-like inputs with small tiles: most tiles are clean (fast path), the
    huge last row's are not; both bit-identical to the reference."""
    name, kw = case
    kw = dict(kw)
    fmt = registry[name]
    rows = 2 * fmt.block_rows if fmt.block_rows > 1 else 12
    k = 2 * fmt.block_size if fmt.block_rows > 1 else 8 * fmt.block_size
    x = activation_like(gen, (rows, k), name, dtype)
    if kw.get("global_scale") == "static":
        kw["global_scale"] = float(x[:-1].float().abs().amax()) / 2688.0
    cfg = kq.QuantizeConfig(max(2, fmt.block_rows), max(64, fmt.block_size), 4)
    for config in (cfg, None):
        assert_same(kq.quantize(x, name, config=config, **kw), reference.quantize(x.cpu(), name, **kw))


# ---- the kernels compile for the GPU ----------------------------------------------------
def test_kernels_compile_for_sm90(run_tool):
    """The interpreter runs a run-time ``if`` in Python, so it accepts branches that give a
    variable different types/shapes; the compiler does not. Compile (no GPU needed: the
    triton wheel's ptxas) one launch per kind of run-time branch for sm_90
    (``tools/compile_check.py --smoke``; without ``--smoke`` it compiles every
    specialization the library and the GPU benchmark launch)."""
    r = run_tool("compile_check.py", "--smoke", "-j", "2")
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]


def test_quantize_kernel_never_triggers_its_dependents(run_tool):
    """Launched as programmatic dependents (Hopper+), the quantize and dequantize kernels
    wait for the previous kernel before their first global load; only dequantize lets the
    next kernel launch early (quantize's codes may be the next ``ms.linear``'s weight,
    which the decode GEMV reads ahead of its own wait). Checked on PTX compiled for sm_90
    (``tools/compile_check.py --pdl-order``)."""
    r = run_tool("compile_check.py", "--pdl-order")
    assert r.returncode == 0 and r.stdout.count(" ok") == 6, r.stdout[-3000:] + r.stderr[-3000:]


def test_markstein_division_keeps_the_sign_of_zero(monkeypatch):
    """The GPU fast path divides by Markstein's sequence; for x = -0 its last fma gives
    +0 + -0 = +0, so the sign must be put back (x / d keeps x's sign, d > 0). With
    power-of-two divisors every step is exact, so the interpreter's fma (which rounds
    twice) runs the same sequence bit for bit."""
    monkeypatch.setattr(params, "_MARKSTEIN", True)
    t = torch.tensor([448.0, -0.0, 0.0, -1.5, 2.0, -0.0, 0.25, -448.0, 3.0, -0.0, 1.0, 6.0, -0.0, 0.5, -2.0, 0.0])
    x = torch.stack([t * 2.0**e for e in range(-3, 5)]).repeat(2, 16).to(DEV)
    for kw in ({"rounding": "nearest_away"}, {"overflow": "native"}, {}):
        got = kq.quantize(x, "nvfp8", **kw)
        want = reference.quantize(x.cpu(), "nvfp8", **kw)
        assert torch.equal(got.data.cpu(), want.data), kw
        assert bool((want.data == 0x80).any())


@pytest.mark.parametrize("name", ["int4_affine_g128", "int8_affine_g32", "int4_affine_g32"])
def test_affine_markstein_path_is_the_reference(name, monkeypatch):
    """Affine formats divide by Markstein's sequence in tiles where it is RN(x / s) (finite |x| < 2^60, scales not
    saturated), by IEEE division elsewhere: both paths give the reference's codes, zero points and scales, with
    tiles of each kind in one tensor (a huge value, +-Inf, NaN, an all-zero block, subnormal-sized blocks). A
    fixed seed: the interpreter's fma rounds twice, so only values within an ulp of a rounding tie could tell it
    from the GPU's, and the GPU tests cover the kernel as compiled."""
    monkeypatch.setattr(params, "_MARKSTEIN", True)
    g = torch.Generator().manual_seed(13)
    x = torch.randn(64, 512, generator=g) * 3
    x[1:17] *= 1e-30  # (tiles of tiny values: s far below 2^-40 in fp16 terms: zero / subnormal scales)
    x[20, 5] = 3e20  # a value past 2^60's check: its tile takes IEEE division
    x[40, 7], x[41, 9], x[42, 11] = float("inf"), float("-inf"), float("nan")
    x[50] = 0.0
    for dt in (torch.bfloat16, torch.float32):
        xx = x.to(dt).to(DEV)
        got = kq.quantize(xx, name)
        want = reference.quantize(xx.cpu(), name)
        assert torch.equal(got.data.cpu(), want.data) and torch.equal(got.zero_points.cpu(), want.zero_points)
        assert torch.equal(got.scales.cpu().view(torch.int16), want.scales.view(torch.int16))


def _encode_mag_rne_p2_model(a: torch.Tensor, bb: torch.Tensor, e) -> torch.Tensor:
    """``_ke._encode_mag_rne_p2`` operation for operation (float32 / int32 torch on CPU: the
    fma's product is a power of two times 2^(23 - mbits), exact, so mul + add round once)."""
    sh = 23 - e.mbits
    lo = torch.clamp(bb + (1 - e.bias), min=1) << 23
    mb = torch.maximum(a.view(torch.int32) & 0x7F800000, lo)
    s = (mb.view(torch.float32) * 2.0 ** sh + a).view(torch.int32)
    code = (s - mb) + ((mb >> sh) - ((lo >> sh) + (sh << 23)))
    return torch.clamp(code, max=e.max_code)


@pytest.mark.parametrize("elem", ["e2m1", "e2m3", "e3m2", "e4m3", "e5m2"])
def test_encode_mag_rne_p2_every_bf16_and_scale(elem):
    """The MX fast path folds the E8M0 scale 2^k into the one-add encoder: its code for x
    equals ElementCodec.encode(x / 2^k) (the reference's division) for every non-negative
    finite bf16 x below 2^100 (the clean-tile bound) and every scale byte for which the
    kernel takes the fast path (bb >= bias, or x = 0: an all-zero block; any rule gives a
    block with amax < 2^100 a byte <= 127 + 100 - emax)."""
    e = ELEMENTS[elem]
    a = torch.arange(0, 0x7180, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    for bb0 in range(0, 255, 15):
        bb = torch.arange(bb0, min(bb0 + 15, 255), dtype=torch.int32)[:, None]
        x = a[None, :].expand(bb.shape[0], -1)
        got = _encode_mag_rne_p2_model(x.contiguous(), bb, e)
        scale = ((bb.to(torch.int64) - 127).to(torch.float64).exp2()).to(torch.float32)
        want = e.encode(x / scale, "nearest_even", "saturate", "propagate").to(torch.int32)
        ok = ((bb >= e.bias) | (x == 0)) & (bb <= 227 - e.emax)  # a clean block's amax < 2^100 bounds its scale
        bad = ((got != want) & ok).nonzero()
        assert bad.numel() == 0, f"{elem}: {bad.shape[0]} mismatches, first bb={int(bb[bad[0, 0]])} " \
                                 f"x={x[bad[0, 0], bad[0, 1]].item()} got {got[bad[0, 0], bad[0, 1]].item()} " \
                                 f"want {want[bad[0, 0], bad[0, 1]].item()}"


def _encode_p2_bf16x2_model(w: torch.Tensor, bb: torch.Tensor, e) -> torch.Tensor:
    """``_ke._encode_p2_bf16x2`` operation for operation on int32 words of two bf16 (int64
    torch, wrapped to 32 bits where the kernel's int32 ops wrap; the bf16 fma is exact in
    float32 and rounded to bf16 on the bits, as the hardware's single rounding)."""
    def wrap(v):
        return ((v + 2**31) % 2**32) - 2**31

    def lanes(v):
        return v & 0xFFFF, (v >> 16) & 0xFFFF

    def u16(a, b, op):
        (al, ah), (bl, bh) = lanes(a), lanes(b)
        return wrap(op(al, bl) | (op(ah, bh) << 16))

    def bf16_rne(f):
        b = f.view(torch.int32).to(torch.int64)
        return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF

    def f32(v):
        return (v << 16).to(torch.int32).view(torch.float32)

    sh, up = 7 - e.mbits, 1 << (16 - e.bits)
    c2 = (sh << 7) * 0x10001
    w = w.to(torch.int64)
    a = w & 0x7FFF7FFF
    lo16 = torch.clamp(bb + (1 - e.bias), min=1) << 7
    lo2 = lo16 | (lo16 << 16)
    mb = u16(w & 0x7F807F80, lo2, torch.maximum)
    (ml, mh), (al, ah) = lanes(mb), lanes(a)
    s = bf16_rne(f32(ml) * 2.0 ** sh + f32(al)) | (bf16_rne(f32(mh) * 2.0 ** sh + f32(ah)) << 16)
    code = wrap(wrap(s * up) + wrap(mb * ((up >> sh) - up) - wrap((c2 + (lo2 >> sh)) * up)))
    code = u16(code, torch.tensor((e.max_code * up) * 0x10001), torch.minimum)
    return code | (w & 0x80008000)


def test_encode_p2_bf16x2_every_bf16_and_scale(gen):
    """The packed MXFP4 path's encoder (two bf16 per 32-bit word, the scale folded in, codes
    at the top of each 16-bit lane with x's sign) gives ElementCodec.encode(x / 2^k) for
    every scale byte the fast path takes and every bf16 x that a block with that scale can
    hold (|x| < 2^(k + emax + 1) under every E8M0 rule, below 2^100; x = 0 alone when the
    byte is below the bias: an all-zero block), both signs, in either lane."""
    e = ELEMENTS["e2m1"]
    for bb in range(0, 228 - e.emax):
        top = min((bb + e.emax + 1) << 7, 0x7180) if bb >= e.bias else 1
        mag = torch.arange(0, top, dtype=torch.int64)
        lo = mag | ((mag % 2) << 15)
        hi = mag[torch.randperm(top, generator=gen)] | ((torch.rand(top, generator=gen) < 0.5).long() << 15)
        got = _encode_p2_bf16x2_model(lo | (hi << 16), torch.tensor(bb), e)
        got = torch.stack([(got >> 12) & 0xF, (got >> 28) & 0xF])
        vals = torch.stack([lo, hi]).to(torch.int16).view(torch.bfloat16).float()
        want = e.encode(vals / 2.0 ** (bb - 127), "nearest_even", "saturate", "propagate").to(torch.int64)
        bad = (got != want).nonzero()
        assert bad.numel() == 0, f"bb={bb}: {bad.shape[0]} mismatches, first (lane, index) {bad[0].tolist()}"


def test_round_to_odd_bf16_then_packed_encoder(gen):
    """The packed path of the two-level formats rounds each float32 x / op to odd in bf16
    (``_rto_bf16x2``: truncate, set the last bit when inexact) before the bf16 encoder:
    equal to ElementCodec.encode on the float32 for values around every E2M1 grid point
    and midpoint (+-300 ulps), float32 subnormals and random values below 32."""
    e = ELEMENTS["e2m1"]
    pts = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 16.0])
    near = (pts.view(torch.int32)[:, None] + torch.arange(-300, 301, dtype=torch.int32)[None, :]).reshape(-1)
    rnd = (torch.rand(200000, generator=gen) * 32.0).view(torch.int32)
    sub = torch.randint(0, 1 << 23, (1000,), generator=gen, dtype=torch.int32)
    xs = torch.cat([near[near >= 0], rnd, sub]).view(torch.float32)
    xs = xs[xs < 32.0]
    xs = torch.cat([xs, xs.flip(0)])[: xs.numel() // 2 * 2]  # pairs: one per lane
    b = xs.view(torch.int32).to(torch.int64)
    rto = ((b >> 16) & 0xFFFF) | ((b & 0xFFFF) != 0).long()
    lo, hi = rto[0::2], rto[1::2]
    got = _encode_p2_bf16x2_model(lo | (hi << 16), torch.tensor(127), e)
    got = torch.stack([(got >> 12) & 0xF, (got >> 28) & 0xF], dim=1).reshape(-1)
    want = e.encode(xs, "nearest_even", "saturate", "propagate").to(torch.int64)
    bad = (got != want).nonzero()
    assert bad.numel() == 0, f"{bad.numel()} mismatches, first x={xs[bad[0]].item()!r}"


def test_packed_path_every_bf16_magnitude(gen):
    """The kernel's packed bf16 path on blocks that hold every bf16 magnitude below 2^100
    (both signs, grid ties included) next to a block maximum that sets the scale, for
    every E8M0 rule: bit-identical to the reference."""
    mag = torch.arange(0, 0x7180 // 31 * 31, dtype=torch.int32)
    v = (mag | ((mag % 3 == 1).to(torch.int32) << 15)).to(torch.int16).view(torch.bfloat16)
    x = v.reshape(-1, 31)
    amax = x.float().abs().amax(dim=1, keepdim=True)
    x = torch.cat([x, (amax * (1 + torch.rand(amax.shape, generator=gen))).to(torch.bfloat16)], dim=1)
    x = x[: x.shape[0] // 8 * 8].reshape(-1, 256)  # 8 blocks of 32 per row
    assert params._packed_bf16(x, get_format("mxfp4"), Rounding.NEAREST_EVEN, Overflow.SATURATE,
                               NonFinite.PROPAGATE, 0)
    for rule in ("floor", "ceil", "even", "rceil"):
        assert_same(kq.quantize(x.to(DEV), "mxfp4", scale_rule=rule), reference.quantize(x, "mxfp4", scale_rule=rule))


@pytest.mark.parametrize("name", ["mxfp4", "mxfp6_e3m2", "mxfp6_e2m3"])
def test_p2_fast_path_tiny_and_zero_blocks(name, gen):
    """Blocks whose E8M0 scale is below the element bias (amax near 2^-125) leave the
    fast path unless they are all zeros; next to them, normal and zero blocks."""
    b = get_format(name).block_size
    x = torch.randn(4, 8 * b, generator=gen)
    x[0, :b] = 0.0
    x[1, b:2 * b] *= 2.0 ** -126
    x[2, 2 * b:3 * b] *= 2.0 ** -120
    x[3, 3 * b:4 * b] = 2.0 ** -133
    for dtype in (torch.bfloat16, torch.float32):
        xd = x.to(dtype)
        for rule in ("floor", "ceil", "even", "rceil"):
            assert_same(kq.quantize(xd.to(DEV), name, scale_rule=rule), reference.quantize(xd, name, scale_rule=rule))
        xz = xd.clone()
        xz[1:] = 0.0  # tiles of zero blocks and one normal row only: clean
        assert_same(kq.quantize(xz.to(DEV), name), reference.quantize(xz, name))


# ---- dequantize paths: table-decoded 4-bit codes, the byte path of 8-bit codes ------------
DEQ_PATHS = ["nvfp4", "mxfp4", "fp4_fp16", "int4_affine_g128", "int4_affine_g32", "int4_fp32", "mxint4",
             "mxfp8_e4m3", "mxfp8_e5m2", "mxint8", "int8_affine_g32", "fp8_e4m3_block128x128"]


def _random_raw_scales(q, gen, ue4m3_top: int, spread: int) -> torch.Tensor:
    """Random raw scales shaped like q's: E8M0 every byte (0 / 1 / 254 / 255 first), UE4M3
    bytes below ``ue4m3_top`` (subnormals and NaN first), other codecs normal values times
    2^[-spread, spread)."""
    fmt = q.fmt
    m = q.scales.numel()
    if fmt.scale.name == "e8m0":
        raw = torch.cat([torch.tensor([0, 1, 254, 255, 127], dtype=torch.uint8),
                         torch.randint(0, 256, (m,), generator=gen, dtype=torch.uint8)])[:m]
        return raw.reshape(q.scales.shape)
    if fmt.scale.name == "ue4m3":
        raw = torch.cat([torch.tensor([0, 1, 7, 0x7E, 0x7F], dtype=torch.uint8),
                         torch.randint(0, ue4m3_top, (m,), generator=gen, dtype=torch.uint8)])[:m]
        return raw.view(torch.float8_e4m3fn).reshape(q.scales.shape)
    return (torch.randn(m, generator=gen) * 2.0 ** torch.randint(-spread, spread, (m,), generator=gen)).to(
        q.scales.dtype).reshape(q.scales.shape)


def _random_codes(q, gen):
    """``q`` with uniformly random element codes and random raw scales (every E8M0 byte
    incl. 0 / 254 / 255, every UE4M3 byte incl. subnormals and NaN, wide-range floats)."""
    fmt = q.fmt
    bits = fmt.element.bits
    codes = torch.randint(0, 1 << bits, tuple(q.padded_shape), generator=gen, dtype=torch.int64).to(torch.uint8)
    q.data = pack_codes(codes, bits)
    q.scales = _random_raw_scales(q, gen, ue4m3_top=256, spread=30)
    if q.zero_points is not None:
        q.zero_points = torch.randint(0, 256, tuple(q.zero_points.shape), generator=gen,
                                      dtype=torch.int64).to(torch.uint8)
    return q


@pytest.mark.parametrize("name", DEQ_PATHS)
@pytest.mark.parametrize("shape,config", [((16, 512), None),  # whole tiles (EVEN: no masks)
                                          ((16, 512), (8, 256, 4)),
                                          ((128, 256), (128, 128, 4)),
                                          ((37, 384), (8, 256, 4)),  # ragged rows and columns (masked)
                                          ((3, 4 * 128 + 128), None)])
def test_dequantize_paths_random_codes(name, shape, config, gen):
    """Random codes and raw scales (NaN / subnormal / huge scales, two-level global scale)
    through every dequantize path, whole and ragged tiles, bf16 / f16 / f32 outputs."""
    fmt = registry[name]
    rows = max(shape[0], fmt.block_rows) // fmt.block_rows * fmt.block_rows
    k = max(shape[1] // fmt.block_size, 1) * fmt.block_size
    q = _random_codes(reference.quantize(torch.randn(rows, k, generator=gen), name), gen)
    if q.global_scale is not None:
        q.global_scale = torch.tensor(3.0e-3 * (1 + torch.rand((), generator=gen).item()))
    cfg = None
    if config is not None:
        cfg = kq.QuantizeConfig(max(config[0], fmt.block_rows), max(config[1], fmt.block_size), config[2])
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert_same_values(kq.dequantize(q.to(DEV), dtype, config=cfg), reference.dequantize(q, dtype))


def _prmt_spec(a: int, b: int, sel: int) -> int:
    """PTX ISA, prmt.b32 default mode: bytes {b, a} numbered 0-7 (a = 0-3); for each result
    byte i, selector nibble i: bits 0-2 pick the source byte, bit 3 replicates its sign."""
    src = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    d = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byt = (src >> (8 * (nib & 7))) & 0xFF
        if nib & 8:
            byt = 0xFF if byt & 0x80 else 0
        d |= byt << (8 * i)
    return d


def _prmt_kernel(a_ptr, b_ptr, s_ptr, o_ptr, N: tl.constexpr):
    from microscale.quant._kernels import dequantize as _kd
    i = tl.arange(0, N)
    tl.store(o_ptr + i, _kd._prmt(tl.load(a_ptr + i), tl.load(b_ptr + i), tl.load(s_ptr + i)))


def test_prmt_model(gen):
    """The interpreter's model of prmt.b32 (what the GPU table decode runs) against the
    PTX ISA's definition, on random words and selectors and the ones the decode uses."""
    if DEV != "cpu":
        pytest.skip("interpreter model only")

    kern = triton.jit(_prmt_kernel)

    n = 256
    a = torch.randint(-2**31, 2**31, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
    b = torch.randint(-2**31, 2**31, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
    s = torch.randint(0, 1 << 16, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
    s[:4] = torch.tensor([0x5140, 0x7362, 0x6420, 0x7531], dtype=torch.int32)
    a[4], b[4], s[4] = -0x7F7F7F80, -0x7F7F7F80, 0x8F07  # 0x80808080, sign-replicate and copy
    o = torch.empty(n, dtype=torch.int32)
    kern[(1,)](a, b, s, o, N=n)
    for i in range(n):
        assert int(o[i]) & 0xFFFFFFFF == _prmt_spec(int(a[i]), int(b[i]), int(s[i])), i


@triton.jit
def _div_probe(a_ptr, d_ptr, r_ptr, q_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    a = tl.load(a_ptr + i, mask=m, other=1.0)
    d = tl.load(d_ptr + i, mask=m, other=1.0)
    r = _kc._rcp_rn_normal(d)
    tl.store(r_ptr + i, r, mask=m)
    tl.store(q_ptr + i, _kc._markstein_div(a, r, 0.0 - d), mask=m)


@pytest.mark.skipif(DEV == "cpu", reason="PTX inline assembly: GPU only")
def test_reciprocal_and_markstein_division_are_ieee_on_the_gpu(gen):
    """``_rcp_rn_normal`` (the in-range branch of rcp.rn) is RN(1/d) for every float32
    significand at the ends of the ranges the kernels use it on, and ``_markstein_div``
    with it is RN(a/d) (torch's CUDA division is IEEE) for every positive finite bf16 a
    in [2^-60, 2^64) against divisors spread over [2^-40, 2^60]."""
    sig = torch.arange(1 << 23, dtype=torch.int32, device=DEV)
    for e in (-100, -40, -1, 0, 1, 59, 100):
        d = ((sig | ((e + 127) << 23)).view(torch.float32))
        r = torch.empty_like(d)
        q = torch.empty_like(d)
        n = d.numel()
        _div_probe[(triton.cdiv(n, 1024),)](torch.ones_like(d), d, r, q, n, BLOCK=1024)
        assert torch.equal(r.view(torch.int32), (1.0 / d).view(torch.int32)), e
    a = (torch.arange(0x2180, 0x5F80, dtype=torch.int32, device=DEV) << 16).view(torch.float32)
    for _ in range(8):
        ex = torch.randint(-40, 61, a.shape, generator=gen, dtype=torch.int32).to(DEV)
        m = torch.randint(0, 1 << 23, a.shape, generator=gen, dtype=torch.int32).to(DEV)
        d = ((m | ((ex + 127) << 23)).view(torch.float32))
        r = torch.empty_like(d)
        q = torch.empty_like(d)
        _div_probe[(triton.cdiv(a.numel(), 1024),)](a, d, r, q, a.numel(), BLOCK=1024)
        assert torch.equal(q.view(torch.int32), (a / d).view(torch.int32))


@triton.jit
def _rint_probe(t_ptr, o_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(o_ptr + i, _kc._rint_s32(tl.load(t_ptr + i, mask=m, other=0.0)), mask=m)


@pytest.mark.skipif(DEV == "cpu", reason="PTX inline assembly: GPU only")
def test_rint_s32_rounds_ties_to_even_on_the_gpu():
    """``_rint_s32`` (the affine quantizer's one-instruction rounding) equals ``_round_int(t, 0)``'s
    nearest-even integer for every tie and its neighbours in [-600, 600] and random values."""
    ties = torch.arange(-1200, 1201, dtype=torch.float32) / 2
    t = torch.cat([ties, torch.nextafter(ties, ties + 1), torch.nextafter(ties, ties - 1),
                   torch.randn(100000) * 300]).to(DEV)
    o = torch.empty(t.shape, dtype=torch.int32, device=DEV)
    _rint_probe[(triton.cdiv(t.numel(), 1024),)](t, o, t.numel(), BLOCK=1024)
    assert torch.equal(o, torch.round(t).to(torch.int32))  # (torch.round: ties to even)


def test_host_int_helpers_match_triton():
    """The wrappers' host-side ceil-division / next power of two (triton's own are
    microseconds per host call) agree with triton's on the values the tilings use."""
    from microscale.runtime.launch import cdiv, next_pow2

    for n in range(1, 5000):
        assert next_pow2(n) == triton.next_power_of_2(n)
        for b in (1, 3, 16, 256, 4096):
            assert cdiv(n, b) == triton.cdiv(n, b)
    assert next_pow2(1 << 20) == 1 << 20 and next_pow2((1 << 20) + 1) == 1 << 21


@pytest.mark.skipif(DEV == "cpu", reason="CUDA graphs: GPU only")
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "mxfp8_e4m3"])
def test_quantize_captures_in_a_cuda_graph(name, gen):
    """``ms.quantize`` (a static global scale given as a Python float or a CUDA tensor, and
    the dynamic one) and ``ms.dequantize`` record into a CUDA graph, and a replay on new
    input in the captured buffer gives the eager result bit for bit."""
    import microscale as ms
    x = torch.randn(256, 512, generator=gen).to(DEV, torch.bfloat16)
    two = get_format(name).global_scale
    for gs in ((None, 0.75, torch.tensor(0.75, device=DEV)) if two else (None,)):
        kw = {} if gs is None else {"global_scale": gs}
        ms.dequantize(ms.quantize(x, name, **kw), torch.bfloat16)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            qg = ms.quantize(x, name, **kw)
            yg = ms.dequantize(qg, torch.bfloat16)
        x.copy_(torch.randn(256, 512, generator=gen).to(DEV, torch.bfloat16))
        graph.replay()
        qe = ms.quantize(x, name, **kw)
        assert torch.equal(qg.data, qe.data) and torch.equal(qg.scales.view(torch.uint8), qe.scales.view(torch.uint8))
        assert torch.equal(yg, ms.dequantize(qe, torch.bfloat16)), gs
        if two:
            assert torch.equal(qg.global_scale, qe.global_scale), gs


def test_kernel_entry_refuses_cpu_tensors_without_the_interpreter():
    """Outside the interpreter a CPU tensor at the kernels' entry points is a clear error (not
    Triton's "0 active drivers")."""
    from microscale.quant import quantize_for_gemm
    from microscale.runtime import target

    x = torch.randn(128, 64)
    with target.override(interpreting=False):
        with pytest.raises(ValueError, match="quantize_for_gemm: x is on cpu"):
            quantize_for_gemm(x, "mxfp8_e4m3")
        with pytest.raises(ValueError, match="quantize: x is on cpu"):
            kq.quantize(x, "mxfp4")
