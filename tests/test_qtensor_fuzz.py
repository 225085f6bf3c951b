"""Fuzzing QTensor construction and loading (hypothesis): every outcome is either a
ValueError/TypeError or a QTensor with exactly the shapes the format implies, which
dequantizes to its declared shape."""
import json
import math

import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

import microscale as ms
from microscale.formats import registry

NAMES = list(registry)
DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.float16, torch.bfloat16, torch.float32,
          torch.float64, torch.float8_e4m3fn, torch.bool]
ORIG_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.uint8]
FIELDS = ("data", "scales", "global_scale", "zero_points")


def expected_shapes(fmt, shape):
    """Independent statement of the canonical layout (FORMATS.md / qtensor docstring):
    data [..., Kp*bits/8], scales [..., K/B] ([..., Np/BR, Kp/B] for 2-D blocks)."""
    b, br = fmt.block_size, fmt.block_rows
    kp = math.ceil(shape[-1] / b) * b
    lead = list(shape[:-1])
    if br > 1:
        lead[-1] = math.ceil(lead[-1] / br) * br
    data = (*lead, kp * fmt.element.bits // 8)
    slead = lead[:-1] + [lead[-1] // br] if br > 1 else lead
    return data, (*slead, kp // b)


def check_accepted(q):
    """What was accepted is consistent, and dequantizes to its declared shape."""
    f = q.fmt
    assert all(isinstance(s, int) and s >= 0 for s in q.shape) and len(q.shape) >= (2 if f.block_rows > 1 else 1)
    dshape, sshape = expected_shapes(f, q.shape)
    assert tuple(q.data.shape) == dshape and q.data.dtype == torch.uint8
    assert tuple(q.scales.shape) == sshape and q.scales.dtype == f.scale.storage
    assert (q.zero_points is not None) == f.zero_point and (q.global_scale is not None) == f.global_scale
    if q.zero_points is not None:
        assert tuple(q.zero_points.shape) == sshape and q.zero_points.dtype == torch.uint8
    if q.global_scale is not None:
        assert q.global_scale.shape == () and q.global_scale.dtype == torch.float32
    d = q.dequantize()
    assert d.shape == q.shape and d.dtype == torch.float32


def random_tensor(data, like):
    """A tensor near ``like``: its shape with dims nudged, dropped or added, any dtype."""
    shape = list(like.shape) if like is not None else []
    op = data.draw(st.sampled_from(["nudge", "drop", "add", "same", "scalar"]))
    if op == "nudge" and shape:
        i = data.draw(st.integers(0, len(shape) - 1))
        shape[i] = max(0, shape[i] + data.draw(st.sampled_from([-1, 1, 2, -shape[i]])))
    elif op == "drop" and shape:
        shape.pop(data.draw(st.integers(0, len(shape) - 1)))
    elif op == "add":
        shape.insert(data.draw(st.integers(0, len(shape))), data.draw(st.integers(0, 2)))
    elif op == "scalar":
        shape = data.draw(st.sampled_from([[], [1], [2]]))
    dtype = data.draw(st.sampled_from(DTYPES + ([like.dtype] * 4 if like is not None else [])))
    t = torch.randint(0, 256, shape, dtype=torch.int32)
    if dtype == torch.bool:
        return t > 127
    if dtype == torch.float8_e4m3fn:
        return t.to(torch.uint8).view(torch.float8_e4m3fn)
    return t.to(dtype) if not dtype.is_floating_point else (t.to(dtype) / 64 + 0.25)


def valid_qtensor(data):
    name = data.draw(st.sampled_from(NAMES), label="format")
    f = registry[name]
    nd = data.draw(st.integers(2 if f.block_rows > 1 else 1, 3))
    shape = [data.draw(st.integers(0, 2)) for _ in range(nd - 2)]
    if nd >= 2:
        shape.append(data.draw(st.integers(0, f.block_rows + 2 if f.block_rows > 1 else 3)))
    shape.append(data.draw(st.integers(0, 2 * f.block_size + 3)))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
    x = torch.randn(shape, generator=g)
    return ms.quantize(x, name, pad=True)


def fields(q):
    return dict(data=q.data, scales=q.scales, fmt=q.fmt, shape=q.shape, dtype=q.dtype,
                global_scale=q.global_scale, zero_points=q.zero_points, meta=dict(q.meta))


def mutate_fields(data, kw):
    for _ in range(data.draw(st.integers(0, 3))):
        what = data.draw(st.sampled_from(["tensor", "none", "shape", "dtype", "fmt", "meta"]))
        if what == "tensor":
            k = data.draw(st.sampled_from(FIELDS))
            kw[k] = random_tensor(data, kw[k] if kw[k] is not None else kw["scales"])
        elif what == "none":
            kw[data.draw(st.sampled_from(FIELDS))] = None
        elif what == "shape":
            s = list(kw["shape"])
            choice = data.draw(st.sampled_from(["int", "neg", "float", "bool", "drop", "add"]))
            i = data.draw(st.integers(0, max(len(s) - 1, 0)))
            if choice == "drop" and s:
                s.pop(i)
            elif choice == "add":
                s.insert(i, data.draw(st.integers(0, 3)))
            elif s:
                s[i] = {"int": data.draw(st.integers(0, 300)), "neg": -data.draw(st.integers(1, 3)),
                        "float": s[i] + 0.5, "bool": True}[choice]
            kw["shape"] = s
        elif what == "dtype":
            kw["dtype"] = data.draw(st.sampled_from(ORIG_DTYPES + ["float32", None]))
        elif what == "fmt":
            kw["fmt"] = data.draw(st.sampled_from([registry[n] for n in NAMES] + ["nvfp4"]))
        else:
            kw["meta"] = data.draw(st.sampled_from([None, [], {"a": 1}, "x"]))
    return kw


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_construction_fuzz(data):
    kw = mutate_fields(data, fields(valid_qtensor(data)))
    try:
        q = ms.QTensor(**kw)
    except (ValueError, TypeError) as e:
        event(f"refused: {type(e).__name__}")
        return
    event("accepted")
    check_accepted(q)


JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.floats(allow_nan=True),
                        st.text(max_size=6), st.sampled_from(["e2m1", "e4m3", "fp16", "ue4m3", "floor", "float32",
                                                              "modelopt", "minmax", "uint8"]),
                        st.lists(st.integers(-1, 70), max_size=4), st.dictionaries(st.text(max_size=3), st.integers()))


def mutate_meta(data, m):
    for _ in range(data.draw(st.integers(1, 3))):
        fmt = m.get("format")
        keys = [("format", k) for k in (fmt if isinstance(fmt, dict) else {})] + [(k,) for k in m]
        if not keys:
            break
        path = data.draw(st.sampled_from(keys))
        d = m
        for k in path[:-1]:
            d = d[k]
        if data.draw(st.booleans()):
            d[path[-1]] = data.draw(JSON_VALUES)
        elif path[-1] in d and data.draw(st.booleans()):
            del d[path[-1]]
        elif path == ("shape",) and isinstance(d["shape"], list) and d["shape"]:
            i = data.draw(st.integers(0, len(d["shape"]) - 1))
            d["shape"][i] += data.draw(st.sampled_from([-1, 1, 16, -16]))
    return m


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_load_fuzz(data, tmp_path_factory):
    q = valid_qtensor(data)
    tensors, meta = q.state_dict()
    m = json.loads(meta["microscale"])
    if data.draw(st.booleans()):
        m = mutate_meta(data, m)
    for _ in range(data.draw(st.integers(0, 2))):
        k = data.draw(st.sampled_from(FIELDS + ("extra",)))
        if data.draw(st.booleans()) and k in tensors:
            del tensors[k]
        else:
            tensors[k] = random_tensor(data, tensors.get(k, q.scales)).contiguous()
    p = tmp_path_factory.mktemp("fuzz") / "q.safetensors"
    save_file(tensors, p, metadata={"microscale": json.dumps(m)})
    try:
        r = ms.QTensor.load(p)
    except (ValueError, TypeError) as e:
        assert str(p) in str(e)  # the message names the file
        event(f"refused: {type(e).__name__}")
        return
    event("accepted")
    check_accepted(r)
    if r.global_scale is not None:
        assert torch.isfinite(r.global_scale) and r.global_scale > 0
