"""Cached routes of ``ms.linear`` (:mod:`microscale.linear.route_cache`): a repeat call launches
exactly what the routing table would (same kernels, grids, argument specs and options), and a call
whose route changed (token count, x dtype, tuning override, weight changed in place) is routed anew.
Without a GPU the scenarios run on a stood-in Hopper (``_cache_scenarios.py``, in a subprocess:
the stand-in changes the process); on a GPU, cached outputs equal routed ones bit for bit."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import microscale as ms
from microscale.linear import tuning, weight_state

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scenarios() -> dict:
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "linear" / "_cache_scenarios.py")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_repeat_calls_launch_what_the_table_launches(scenarios):
    """Token counts 1, 16, 1 / 2, 8, 3, 16 (fp16), 8, 40 / 128, 6, 128, each called three times on a
    fresh weight, five formats, three decode_tma modes: the launches equal those with the cache off,
    and the repeat calls of a steady key are not routed (the table is asked less often)."""
    seqs = scenarios["sequences"]
    assert len(seqs) == 45
    for s in seqs:
        assert s["same"], s["case"]
        cached, uncached = s["routed"]
        assert uncached == s["calls"], s["case"]
        assert cached < uncached, s["case"]
    kernels = {k for s in seqs for k in s["kernels"]}
    for want in ("_prep_x_kernel+_gemv_kernel", "_gemv_mma_kernel", "_xperm_kernel+_decode_tma_kernel",
                 "_linear_prefill_kernel", "_xperm_kernel+_prefill_ws_kernel"):
        assert want in kernels


def test_lead_dimensions_and_bias(scenarios):
    """x of shapes [2, 4, K], [2, 8, K] and [K] with a bias: outputs [..., N] and the launches of the
    routes without the cache."""
    cached, uncached = scenarios["lead"]
    assert cached == uncached
    assert [c[0] for c in cached[::3]] == [[2, 4, 512], [2, 8, 512], [512]]


def test_tuning_override_and_explain_follow_the_route(scenarios):
    """A cached 16-token gemv_mma key: ``tuning.override(decode_tma="always")`` sends the same call to
    decode_tma, and back on exit; ``set_tuning`` likewise; ``explain`` names the route taken."""
    t = scenarios["tuning"]
    assert t["first"] == ["_gemv_mma_kernel"] * 3 and t["again"] == "_gemv_mma_kernel" and t["hit"]
    assert t["override"] == "_xperm_kernel+_decode_tma_kernel" and t["override_explain"] == "decode_tma"
    assert t["after"] == "_gemv_mma_kernel" and t["after_explain"] == "gemv_mma"
    assert t["set_tuning"] == "_xperm_kernel+_decode_tma_kernel"


def test_in_place_weight_change_is_seen(scenarios):
    """MXFP4 scales doubled in place: the next call's launch values (the scale window's arguments)
    change, as without the cache, and come back when the scales are restored."""
    cached, uncached = scenarios["in_place"]
    assert cached == uncached
    assert cached["changed"][-1] != cached["before"][-1]
    assert cached["restored"][-1] == cached["before"][-1]
    assert all(c == cached["changed"][0] for c in cached["changed"][1:])


def test_output_not_written_by_a_launch_is_neither_replayed_nor_planned(scenarios):
    """The split-K GEMV returns its fp32 sums converted: its launches are not replayed (the key keeps
    the backend chosen, run anew each call) and no call plan is made (a replay would return an output
    no launch wrote); a one-split GEMV is planned and its replays launch what the recorded call
    launched."""
    s = scenarios["split_gemv"]
    assert s["kernels"] == "_prep_x_kernel+_gemv_kernel" and s["split"] == 2 and s["same"]
    assert s["routes"] == ["Chosen"] and s["plans"] == ["REFUSED"]
    assert scenarios["plans"]["kinds"] == ["Plan"] and scenarios["plans"]["same"]


def test_call_key(scenarios):
    """The key changes with x's dtype, token count, strides and alignment, bias and the tuning
    record; no key with the cache off, during a graph capture or under launch hooks."""
    assert all(scenarios["keys"].values()), scenarios["keys"]


def test_cpu_calls_are_not_cached(gen):
    """CPU tensors run the reference: nothing is recorded in the weight's state."""
    q = ms.quantize(torch.randn(64, 128, generator=gen), "nvfp4")
    x = torch.randn(3, 128, generator=gen).to(torch.bfloat16)
    for _ in range(3):
        ms.linear(x, q)
    assert not weight_state.state(q).routes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt,ms_,mode", [("nvfp4", (1, 16, 1, 8, 3), "never"), ("mxfp4", (2, 16, 40, 2), "always"),
                                          ("int4_affine_g128", (1, 4, 16, 128), "auto"),
                                          ("mxfp8_e4m3", (1, 8, 128, 1), "never"), ("nvfp4", (1,), "never")])
def test_gpu_cached_outputs_equal_routed(fmt, ms_, mode, gen):
    """Plans off: each call's output equals the routed call's (cache off) bit for bit, and the
    cache holds the steady keys; then an in-place change of the weight is seen."""
    n = 64 if ms_ == (1,) else 1024  # (64 rows, K 16384: the split-K GEMV, not cached)
    k = 16384 if ms_ == (1,) else 2048
    q = ms.quantize(torch.randn(n, k, generator=gen), fmt).to("cuda")
    b = torch.randn(n, generator=gen).to(torch.bfloat16).cuda()
    with tuning.override(plans=False, decode_tma=mode):
        for m in ms_:
            x = torch.randn(m, k, generator=gen).to(torch.bfloat16).cuda()
            for bias in (None, b):
                for _ in range(3):
                    y = ms.linear(x, q, bias)
                    with tuning.override(route_cache=False):
                        want = ms.linear(x, q, bias)
                    assert torch.equal(y, want)
        if ms_ != (1,):
            assert weight_state.state(q).routes
        x = torch.randn(ms_[0], k, generator=gen).to(torch.bfloat16).cuda()
        for _ in range(3):
            y0 = ms.linear(x, q)
        q.data.copy_(q.data.flip(0))  # codes of the rows swapped in place
        y1 = ms.linear(x, q)
        with tuning.override(route_cache=False):
            want = ms.linear(x, q)
        assert torch.equal(y1, want) and not torch.equal(y1, y0)
