"""The public op ``embedding(ids, table, padding_idx=None)``: gather rows of a quantized
``[V, D]`` table and dequantize them.

On CUDA one Triton launch reads only the gathered rows' codes and scales and writes the
dequantized rows (:mod:`._kernels.gather`); on the CPU the same rows go through the reference
dequantize. Both equal ``dequantize(table)[ids]`` bit for bit.
"""
from __future__ import annotations

import functools

import torch

from ..formats.kinds import ScaleKind
from ..linear import tuning
from ..linear.plans import plannable, through_plan
from ..linear.weight_state import state
from ..qtensor import QTensor
from ..reference import dequantize as _ref_dequantize
from ..runtime import launch as _kl
from ..runtime import target

__all__ = ["embedding", "embedding_reference", "embedding_triton"]

_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@functools.cache
def _device():
    """The launcher and the gather kernel: they import Triton, so on first use."""
    from ..runtime import launch
    from ._kernels import gather

    return launch, gather


def _check(ids: torch.Tensor, table: QTensor, padding_idx: int | None, dtype: torch.dtype | None,
           op: str = "embedding") -> tuple[int, torch.dtype]:
    if not isinstance(table, QTensor):
        raise TypeError(f"{op}: table must be a QTensor [V, D], got {type(table).__name__}")
    if len(table.shape) != 2:
        raise ValueError(f"{op}: table must be 2-D [V, D], got shape {tuple(table.shape)}")
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int32, torch.int64):
        got = ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise TypeError(f"{op}: ids must be an int32 or int64 tensor, got {got}")
    if ids.device != table.device:
        raise ValueError(f"{op}: ids are on {ids.device} but the table is on {table.device}")
    V = int(table.shape[0])
    if padding_idx is not None:
        if not isinstance(padding_idx, int) or not -V <= padding_idx < V:
            raise ValueError(f"{op}: padding_idx={padding_idx!r} must be an int in [-{V}, {V}) for a table of {V} rows")
    dtype = table.dtype if dtype is None else dtype
    if dtype not in _OUT_DTYPES:
        raise TypeError(f"{op}: dtype must be one of float32, float16, bfloat16, got {dtype}")
    return V, dtype


def _range_error(ids: torch.Tensor, V: int, op: str = "embedding") -> ValueError:
    bad = ids[(ids < 0) | (ids >= V)]
    return ValueError(f"{op}: ids must lie in [0, {V}) (the table's rows); got {bad.numel()} outside, "
                      f"e.g. {int(bad.reshape(-1)[0])}")


