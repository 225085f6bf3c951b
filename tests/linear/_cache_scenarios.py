"""Scenarios of the linear op's cached routes on a stood-in Hopper (``tools/host_time.py``'s: CPU
tensors report ``is_cuda``, Triton below the cached launcher logs instead of compiling). Run by
``test_route_cache.py`` in a subprocess without ``TRITON_INTERPRET`` (the stand-in changes the
process); prints one JSON object of what each scenario launched."""
from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import host_time as H  # noqa: E402  (pops TRITON_INTERPRET, puts the tree first on sys.path)
import torch  # noqa: E402

import microscale as ms  # noqa: E402
from microscale.linear import op, plans, route_cache, routing, tuning, weight_state  # noqa: E402
from microscale.runtime import launch as _launch  # noqa: E402

g = torch.Generator().manual_seed(0)
W = {name: ms.quantize(torch.randn(n, k, generator=g), name.split("/")[0])
     for name, n, k in (("nvfp4", 512, 1024), ("mxfp4", 256, 1024), ("nvfp4/small", 64, 1024),
                        ("nvfp4/split", 64, 16384), ("int4_affine_g128", 256, 1024), ("mxfp8_e4m3", 256, 1024))}
X = {(m, dt): torch.randn(m, 1024, generator=g).to(dt) for m in (1, 2, 3, 6, 8, 16, 40, 128)
     for dt in (torch.bfloat16, torch.float16)}
configure, _ = H.stand_in()
table_route = op.route
routed = [0]


def counted(*args, **kwargs):
    routed[0] += 1
    return table_route(*args, **kwargs)


op.route = counted


X_SPLIT = torch.randn(1, 16384, generator=g).to(torch.bfloat16)


def call(q, m, dt=torch.bfloat16, bias=None) -> list:
    """The launches of one ``ms.linear`` call (kernel, grid, argument specs, options)."""
    H._RECORD = []
    try:
        ms.linear(X_SPLIT if q.shape[1] == 16384 else X[m, dt], q, bias)
        return H._RECORD
    finally:
        H._RECORD = None


def fresh(name: str):
    q = W[name]
    q.__dict__.pop("_ms_linear_state", None)
    return q


def sequence(name: str, ms_: tuple, settings: dict, cache: bool) -> tuple[list, int]:
    """Each token count of ``ms_`` called three times on a weight not used yet: launches, routed calls."""
    configure(dict(settings, route_cache=cache))
    q = fresh(name)
    routed[0] = 0
    out = [call(q, m, dt) for m, dt in ms_ for _ in range(3)]
    return out, routed[0]


def kernels(rec: list) -> str:
    return "+".join(r[0] for r in rec)


res: dict = {}
bf, f16 = torch.bfloat16, torch.float16
seqs = {"1-16-1": ((1, bf), (16, bf), (1, bf)), "mixed": ((2, bf), (8, bf), (3, bf), (16, f16), (8, bf), (40, bf)),
        "prefill": ((128, bf), (6, bf), (128, bf))}
for name in ("nvfp4", "mxfp4", "int4_affine_g128", "mxfp8_e4m3", "nvfp4/small"):
    for sname, seq in seqs.items():
        for mode in ("never", "always", "auto"):
            on = sequence(name, seq, {"decode_tma": mode}, True)
            off = sequence(name, seq, {"decode_tma": mode}, False)
            res.setdefault("sequences", []).append({"case": [name, sname, mode], "same": on[0] == off[0],
                                                    "routed": [on[1], off[1]], "calls": len(on[0]),
                                                    "kernels": [kernels(r) for r in on[0]]})

# lead dimensions and bias: x [2, 4, K] and [2, 8, K], a bias in x's dtype
for cache in (True, False):
    configure({"decode_tma": "never", "route_cache": cache})
    q = fresh("nvfp4")
    b = torch.randn(512, generator=torch.Generator().manual_seed(2)).to(bf)
    out = []
    for x in (X[8, bf].view(2, 4, 1024), X[16, bf].view(2, 8, 1024), X[1, bf].view(1024)):
        for _ in range(3):
            H._RECORD = []
            y = ms.linear(x, q, b)
            out.append([list(y.shape), H._RECORD])
            H._RECORD = None
    res.setdefault("lead", []).append(out)

