"""Eager call plans of ``ms.linear`` (``linear._Plan``): launch recording in
``runtime.launch``, the plan's substitution of x / bias / output and its refusals, the
state machine in ``linear`` (first call marks, second records, later ones replay) on the
CPU with stub kernels; on a GPU, replays against the routes they stand for."""
from __future__ import annotations

import pytest
import torch

import microscale as ms
from microscale.linear import op, plans, routing, tuning, weight_state
from microscale.runtime import launch as _launch


class _Param:
    def __init__(self, name, default=None):
        self.name, self.default = name, default


class _Compiled:
    """A compiled-kernel stand-in: ``run`` keeps (grid, argument values)."""
    packed_metadata = function = object()

    def __init__(self, log: list):
        self.log = log

    def run(self, *a):
        self.log.append((a[:3], a[9:]))


class _Fn:
    """A JIT-function stand-in with parameters ``x, out, b, n, C`` (``C`` constexpr, default 5)."""
    params = [_Param("x"), _Param("out"), _Param("b"), _Param("n"), _Param("C", 5)]

    def __init__(self, log: list):
        self.log = log

    def __getitem__(self, grid):
        def runner(*a, **kw):
            self.log.append(("miss", grid))
            return _Compiled(self.log)
        return runner


@pytest.fixture
def stub_driver(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    drv = type("Drv", (), {"get_current_device": staticmethod(lambda: 0),
                           "get_current_stream": staticmethod(lambda d: 0)})
    monkeypatch.setattr(_launch, "driver", type("D", (), {"active": drv})())


def test_launches_are_recorded_while_asked(stub_driver, monkeypatch):
    """A miss and a hit both append (compiled, grid, values with defaults); Triton's own path
    (interpreter) appends None; nothing is kept once recording stops."""
    log: list = []
    fn = _Fn(log)
    x, out = torch.zeros(8), torch.zeros(8)
    rec: list = []
    _launch.record(rec)
    try:
        _launch.launch(fn, (3,), x, out, out, 17, C=2)  # miss (compiles)
        _launch.launch(fn, (3, 2), x, out, out, 33, C=2)  # hit
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        _launch.launch(fn, (3,), x, out, out, 33, C=2)
    finally:
        _launch.record(None)
    assert [r is None for r in rec] == [False, False, True]
    assert rec[0][1] == (3,) and rec[0][2] == [x, out, out, 17, 2]
    assert rec[1][0] is rec[0][0] and rec[1][1] == (3, 2) and rec[1][2] == [x, out, out, 33, 2]
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    _launch.launch(fn, (3,), x, out, out, 17, C=2)
    assert len(rec) == 3


def test_plan_substitutes_x_bias_and_output(stub_driver):
    """Values at x's, bias's and the output's addresses are replaced per call (a view of
    another dtype stays that view); everything else is replayed as recorded."""
    log: list = []
    c1, c2 = _Compiled(log), _Compiled(log)
    x, b, y = torch.randn(2, 8), torch.randn(4), torch.empty(2, 4)
    const = torch.ones(3)
    rec = [(c1, (5,), [x, const, 8, 2.5]), (c2, (1, 2), [x, y.view(torch.int32), b, y, const])]
    plan = plans.Plan.build(rec, (x, b), y)
    assert plan is not None
    x2, b2 = torch.randn(2, 8), torch.randn(4)
    out = plan(x2, b2)
    assert out.shape == y.shape and out.dtype == y.dtype and out.data_ptr() != y.data_ptr()
    (g1, v1), (g2, v2) = log
    assert g1 == (5, 1, 1) and v1[0] is x2 and v1[1] is const and v1[2:] == (8, 2.5)
    assert g2 == (1, 2, 1) and v2[0] is x2 and v2[2] is b2 and v2[3] is out and v2[4] is const
    assert v2[1].dtype == torch.int32 and v2[1].data_ptr() == out.data_ptr()
    # the recorded values themselves are left as they were; the plan keeps none of x, bias, y
    assert rec[1][2][0] is x and rec[1][2][3] is y
    kept = [v for *_, vals in plan.launches for v in vals if isinstance(v, torch.Tensor)]
    assert all(v.data_ptr() not in (x.data_ptr(), b.data_ptr(), y.data_ptr()) for v in kept) and len(kept) == 2


def test_plan_refusals():
    """No plan when a launch took Triton's path, x or the given bias is never read (a
    converted copy was), a tensor at the output's address has another size, or a TMA
    descriptor covers x."""
    c = _Compiled([])
    x, b, y = torch.randn(2, 8), torch.randn(4), torch.empty(2, 4)
    assert plans.Plan.build([(c, (1,), [x, y]), None], (x, None), y) is None
    assert plans.Plan.build([(c, (1,), [x.clone(), y])], (x, None), y) is None
    assert plans.Plan.build([(c, (1,), [x, y, b.clone()])], (x, b), y) is None
    assert plans.Plan.build([(c, (1,), [x, y[:1]])], (x, None), y) is None
    desc = type("Desc", (), {"block_shape": [16, 64], "base": x})()
    assert plans.Plan.build([(c, (1,), [x, y, desc])], (x, None), y) is None
    assert plans.Plan.build([], (x, None), y) is None
    assert plans.Plan.build([(c, (1,), [x, y])], (x, None), y) is not None


def _descriptor_kernel(raw_launch):
    """A compiled-kernel stand-in whose launcher is Triton's own host-descriptor wrapper
    (``wrap_handle_tensordesc``) around ``raw_launch``; parameters ``x, d, n, C`` with ``d`` a
    tensor descriptor and ``C`` a constexpr."""
    from triton.backends.nvidia import driver as nd

    sig = {"x": "*bf16", "d": "tensordesc<bf16[16, 64]>", "n": "i32", "C": "constexpr"}
    run = type("Run", (), {"global_scratch_size": 0, "profile_scratch_size": 0,
                           "launch_cooperative_grid": False, "launch_pdl": True})()
    if raw_launch is not None:
        raw_launch.__module__ = "__triton_launcher"  # (what Triton's C launcher reports)
    run.launch = nd.wrap_handle_tensordesc(raw_launch, sig, None)
    return type("Compiled", (), {"run": run, "function": 7, "packed_metadata": "meta"})()


def test_bind_calls_the_launcher_below_triton_descriptor_wrapper(monkeypatch):
    """:func:`_launch.bind` on Triton's descriptor wrapper: its launches hand the launcher
    below exactly what the wrapper itself hands it (the same grid, stream, options and
    expanded descriptor), with the descriptor expanded once at bind time; value positions
    point at the substituted tensors. With ``_BIND`` off it keeps the compiled kernel's own
    launcher."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from triton.backends.nvidia import driver as nd

    calls: list = []
    encodes: list = []
    encode = nd.make_tensordesc_arg
    monkeypatch.setattr(nd, "make_tensordesc_arg", lambda *a: encodes.append(a) or encode(*a))

    def raw(*a):
        calls.append(a)
    compiled = _descriptor_kernel(raw)
    x, base = torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(32, 64, dtype=torch.bfloat16)
    desc = TensorDescriptor(base, [32, 64], [64, 1], [16, 64])
    vals = [x, desc, 5, 3]
    fn, args, pos, ptrs = _launch.bind(compiled, (4, 2), vals)
    assert ptrs and args[pos[0]] is x and args[pos[2]] == 5 and args[pos[3]] == 3 and len(args) > len(vals)
    fn(99, args)
    assert len(encodes) == 1  # at bind time only
    compiled.run.launch(4, 2, 1, 99, 7, False, True, None, None, "meta", None, None, None, *vals)
    assert len(encodes) == 2  # Triton's wrapper encodes at every launch
    mine, triton = calls
    assert len(mine) == len(triton)
    assert all(a is b or (not isinstance(a, torch.Tensor) and a == b) for a, b in zip(mine, triton))
    x2 = torch.ones_like(x)
    a2 = args.copy()
    a2[pos[0]] = x2
    fn(98, a2)
    assert calls[-1][13] is x2 and calls[-1][3] == 98 and calls[-1][14:] == mine[14:] and len(encodes) == 2
    monkeypatch.setattr(_launch, "_BIND", False)
    log: list = []
    plain = _Compiled(log)
    fn, args, pos, ptrs = _launch.bind(plain, (4,), vals)
    assert args == vals and pos == [0, 1, 2, 3] and not ptrs
    fn(0, args)
    assert log == [((4, 1, 1), tuple(vals))]


def test_linear_marks_records_then_replays(stub_driver, monkeypatch):
    """Per key: the first call runs the route, the second runs it recording, later calls
    replay without it; a route that is not plannable runs every time; another key starts
    over; the plans live on the weight."""
    log: list = []
    fn = _Fn(log)
    routed = []

    def route(x, q, bias, cache=True):
        routed.append(x.shape)
        y = torch.empty(x.shape[0], 4)
        _launch.launch(fn, (2,), x, y, bias if bias is not None else y, 9)
        return y, plannable[0]

    plannable = [True]
    monkeypatch.setattr(op, "route", route)
    monkeypatch.setattr(op, "plan_key", lambda x, q, bias: (x.shape, bias is None))
    monkeypatch.setattr(op, "check", lambda *a: None)
    q = ms.quantize(torch.randn(4, 64), "mxfp4")
    xs = [torch.randn(3, 64) for _ in range(4)]
    for x in xs:
        op.linear(x, q)
    assert len(routed) == 2  # marked, recorded; then two replays
    replays = [v for g, v in (e for e in log if e[0] != "miss")][-2:]
    assert replays[0][0] is xs[2] and replays[1][0] is xs[3]
    assert any(type(p) is plans.Plan for p in weight_state.state(q).plans.values())
    b = torch.randn(4)
    for _ in range(3):
        op.linear(xs[0], q, b)
    assert len(routed) == 4  # a new key: marked, recorded, replayed
    plannable[0] = False
    for _ in range(3):
        op.linear(torch.randn(5, 64), q)
    assert len(routed) == 7  # refused: the route every time


def test_rmsnorm_linear_plans_its_norm_launch(stub_driver, monkeypatch):
    """rmsnorm_linear's norm launch: marked, recorded, then replayed with each call's x, norm weight and gate
    (a new output each time); a gate where there was none is another key; plans off: the launch every time."""
    from microscale.linear import norm_linear as nl

    log: list = []
    fn = _Fn(log)
    launched = []

    def norm_rows(x2, nw, gate, eps):
        launched.append(x2)
        out = torch.empty_like(x2)
        _launch.launch(fn, (x2.shape[0],), x2, out, nw, gate if gate is not None else x2)  # (as the kernel's)
        return out

    monkeypatch.setattr(nl, "_norm_rows", norm_rows)
    monkeypatch.setattr(nl, "plannable", lambda x: tuning.get().plans)
    monkeypatch.setattr(nl, "_NORM_PLANS", {})
    nw = torch.ones(64)
    xs = [torch.randn(3, 64) for _ in range(4)]
    outs = [nl._norm_planned(x, nw, None, 1e-5) for x in xs]
    assert len(launched) == 2  # marked, recorded; then two replays
    replays = [v for _, v in (e for e in log if e[0] != "miss")][-2:]
    assert replays[0][0] is xs[2] and replays[1][0] is xs[3] and replays[1][1] is outs[3]
    assert replays[1][2] is nw and replays[1][3] is xs[3] and outs[2].data_ptr() != outs[3].data_ptr()
    gate = torch.randn(3, 64)
    for _ in range(3):
        nl._norm_planned(xs[0], nw, gate, 1e-5)
    assert len(launched) == 4 and [v for _, v in log if _ != "miss"][-1][3] is gate
    with tuning.override(plans=False):
        for _ in range(2):
            nl._norm_planned(xs[0], nw, None, 1e-5)
    assert len(launched) == 6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt,m,lead,tma", [("nvfp4", 1, (), "graph"), ("mxfp4", 2, (2,), "graph"),
                                            ("mxfp8_e4m3", 1, (), "graph"), ("int4_affine_g128", 3, (), "graph"),
                                            ("nvfp4", 8, (2,), "graph"), ("mxfp4", 16, (), "graph"),
                                            ("nvfp4", 12, (3,), "always"), ("mxfp4", 40, (2,), "auto"),
                                            ("nvfp4", 64, (), "auto")])
def test_gpu_plans_replay_the_routes(fmt, m, lead, tma, monkeypatch):
    """Eager calls with fresh x and bias each time: every result (replays included) is
    bit-identical to the route run without plans; a plan is made; an in-place change of the
    weight is followed; another stream gets its own plan."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(11)
    tuning.set_tuning(decode_tma=tma)
    n, k = 384, 1024
    q = ms.quantize(torch.randn(n, k, device=dev, generator=g), fmt)
    shape = (*lead, m // lead[0], k) if lead else (m, k)

    def fresh():
        x = torch.randn(shape, device=dev, generator=g).to(torch.bfloat16)
        b = torch.randn(n, device=dev, generator=g).to(torch.bfloat16)
        return x, b

    for use_bias in (False, True):
        for _ in range(4):
            x, b = fresh()
            bias = b if use_bias else None
            y = ms.linear(x, q, bias)
            want, _ = routing.route(x, q, bias)
            assert torch.equal(y, want), (fmt, m, use_bias)
    assert sum(type(p) is plans.Plan for p in weight_state.state(q).plans.values()) == 2
    other = ms.quantize(torch.randn(n, k, device=dev, generator=g), fmt)
    for t, o in ((q.data, other.data), (q.scales, other.scales), (q.zero_points, other.zero_points),
                 (q.global_scale, other.global_scale)):
        if t is not None:
            t.copy_(o)
    for _ in range(3):
        x, b = fresh()
        assert torch.equal(ms.linear(x, q, b), routing.route(x, other, b)[0])
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            x, b = fresh()
            y = ms.linear(x, q, b)
            want = routing.route(x, other, b)[0]
    torch.cuda.synchronize()
    assert torch.equal(y, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_capture_after_plans():
    """A weight with plans still captures into a CUDA graph (no plan while capturing) and the
    graph replays on new input like the eager call."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(12)
    q = ms.quantize(torch.randn(256, 512, device=dev, generator=g), "nvfp4")
    x = torch.randn(1, 512, device=dev, generator=g).to(torch.bfloat16)
    for _ in range(3):
        ms.linear(x, q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = ms.linear(x, q)
    x.copy_(torch.randn(1, 512, device=dev, generator=g).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(yg, ms.linear(x, q))