def embedding_reference(ids: torch.Tensor, table: QTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``dequantize(table)[ids]`` on any device, decoding only the gathered rows (2-D block
    formats: their whole row groups). An id outside ``[0, V)`` is a ValueError."""
    V, dtype = _check(ids, table, None, dtype, "embedding_reference")
    flat = ids.reshape(-1).long()
    if flat.numel() and (bool((flat < 0).any()) or bool((flat >= V).any())):
        raise _range_error(flat, V, "embedding_reference")
    fmt = table.fmt
    BR = fmt.block_rows
    D = int(table.shape[1])
    if flat.numel() == 0:
        return torch.empty((*ids.shape, D), dtype=dtype, device=table.device)
    # the distinct scale-row groups the ids touch, decoded once each
    grp, inv = torch.unique(flat // BR, return_inverse=True)
    rows = (grp[:, None] * BR + torch.arange(BR, device=flat.device)[None, :]).reshape(-1)
    prow = table.data.shape[0]
    rows = rows.clamp(max=prow - 1)  # the last group may be short of rows: its scale row is the same
    sub = QTensor(table.data[rows], table.scales[grp] if BR > 1 else table.scales[rows], fmt,
                  torch.Size((rows.numel(), D)), table.dtype, table.global_scale,
                  None if table.zero_points is None else (table.zero_points[grp] if BR > 1 else table.zero_points[rows]),
                  dict(table.meta))
    dq = _ref_dequantize(sub, dtype)
    return dq[inv * BR + flat % BR].reshape(*ids.shape, D)


#: (device, stream, checked) -> the out-of-range flag the gather raises to 1 (one int32, never zeroed
#: before a call: one launch less). A checked call (``check=True``, no graph capture) reads its flag and,
#: when it is set, zeroes it before raising, so the flag of checked calls is 0 when each one starts (calls
#: on one stream run in order); unchecked calls and captured ones raise a flag nobody reads.
_FLAGS: dict = {}


def _flag(device: torch.device, checked: bool) -> torch.Tensor:
    """This stream's out-of-range flag for checked or for unchecked calls."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    flag = _FLAGS.get((device, stream, checked))
    if flag is None:
        flag = _FLAGS[(device, stream, checked)] = torch.zeros(1, dtype=torch.int32, device=device)
    return flag


_MAX_PLANS = 64  # call plans kept per table


def _plan_key(flat: torch.Tensor, dtype: torch.dtype, checked: bool) -> tuple:
    return ("embedding", flat.shape, flat.dtype, flat.device, flat.data_ptr() % 16, dtype, checked,
            _kl.current_stream(), tuning.serial())


def _gather_planned(flat: torch.Tensor, table: QTensor, dtype: torch.dtype, checked: bool, launch_gather):
    """The gather through a call plan kept with the table (its state), as ``ms.linear`` keeps its own:
    recorded on a key's second eager call, replayed from its third with the new ids and a new output.
    Key: the ids' shape, dtype, device and 16-byte alignment, the output dtype, checked or not, the
    stream and the linear tuning record (plans on or off). None where no plan serves yet."""
    if not plannable(flat):
        return None
    return through_plan(state(table).plans, _plan_key(flat, dtype, checked), (flat,),
                        lambda: (launch_gather(), True), _MAX_PLANS)


def gather_tile(block: int, k: int) -> tuple[int, int, int]:
    """``(tokens, columns, warps)`` of one program of the gather kernel for rows of ``k`` stored
    elements in blocks of ``block``: columns a power of two of at least one block and 8, up to 512
    (or the row); 8 tokens, more for short rows (about 4096 elements a program); 4 warps. On an H100
    (4096 ids of a 128256 x 4096 table) 8 x 512 tiles took 19.5-22.2 µs where 4 x 128 took 27.8-29.5
    and 1-16 x 256-4096 with 8-16 warps 19.5-25.7."""
    tk = max(block, 8)
    while tk < 512 and tk < k:
        tk *= 2
    return max(8, min(64, 4096 // tk)), tk, 4


def embedding_triton(ids: torch.Tensor, table: QTensor, dtype: torch.dtype | None = None, *,
                     check: bool = True) -> torch.Tensor:
    """The GPU gather: one launch decodes only the gathered rows, bit-identical to
    :func:`embedding_reference`. An out-of-range id reads nothing (its output row is NaN) and sets
    a device flag; with ``check`` (default) the flag is read back (one host sync; skipped while a
    CUDA graph is captured) and raises a ValueError naming the id. No launch zeroes the flag before
    the gather (see ``_FLAGS``). Eager calls replay a call plan from the third with the same ids
    shape, dtype and table version (``_gather_planned``)."""
    out = _replay(ids, table, dtype, check)
    if out is not None:
        return out
    V, dtype = _check(ids, table, None, dtype, "embedding_triton")
    if table.device.type != "cuda" and not target.interpreting():
        raise ValueError(f"embedding_triton: the table is on {table.device}; this is the GPU kernel's entry point "
                         "(ms.embedding takes CPU tensors through the reference; TRITON_INTERPRET=1 emulates the kernel)")
    table.validate()  # the kernel addresses scales and zero points by the data's shape
    from ..quant import params as _p  # (no Triton import)

    why = _p.unsupported_reason(table.fmt)
    if why:
        raise NotImplementedError(f"embedding_triton: {why}")
    D = int(table.shape[1])
    flat = ids.reshape(-1).contiguous()
    if flat.numel() == 0:
        return _p._empty((0, D), dtype, table.device).reshape(*ids.shape, D)
    checked = check and not (table.device.type == "cuda" and torch.cuda.is_current_stream_capturing())
    flag = _flag(table.device, checked)
    out = _gather_planned(flat, table, dtype, checked, lambda: _launch(flat, table, dtype, flag))
    if out is None:
        out = _launch(flat, table, dtype, flag)
    _raise_if_flagged(flag, checked, flat, V)
    return out.reshape(*ids.shape, D)


def _raise_if_flagged(flag: torch.Tensor, checked: bool, flat: torch.Tensor, V: int) -> None:
    """A checked call's flag read back: when set, zeroed (the next checked call starts from 0) and raised."""
    if checked and int(flag.item()):
        flag.zero_()
        raise _range_error(flat.long(), V, "embedding")


def _replay(ids, table, dtype, check) -> torch.Tensor | None:
    """The call through a kept plan, before any argument check (a key with a plan was checked when it
    was recorded), or None."""
    if not (isinstance(table, QTensor) and isinstance(ids, torch.Tensor) and ids.is_cuda and ids.is_contiguous()):
        return None
    flat = ids.reshape(-1)
    if not flat.numel() or not plannable(flat):
        return None
    dt = table.dtype if dtype is None else dtype
    checked = bool(check)
    out = through_plan(state(table).plans, _plan_key(flat, dt, checked), (flat,), None, _MAX_PLANS,
                       replay_only=True)
    if out is None:
        return None
    _raise_if_flagged(_flag(table.device, checked), checked, flat, int(table.shape[0]))
    return out.reshape(*ids.shape, out.shape[-1])


def _launch(flat: torch.Tensor, table: QTensor, dtype: torch.dtype, flag: torch.Tensor) -> torch.Tensor:
    """One gather launch: rows ``flat`` of ``table`` into a new ``[T, D]`` tensor of ``dtype``."""
    from ..quant import params as _p  # (no Triton import)

    rl, k = _device()
    fmt = table.fmt
    e = fmt.element
    K = int(table.padded_shape[-1])
    D = int(table.shape[1])
    T = flat.numel()
    V = int(table.shape[0])
    out = _p._empty((T, D), dtype, table.device)
    skind = _p._scale_kind(fmt)
    scales = table.scales.contiguous()
    scales = scales.view(torch.uint8) if skind < ScaleKind.FP16 else scales  # E8M0 / UE4M3 bytes
    data = table.data.contiguous()
    g = table.global_scale
    if g is not None:
        g = g.to(device=table.device, dtype=torch.float32).reshape(1)
    nan = sorted(e.nan_codes)
    TR, TK, warps = gather_tile(fmt.block_size, K)
    per_byte = 8 // e.bits if 8 % e.bits == 0 else 0  # codes a byte (0: 3/5/6-bit codes, packed 8 in BITS bytes)
    word32 = (per_byte > 0 and (K // per_byte) % 4 == 0 and (TK // per_byte) % 4 == 0
              and data.storage_offset() % 4 == 0 and data.data_ptr() % 4 == 0)
    if word32:
        data = data.view(torch.int32)
    rl.launch(k._embedding_kernel, (rl.cdiv(T, TR), rl.cdiv(D, TK)),
              flat, data, scales, data if table.zero_points is None else table.zero_points.contiguous(),
              data if g is None else g, out, flag, T, V, K, D, K // fmt.block_size,
              TR=TR, TK=TK, B=fmt.block_size, BR=fmt.block_rows,
              BITS=e.bits, IS_INT=e.kind == "int", SIGNED=e.signed, STEP=float(2.0 ** -e.frac_bits),
              MBITS=e.mbits, POW=float(2.0 ** (127 - e.bias)), NAN_MIN=nan[0] if nan else -1,
              INF_CODE=e.inf_code if e.has_inf else -1, SCALE_KIND=skind, HAS_ZP=fmt.zero_point,
              HAS_GLOBAL=fmt.global_scale, MANUAL_BF16=_p._MANUAL_BF16, WORD32=word32,
              num_warps=warps, enable_fp_fusion=False)
    return out


def embedding(ids: torch.Tensor, table: QTensor, padding_idx: int | None = None, *,
              dtype: torch.dtype | None = None, check: bool = True) -> torch.Tensor:
    """Rows ``ids`` of the dequantized table: ``dequantize(table)[ids]``, bit for bit, without
    dequantizing the rest of the table.

    Args:
        ids: int32/int64 token ids, any shape, on the table's device.
        table: a QTensor ``[V, D]`` in any registry format.
        padding_idx: as in ``torch.nn.functional.embedding``: checked to lie in ``[-V, V)``; the
            forward output of that row is the table's row (the index matters to gradients only,
            and a quantized table has none).
        dtype: output dtype (default: the table's original dtype).
        check: on CUDA, read back the kernel's out-of-range flag and raise (one host sync per
            call; skipped while a CUDA graph is captured). On the CPU ids are always checked.

    Returns:
        ``[*ids.shape, D]`` in ``dtype``.

    Raises:
        ValueError: an id outside ``[0, V)`` (on CUDA with ``check=False`` its row is NaN instead).
    """
    _check(ids, table, padding_idx, dtype)
    if table.device.type == "cuda":
        return embedding_triton(ids, table, dtype, check=check)
    return embedding_reference(ids, table, dtype)
