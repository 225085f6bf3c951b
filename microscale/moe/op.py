"""The public MoE ops and their ``torch.library`` registration.

``grouped_linear`` and ``moe_experts`` take 3-D QTensor weights ``[E, N, K]`` (any registry
format), repacked once per weight version (:mod:`.packed`), and run the custom ops
``torch.ops.microscale.grouped_linear`` / ``torch.ops.microscale.moe_experts``: the grouped
Triton kernel on CUDA (:mod:`.grouped`), the float64 reference (:mod:`.reference`) elsewhere.
"""
from __future__ import annotations

import functools
import json

import torch

from ..formats import Format
from ..linear import tuning as linear_tuning
from ..linear.plans import plannable, through_plan
from ..linear.weight_state import state, weight_key
from ..qtensor import QTensor
from ..runtime import launch as _kl
from ..runtime import target
from .packed import OP, PackedExperts, cached_prepare_experts, fmt_json
from .reference import ACTIVATIONS, LAYOUTS, grouped_linear_reference, moe_experts_reference

__all__ = ["grouped_linear", "moe_experts", "route_tokens"]

_MOE = "microscale.moe_experts"


@functools.lru_cache(maxsize=256)
def _format(fmt_j: str) -> Format:
    """The format of a custom op's JSON argument, parsed once per string (a parse costs ~15 µs a call)."""
    return Format.from_dict(json.loads(fmt_j))


def _unpack(codes, scales, zp, gs, words, wscales, fmt_j, n, k, specials, mma) -> PackedExperts:
    fmt = _format(fmt_j)
    return PackedExperts(fmt, codes.shape[0], n, k, 4 if fmt.element.bits <= 4 else 8, codes, scales, zp, gs,
                         specials, words, wscales, tuple(mma) if mma else None)


def _tensors(pe: PackedExperts) -> tuple:
    """The tensors of ``pe`` the custom ops take (the packed layout, then the decode view or None)."""
    return (pe.codes, pe.scales, pe.zero_points, pe.global_scale, pe.words, pe.wscales)


def _mma(pe: PackedExperts) -> list[int]:
    return list(pe.mma) if pe.mma is not None else []