# a tuning override, set_tuning and explain on a cached key
configure({"decode_tma": "never"})
q = fresh("nvfp4")
first = [kernels(call(q, 16)) for _ in range(3)]
routed[0] = 0
again = kernels(call(q, 16))
hit = routed[0] == 0
with tuning.override(decode_tma="always"):
    over = kernels(call(q, 16))
    over_explain = routing.explain(X[16, bf], q)[-1][0]
after = kernels(call(q, 16))
after_explain = routing.explain(X[16, bf], q)[-1][0]
tuning.set_tuning(decode_tma="always")
set_ = kernels(call(q, 16))
res["tuning"] = {"first": first, "again": again, "hit": hit, "override": over, "override_explain": over_explain,
                 "after": after, "after_explain": after_explain, "set_tuning": set_}

# the weight changed in place: its scale window moves (the kernel's ke / post arguments)
for cache in (True, False):
    configure({"decode_tma": "never", "route_cache": cache})
    q = W["mxfp4"]
    saved = q.scales.clone()
    q.__dict__.pop("_ms_linear_state", None)
    before = [call(q, 8) for _ in range(3)]
    q.scales.add_(1)  # every E8M0 scale doubled, in place (the version counter moves)
    changed = [call(q, 8) for _ in range(3)]
    q.scales.copy_(saved)
    restored = [call(q, 8) for _ in range(3)]
    res.setdefault("in_place", []).append({"before": before, "changed": changed, "restored": restored})

# an output no launch writes as returned (the split-K GEMV's fp32 sums): not replayed, not planned
configure({"decode_tma": "never"})
q = fresh("nvfp4/split")
small = [call(q, 1) for _ in range(3)]
res["split_gemv"] = {"kernels": kernels(small[-1]),
                     "routes": [type(r).__name__ for r in weight_state.state(q).routes.values()],
                     "same": small[1] == small[2],
                     "split": small[-1][-1][1][1]}
configure({"decode_tma": "never", "plans": True})
q = fresh("nvfp4/split")
for _ in range(3):
    call(q, 1)
st = weight_state.state(q)
res["split_gemv"]["plans"] = [type(p).__name__ if isinstance(p, plans.Plan) else
                              "REFUSED" if p is plans.REFUSED else "SEEN" for p in st.plans.values()]
q = fresh("nvfp4")
planned = [call(q, 1) for _ in range(4)]
res["plans"] = {"kinds": [type(p).__name__ if isinstance(p, plans.Plan) else
                          "REFUSED" if p is plans.REFUSED else "SEEN" for p in weight_state.state(q).plans.values()],
                "same": all(p == planned[1] for p in planned[2:]), "first": planned[0] == planned[1]}

# the call key: what changes it, what turns the cache off
configure({"decode_tma": "never"})
x = X[8, bf]
k0 = route_cache.call_key(x, None)
keys = {"same": route_cache.call_key(x.clone(), None) == k0,
        "dtype": route_cache.call_key(x.half(), None) != k0,
        "tokens": route_cache.call_key(X[16, bf], None) != k0,
        "strides": route_cache.call_key(x.t().contiguous().t(), None) != k0,
        "alignment": route_cache.call_key(torch.zeros(8 * 1024 + 1, dtype=bf)[1:].view(8, 1024), None) != k0,
        "bias": route_cache.call_key(x, torch.zeros(512, dtype=bf)) != k0,
        "tuning": route_cache.call_key(x, None) != k0 if tuning.set_tuning(gemv_max_m=4) else False}
with tuning.override(route_cache=False):
    keys["off"] = route_cache.call_key(x, None) is None
torch.cuda.is_current_stream_capturing = lambda: True
keys["capturing"] = route_cache.call_key(x, None) is None
torch.cuda.is_current_stream_capturing = lambda: False
hooked = _launch.hooked
_launch.hooked = lambda: True
keys["hooked"] = route_cache.call_key(x, None) is None
_launch.hooked = hooked
res["keys"] = keys
print(json.dumps(res))
