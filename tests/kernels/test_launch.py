"""``runtime.launch.launch``: the cached-launcher fast path (CPU: its keying with a stub
kernel; GPU: real kernels whose arguments change alignment / specialization between calls,
each result checked against the reference)."""
from __future__ import annotations

import pytest
import torch

import microscale as ms
from microscale import reference
from microscale.runtime import launch as _launch


def test_fast_launcher_keys_on_triton_specializations(monkeypatch):
    """``runtime.launch.launch``: Triton's path on a miss; on a hit the compiled kernel's
    launcher with every parameter in order (defaults filled); a new key whenever an
    argument changes what Triton specializes on (alignment, == 1, % 16, dtype, constexpr)."""
    calls = []

    class Compiled:
        packed_metadata = function = object()

        def run(self, *a):
            calls.append(("hit",) + a[:3] + a[9:])

    class Param:
        def __init__(self, name, default=None):
            self.name, self.default = name, default

    class Fn:
        params = [Param("x"), Param("n"), Param("A"), Param("B", 7)]

        def __getitem__(self, grid):
            def runner(*a, **kw):
                calls.append(("miss", grid, a, tuple(sorted(kw.items()))))
                return Compiled()
            return runner

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    drv = type("Drv", (), {"get_current_device": staticmethod(lambda: 0),
                           "get_current_stream": staticmethod(lambda d: 0)})
    monkeypatch.setattr(_launch, "driver", type("D", (), {"active": drv})())
    fn = Fn()
    buf = torch.zeros(64, dtype=torch.float32)
    x, xo = buf[:16], buf[1:17]  # 16-byte aligned / not
    _launch.launch(fn, (4,), x, 32, A=3, num_warps=4)
    _launch.launch(fn, (4, 2), x, 48, A=3, num_warps=4)  # same specialization: a hit
    assert [c[0] for c in calls] == ["miss", "hit"]
    assert calls[1][1:4] == (4, 2, 1) and calls[1][4] is x and calls[1][5:] == (48, 3, 7)
    for args, kw in [((xo, 32), dict(A=3, num_warps=4)), ((x, 1), dict(A=3, num_warps=4)),
                     ((x, 33), dict(A=3, num_warps=4)), ((x.half(), 32), dict(A=3, num_warps=4)),
                     ((x, 32), dict(A=4, num_warps=4)), ((x, 32), dict(A=3, num_warps=8))]:
        n = len(calls)
        _launch.launch(fn, (1,), *args, **kw)
        assert calls[n][0] == "miss", (args, kw)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_results_follow_alignment_and_specialization():
    """Aligned, misaligned (storage offset), one-row and 16-multiple shapes in turn: the
    cached launcher must recompile wherever Triton would; every output matches the
    reference (quantize / dequantize bit-exact, linear within bf16 rounding)."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(5)
    buf = torch.randn(64 * 1024 + 64, device=dev, generator=g).to(torch.bfloat16)
    for rows, cols, off in [(64, 1024, 0), (64, 1024, 2), (1, 1024, 0), (64, 1024, 0), (48, 512, 6),
                            (64, 1024, 2)]:
        x = buf[off:off + rows * cols].view(rows, cols)
        for name in ("mxfp4", "nvfp4", "mxfp8_e4m3"):
            kw = dict(global_scale=0.5) if name == "nvfp4" else {}
            q = ms.quantize(x, name, **kw)
            r = reference.quantize(x.cpu(), name, **kw)
            case = (rows, cols, off, name)
            assert torch.equal(q.data.cpu(), r.data), case
            assert torch.equal(q.scales.cpu().view(torch.uint8), r.scales.view(torch.uint8)), case
            assert torch.equal(q.dequantize(torch.bfloat16).cpu(), r.dequantize(torch.bfloat16)), case
    w = ms.quantize(torch.randn(256, 1024, device=dev, generator=g), "nvfp4")
    wd = w.dequantize(torch.float64)
    for m, off in [(1, 0), (1, 2), (8, 0), (8, 2), (5, 4), (1, 0)]:
        x = buf[off:off + m * 1024].view(m, 1024)
        ref = x.double() @ wd.T
        cond = x.double().abs() @ wd.abs().T
        out = ms.linear(x, w)
        assert ((out.double() - ref).abs() <= 2.0 ** -7 * ref.abs() + 2.0 ** -12 * cond).all(), (m, off)


def test_unsupported_triton_takes_tritons_own_path(monkeypatch):
    """On a Triton release outside the supported range the launcher never uses its cache
    (whose internals are version specific): every launch is ``fn[grid](...)``."""
    from microscale.runtime import target

    calls = []

    class Fn:
        params = []

        def __getitem__(self, grid):
            def runner(*a, **kw):
                calls.append(grid)
                return type("Compiled", (), {"packed_metadata": None})()
            return runner

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(_launch, "driver", None)  # the fast path would need it
    fn = Fn()
    with target.override(triton_version=(3, 7, 0), interpreting=False):
        for _ in range(3):
            _launch.launch(fn, (2,), torch.zeros(4), 5, num_warps=4)
    assert calls == [(2,)] * 3 and not any(k[0] is fn for k in _launch._CACHE)