def route_tokens(top_k_index: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort the (token, slot) pairs by expert on the device, no host sync: ``perm`` (int64
    ``[T*top_k]``, flat pair index of each grouped row) and ``offsets`` (int32 ``[E+1]``)."""
    ids = top_k_index.reshape(-1).to(torch.int64)
    perm = torch.argsort(ids, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, ids, torch.ones_like(ids))
    offsets = torch.zeros(num_experts + 1, dtype=torch.int32, device=ids.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return perm, offsets


def _packed(w: QTensor | PackedExperts) -> PackedExperts:
    return w if isinstance(w, PackedExperts) else cached_prepare_experts(w)  # (the cache is not traced)


def _grouped_cuda(x, pe, offsets, bias, rows=None):
    from .decode import decode_eligible, decode_run
    from .grouped import grouped_run
    from .prefill import choose_prefill_config, prefill_run, prefill_takes
    from .tuning import expected_touched

    if x.stride(-1) != 1:
        x = x.contiguous()
    r = x.shape[0]
    if rows is None and decode_eligible(pe, x, r):
        return decode_run(x, pe, offsets, bias)
    if rows is None and prefill_takes(pe, x, r):
        return prefill_run(x, pe, offsets, bias, config=choose_prefill_config(r / max(1.0, expected_touched(r, pe.e))))
    return grouped_run(x, pe, offsets, bias, rows=rows)


@torch.library.custom_op("microscale::grouped_linear", mutates_args=())
def _grouped_op(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
                global_scale: torch.Tensor | None, words: torch.Tensor | None, wscales: torch.Tensor | None,
                offsets: torch.Tensor, bias: torch.Tensor | None, fmt_j: str, n: int, k: int, specials: bool,
                mma: list[int]) -> torch.Tensor:
    pe = _unpack(codes, scales, zero_points, global_scale, words, wscales, fmt_j, n, k, specials, mma)
    if x.device.type == "cuda":
        return _grouped_cuda(x, pe, offsets, bias)
    y = grouped_linear_reference(x.double(), pe.dense(), offsets, None if bias is None else bias.double())
    return y.to(x.dtype)


@_grouped_op.register_fake
def _(x, codes, scales, zero_points, global_scale, words, wscales, offsets, bias, fmt_j, n, k, specials, mma):
    return x.new_empty((x.shape[0], n))


def _check_x(x: torch.Tensor, k: int, name: str = "x", op: str = OP) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"{op}: {name} must be [T, {k}] (K of the weight), got shape {tuple(x.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"{op}: {name} must be bfloat16, float16 or float32, got {x.dtype}")


def _check_bias(b: torch.Tensor | None, e: int, n: int, device, name: str, op: str) -> None:
    if b is not None and (not isinstance(b, torch.Tensor) or tuple(b.shape) != (e, n) or b.device != device):
        raise ValueError(f"{op}: {name} must be a [{e}, {n}] tensor on {device}, got "
                         f"{tuple(b.shape) if isinstance(b, torch.Tensor) else type(b).__name__}")


def grouped_linear(x: torch.Tensor, w: QTensor | PackedExperts, offsets: torch.Tensor,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
    """Grouped weight-only matmul: ``out[r] = x[r] @ dequant(w[e])^T + bias[e]`` for the rows
    ``offsets[e] <= r < offsets[e+1]`` of expert ``e``.

    Args:
        x: ``[T, K]`` bfloat16/float16 (float32 on CPU), rows grouped by expert.
        w: a QTensor ``[E, N, K]`` in any registry format (blocks along K per expert), or
            :func:`microscale.moe.prepare_experts` of one (pass that inside ``torch.compile``).
        offsets: int32 ``[E+1]``, nondecreasing, ``offsets[0] = 0``, ``offsets[E] = T`` (checked
            on CPU; on CUDA rows past ``offsets[E]`` are left unwritten).
        bias: optional ``[E, N]``.

    Returns:
        ``[T, N]`` in x's dtype. CUDA: the grouped Triton kernel; elsewhere the float64 reference.
    """
    pe = _packed(w)
    _check_x(x, pe.k)
    if not isinstance(offsets, torch.Tensor) or offsets.dtype != torch.int32 or tuple(offsets.shape) != (pe.e + 1,):
        raise ValueError(f"{OP}: offsets must be an int32 tensor of shape [{pe.e + 1}], got "
                         f"{offsets.dtype if isinstance(offsets, torch.Tensor) else type(offsets).__name__} "
                         f"{tuple(offsets.shape) if isinstance(offsets, torch.Tensor) else ''}")
    if offsets.device.type == "cpu" and not torch.compiler.is_compiling():
        o = offsets.tolist()
        if o[0] != 0 or o[-1] != x.shape[0] or any(b < a for a, b in zip(o, o[1:])):
            raise ValueError(f"{OP}: offsets={o} must rise from 0 to T={x.shape[0]}")
    _check_bias(bias, pe.e, pe.n, x.device, "bias", OP)
    return torch.ops.microscale.grouped_linear(x, *_tensors(pe), offsets, bias, fmt_json(pe.fmt), pe.n, pe.k,
                                               pe.specials, _mma(pe))


def _experts_forward(x, gu: PackedExperts, dn: PackedExperts, idx, weights, gu_bias, dn_bias, activation, alpha,
                     limit, layout):
    """The composed forward on CUDA (:func:`_forward_launches`), its output."""
    return _forward_launches(x, gu, dn, idx, weights, gu_bias, dn_bias, activation, alpha, limit, layout)[0]


def decode_chain_pdl(w_gate_up: PackedExperts, w_down: PackedExperts, x: torch.Tensor, rows: int) -> bool:
    """Whether :func:`moe_experts` on these packed experts can run ``rows`` grouped rows (tokens x top_k) of ``x``
    as the decode chain of programmatic dependent launches: both GEMMs on the decode kernel, the one-launch
    routing, a GPU that has them (``microscale.moe.tuning.DECODE_PDL`` then says whether it does)."""
    from . import grouped
    from .decode import decode_eligible

    return (decode_eligible(w_gate_up, x, rows) and w_down.mma is not None and rows <= grouped.ROUTE_KERNEL_MAX_ROWS
            and not target.interpreting() and target.pdl_capable(x.device))


def _forward_launches(x, gu: PackedExperts, dn: PackedExperts, idx, weights, gu_bias, dn_bias, activation, alpha,
                      limit, layout) -> tuple[torch.Tensor, bool]:
    """The composed forward on CUDA: the routing (one launch at decode), the gathered gate/up
    GEMM with the activation in its epilogue, the down GEMM with the routing weight and the
    un-sort in its epilogue (fp32), and each token's sum of its top_k slots in slot order
    (deterministic). Each GEMM runs the decode kernel where :func:`~.decode.decode_eligible` says
    so (few rows per expert, E2M1 experts), the Gluon prefill path where :func:`~.prefill.prefill_takes` does
    (many rows per expert, E2M1 experts), else the grouped kernel. Returns the output and whether every
    tensor a launch read was the call's own input, a view of one, or a launch's output (both GEMMs on the
    decode path, the one-launch routing): then a call plan may replay the launches."""
    from .decode import DECODE_TILE_ROWS, decode_eligible, decode_run
    from . import grouped
    from .grouped import grouped_run, pair_eligible, route, slot_sum
    from .prefill import choose_prefill_config, prefill_run, prefill_takes
    from . import tuning as moe_tuning
    from .tuning import choose_config, expected_touched

    t, top_k = idx.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    r = idx.numel()
    wflat = weights.reshape(-1)
    wflat = wflat if wflat.is_contiguous() else wflat.contiguous()
    c_gu = choose_config(r, gu.e, gu.n, gu.codes.shape[2], gu.container_bits, x.device, pair_eligible(gu, x.dtype))
    c_dn = choose_config(r, dn.e, dn.n, dn.codes.shape[2], dn.container_bits, x.device, pair_eligible(dn, x.dtype))
    d_gu = decode_eligible(gu, x, r)
    # (the down GEMM's input is the gate/up GEMM's bf16 output [r, I]: eligible alike)
    d_dn = dn.mma is not None and d_gu
    p_gu = not d_gu and prefill_takes(gu, x, r)
    p_dn = p_gu and prefill_takes(dn, x, r)
    c_pf = choose_prefill_config(r / max(1.0, expected_touched(r, gu.e))) if p_gu else None
    bm_gu = DECODE_TILE_ROWS if d_gu else c_pf.block_t if p_gu else c_gu.block_m
    bm_dn = DECODE_TILE_ROWS if d_dn else c_pf.block_t if p_dn else c_dn.block_m
    pdl = moe_tuning.DECODE_PDL and decode_chain_pdl(gu, dn, x, r)
    perm, offsets, te, tb = route(idx, gu.e, bm_gu, trigger=pdl)
    act = (activation, alpha, limit, layout)
    if d_gu:
        h = decode_run(x, gu, offsets, gu_bias, rows=perm, gather_div=top_k, tiles=(te, tb), act=act,
                       pdl_wait=1 if pdl else 0, pdl_trigger=pdl)
    elif p_gu:
        h = prefill_run(x, gu, offsets, gu_bias, rows=perm, config=c_pf, gather_div=top_k, tiles=(te, tb), act=act)
    else:
        h = grouped_run(x, gu, offsets, gu_bias, rows=perm, config=c_gu, gather_div=top_k, tiles=(te, tb), act=act)
    # (the same rows and experts: the same tile map where the tile heights agree)
    tiles = (te, tb) if bm_dn == bm_gu else None
    if d_dn:
        y = decode_run(h, dn, offsets, dn_bias, rows=perm, tiles=tiles, scatter=wflat, pdl_wait=2 if pdl else 0,
                       pdl_trigger=pdl)
    elif p_dn:
        y = prefill_run(h, dn, offsets, dn_bias, rows=perm, config=c_pf, tiles=tiles, scatter=wflat)
    else:
        y = grouped_run(h, dn, offsets, dn_bias, rows=perm, config=c_dn, tiles=tiles, scatter=wflat)
    # (torch's routing above the kernel's rows, or the grouped path's own tile maps, are tensors no launch
    # recorded; a copy of an input is refused by Plan.build, which finds the input itself in no launch)
    own = d_gu and d_dn and r <= grouped.ROUTE_KERNEL_MAX_ROWS and idx.dtype in (torch.int32, torch.int64)
    return slot_sum(y, top_k, x.dtype, wait=pdl), own


@torch.library.custom_op("microscale::moe_experts", mutates_args=())
def _moe_op(x: torch.Tensor, gu_codes: torch.Tensor, gu_scales: torch.Tensor, gu_zp: torch.Tensor | None,
            gu_gs: torch.Tensor | None, gu_words: torch.Tensor | None, gu_wscales: torch.Tensor | None,
            dn_codes: torch.Tensor, dn_scales: torch.Tensor, dn_zp: torch.Tensor | None,
            dn_gs: torch.Tensor | None, dn_words: torch.Tensor | None, dn_wscales: torch.Tensor | None,
            top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
            gate_up_bias: torch.Tensor | None, down_bias: torch.Tensor | None, fmt_gu: str, fmt_dn: str,
            dims: list[int], specials: list[bool], mma_gu: list[int], mma_dn: list[int], activation: str,
            alpha: float | None, limit: float | None, layout: str) -> torch.Tensor:
    h2, hid, inter = dims
    gu = _unpack(gu_codes, gu_scales, gu_zp, gu_gs, gu_words, gu_wscales, fmt_gu, h2, hid, specials[0], mma_gu)
    dn = _unpack(dn_codes, dn_scales, dn_zp, dn_gs, dn_words, dn_wscales, fmt_dn, hid, inter, specials[1], mma_dn)
    if x.device.type == "cuda":
        return _experts_forward(x, gu, dn, top_k_index, top_k_weights, gate_up_bias, down_bias, activation, alpha,
                                limit, layout)
    d = lambda b: None if b is None else b.double()  # noqa: E731
    y = moe_experts_reference(x.double(), gu.dense(), dn.dense(), top_k_index, top_k_weights.double(),
                              activation=activation, gate_up_bias=d(gate_up_bias), down_bias=d(down_bias),
                              alpha=alpha, limit=limit, layout=layout)
    return y.to(x.dtype)


@_moe_op.register_fake
def _(x, gu_codes, gu_scales, gu_zp, gu_gs, gu_words, gu_wscales, dn_codes, dn_scales, dn_zp, dn_gs, dn_words,
      dn_wscales, top_k_index, top_k_weights, gate_up_bias, down_bias, fmt_gu, fmt_dn, dims, specials, mma_gu, mma_dn,
      activation, alpha, limit, layout):
    return x.new_empty((x.shape[0], dims[1]))


_MAX_PLANS = 64  # call plans kept per gate/up weight


def _spec(t) -> tuple | None:
    return None if t is None else (t.shape, t.dtype, t.device, t.data_ptr() % 16)


def _plan_key(x, w_gate_up, w_down, idx, weights, gu_bias, dn_bias, activation, alpha, limit, layout) -> tuple | None:
    """What a call plan of :func:`moe_experts` depends on besides ``w_gate_up``'s version (plans live in
    its state), or None where no plan may serve (QTensor weights only, CUDA x as :func:`plannable` says,
    contiguous tensor arguments): the inputs' shapes, dtypes, devices and alignment, the activation, the
    version of ``w_down``, the routing switches, the stream and the linear tuning record (plans on or off)."""
    from . import decode, grouped, tuning as moe_tuning

    if not (isinstance(w_gate_up, QTensor) and isinstance(w_down, QTensor) and isinstance(idx, torch.Tensor)
            and isinstance(weights, torch.Tensor) and isinstance(x, torch.Tensor) and plannable(x)
            and all(b is None or isinstance(b, torch.Tensor) for b in (gu_bias, dn_bias))):
        return None
    # (a launch takes a bias's row stride by value: strided inputs would replay the recorded strides)
    if not all(t is None or t.is_contiguous() for t in (idx, weights, gu_bias, dn_bias)):
        return None
    return ("moe_experts", x.shape, x.dtype, x.device, x.data_ptr() % 16, _spec(idx), _spec(weights), _spec(gu_bias),
            _spec(dn_bias), activation, alpha, limit, layout, weight_key(w_down), decode.DECODE_MAX_PER_EXPERT,
            grouped.ROUTE_KERNEL_MAX_ROWS, moe_tuning.PREFILL_WS_MIN_PER_EXPERT, moe_tuning.DECODE_PDL,
            _kl.current_stream(), linear_tuning.serial())


def moe_experts(x: torch.Tensor, w_gate_up: QTensor | PackedExperts, w_down: QTensor | PackedExperts,
                top_k_index: torch.Tensor, top_k_weights: torch.Tensor, *, activation: str = "swiglu",
                gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None,
                alpha: float | None = None, limit: float | None = None, layout: str = "concat") -> torch.Tensor:
    """The experts forward of a MoE layer: each token through its ``top_k`` experts, weighted and summed.

    ``out[t] = sum_j top_k_weights[t, j] * (act(x[t] @ Wgu[e]^T + bgu[e]) @ Wd[e]^T + bd[e])``,
    ``e = top_k_index[t, j]``. On CUDA: tokens sorted per expert on the device (no host sync),
    the gate/up grouped GEMM reading the gathered rows of ``x`` directly, the activation, the down
    grouped GEMM, and the weighted sum in fp32 in token order (deterministic).

    Args:
        x: ``[T, H]``.
        w_gate_up: QTensor ``[E, 2I, H]`` (gate and up stacked along N as ``layout`` says).
        w_down: QTensor ``[E, H, I]``.
        top_k_index: int ``[T, top_k]`` expert ids in ``[0, E)``; top_k_weights: ``[T, top_k]``.
        activation: ``"swiglu"`` (``silu(gate) * up``) or ``"swiglu_clamped"`` (gpt-oss:
            ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)``, ``g = clamp(gate, max=limit)``;
            ``alpha`` defaults to 1.702 and ``limit`` to 7.0).
        gate_up_bias / down_bias: optional ``[E, 2I]`` / ``[E, H]``.
        layout: ``"concat"`` (gate rows then up rows) or ``"interleaved"`` (gate, up alternating: gpt-oss).

    Returns:
        ``[T, H]`` in x's dtype.

    Eager calls on CUDA that take the decode path replay a call plan from the third call with the same
    shapes, dtypes, alignment, biases' shapes, activation, ``w_down`` version and stream (kept with
    ``w_gate_up``, as ``ms.linear`` keeps its own: :mod:`microscale.linear.plans`).
    """
    key = _plan_key(x, w_gate_up, w_down, top_k_index, top_k_weights, gate_up_bias, down_bias, activation, alpha,
                    limit, layout)
    ins = (x, top_k_index, top_k_weights, gate_up_bias, down_bias)
    if key is not None:
        plans = state(w_gate_up).plans
        y = through_plan(plans, key, ins, None, _MAX_PLANS, replay_only=True)  # (a key with a plan was checked)
        if y is not None:
            return y
    if activation not in ACTIVATIONS:
        raise ValueError(f"{_MOE}: activation={activation!r}; expected one of {', '.join(ACTIVATIONS)}")
    if layout not in LAYOUTS:
        raise ValueError(f"{_MOE}: layout={layout!r}; expected one of {', '.join(LAYOUTS)}")
    if activation == "swiglu_clamped":
        alpha = 1.702 if alpha is None else float(alpha)
        limit = 7.0 if limit is None else float(limit)
    elif alpha is not None or limit is not None:
        raise ValueError(f"{_MOE}: alpha/limit apply to activation='swiglu_clamped', not {activation!r}")
    gu = _packed(w_gate_up)
    dn = _packed(w_down)
    e, h2, hid = gu.e, gu.n, gu.k
    if h2 % 2 or dn.e != e or dn.n != hid or dn.k != h2 // 2:
        raise ValueError(f"{_MOE}: w_gate_up [{e}, {h2}, {hid}] and w_down [{dn.e}, {dn.n}, {dn.k}] do not fit: "
                         f"expected w_down [{e}, {hid}, {h2 // 2}]")
    _check_x(x, hid, op=_MOE)
    if not isinstance(top_k_index, torch.Tensor) or top_k_index.dim() != 2 or top_k_index.shape[0] != x.shape[0] \
            or top_k_index.dtype.is_floating_point:
        raise ValueError(f"{_MOE}: top_k_index must be an integer [T={x.shape[0]}, top_k] tensor, got "
                         f"{getattr(top_k_index, 'dtype', None)} {tuple(getattr(top_k_index, 'shape', ()))}")
    if not isinstance(top_k_weights, torch.Tensor) or top_k_weights.shape != top_k_index.shape:
        raise ValueError(f"{_MOE}: top_k_weights must match top_k_index's shape {tuple(top_k_index.shape)}, got "
                         f"{tuple(getattr(top_k_weights, 'shape', ()))}")
    if top_k_index.device.type == "cpu" and top_k_index.numel() and not torch.compiler.is_compiling():
        lo, hi = int(top_k_index.min()), int(top_k_index.max())
        if lo < 0 or hi >= e:
            raise ValueError(f"{_MOE}: top_k_index holds {lo if lo < 0 else hi}, outside [0, {e})")
    _check_bias(gate_up_bias, e, h2, x.device, "gate_up_bias", _MOE)
    _check_bias(down_bias, e, hid, x.device, "down_bias", _MOE)
    if key is not None:
        y = through_plan(plans, key, ins,
                         lambda: _forward_launches(x, gu, dn, top_k_index, top_k_weights, gate_up_bias, down_bias,
                                                   activation, alpha, limit, layout), _MAX_PLANS)
        if y is not None:
            return y
    return torch.ops.microscale.moe_experts(
        x, *_tensors(gu), *_tensors(dn), top_k_index, top_k_weights, gate_up_bias, down_bias, fmt_json(gu.fmt),
        fmt_json(dn.fmt), [h2, hid, h2 // 2], [gu.specials, dn.specials], _mma(gu), _mma(dn), activation, alpha,
        limit, layout)
