"""The MoE prefill path's launcher (device code: ``_kernels._prefill_ws._moe_prefill_ws_kernel``): the linear op's
warp-specialized Gluon prefill with an expert axis, for E2M1 experts (MXFP4, NVFP4) and bf16 activations on a
Hopper. The grouped rows' activations are gathered and K-permuted in one pass (the linear op's ``_xperm_kernel``),
then one persistent launch covers every expert's tiles from the routing's device tile map."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..linear import tuning as linear_tuning
from ..runtime import target
from ..runtime.launch import cdiv, launch
from .packed import OP, PackedExperts

_ACT = {"swiglu": 1, "swiglu_clamped": 2}


@dataclass(frozen=True)
class PrefillConfig:
    """``block_t`` grouped rows a tile (the wgmma N: 64 or 128; at 256 the epilogues spill), ``stages``
    activation ring slots, ``group_t`` tile-map slots that sweep the row tiles together (L2 reuse of their
    activations)."""

    block_t: int = 128
    stages: int = 4
    group_t: int = 4


def choose_prefill_config(per_expert: float) -> PrefillConfig:
    """64-row tiles up to 96 grouped rows expected per touched expert (less waste in each expert's last tile),
    128 beyond (the grouped kernel's choice)."""
    return PrefillConfig(block_t=64 if per_expert <= 96 else 128, stages=6 if per_expert <= 96 else 4)


def prefill_takes(pe: PackedExperts, x: torch.Tensor, rows: int) -> bool:
    """Whether :func:`microscale.moe.op.moe_experts` / ``grouped_linear`` route ``rows`` grouped rows of ``x`` here:
    :data:`~microscale.moe.tuning.PREFILL_WS_MIN_PER_EXPERT` set, at least that many rows expected per touched
    expert, and :func:`prefill_reason` None."""
    from . import tuning

    least = tuning.PREFILL_WS_MIN_PER_EXPERT
    return (least is not None and rows / max(1.0, tuning.expected_touched(rows, pe.e)) >= least
            and pe.k % 64 == 0 and prefill_reason(pe, x) is None)


def prefill_reason(pe: PackedExperts, x: torch.Tensor) -> str | None:
    """Why the prefill path cannot take ``x`` on ``pe``, or None: E2M1 experts with their decode view
    (:func:`~microscale.moe.packed.mma_operand`), bf16 ``x`` with unit last stride on a Hopper (sm_90: wgmma)."""
    if pe.mma is None:
        return "needs E2M1 experts (MXFP4, NVFP4) with their decode view"
    if x.dtype != torch.bfloat16 or x.stride(-1) != 1:
        return "needs bfloat16 activations with unit last stride"
    if not x.is_cuda or target.capability(x.device) != (9, 0):
        return "needs a Hopper GPU (sm_90: wgmma)"
    return None


def scale_args(pe: PackedExperts) -> tuple[int, int, float]:
    """The Gluon decode's ``(SK, ke, post)`` for ``pe`` (as :func:`microscale.linear.backends.prefill_ws.gluon_scale_args`
    gives them for a 2-D E2M1 weight), from the decode view's scan (``pe.mma``: gemv_mma's scale kind, E8M0
    input, epilogue exponent ``d``)."""
    from ..linear._kernels import _gemv_mma as gk
    from ..linear._kernels import _prefill_gluon as pg

    sk, _, d = pe.mma
    imad = linear_tuning.get().gluon_scale_imad
    if sk == gk.SK_E8M0:  # E2M1 under E8M0: the window's D, the same placement as gemv_mma's
        return (pg.SK_E8M0N if imad else pg.SK_E8M0), 126 - d, 2.0 ** d
    # (the decode view records the UE4M3 scan as gemv_mma's kind: SK_UE4M3N where the bytes were all normal but in
    # zero blocks and gemv_mma_scale_imad was on at prepare time; otherwise the general decode, as exact)
    normal = sk == gk.SK_UE4M3N
    return (pg.SK_UE4M3N if imad and normal else pg.SK_UE4M3), 0, 2.0 ** 7


def prefill_run(x: torch.Tensor, pe: PackedExperts, offsets: torch.Tensor, bias: torch.Tensor | None = None,
                rows: torch.Tensor | None = None, config: PrefillConfig | None = None,
                out: torch.Tensor | None = None, *, gather_div: int = 1, tiles: tuple | None = None,
                act: tuple | None = None, scatter: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`~microscale.moe.grouped.grouped_run`'s contract (rows, gather, ``act`` and ``scatter`` epilogues) on
    the Gluon prefill kernel; ``tiles``: the tile map for ``config.block_t``-row tiles. Raises ValueError saying
    why where :func:`prefill_reason` refuses the call."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ..linear._kernels import _prefill_gluon as pg
    from ..linear.backends.prefill_ws import launch_direct
    from ._kernels import _prefill_ws as kern
    from .grouped import max_tiles, tile_map

    why = prefill_reason(pe, x)
    if why is not None:
        raise ValueError(f"{OP}: the prefill path {why}")
    c = config or PrefillConfig()
    if c.block_t not in (64, 128) or not 2 <= c.stages <= 200 * 8 // c.block_t or c.group_t < 1:
        raise ValueError(f"{OP}: the prefill path needs block_t 64 or 128, 2 <= stages <= "
                         f"{200 * 8 // max(c.block_t, 1)} and group_t >= 1, got {c.block_t}, {c.stages}, {c.group_t}")
    if scatter is not None and rows is None:
        raise ValueError(f"{OP}: scatter needs rows (the sorted pair index)")
    r = rows.numel() if rows is not None else x.shape[0]
    n, k = pe.n, pe.k
    if k % 64:
        raise ValueError(f"{OP}: the prefill path needs K a multiple of 64, got {k}")
    n_out = n // 2 if act is not None else n
    if out is None:
        out = torch.empty((r, n_out), dtype=torch.float32 if scatter is not None else x.dtype, device=x.device)
    if r == 0:
        return out
    bk = int(pg.BK.value)
    xp = torch.empty((r, k), dtype=x.dtype, device=x.device)  # the grouped rows in the consumers' K order
    gather = rows is not None and scatter is None
    launch(pg._xperm_kernel, (cdiv(r, 32), k // bk), x, xp, r, x.stride(0), K=k, BLOCK_R=32, CB=4,
           rows_ptr=rows if gather else x, gather_div=gather_div, GATHER=gather, num_warps=4)
    desc = TensorDescriptor.from_tensor(xp, [c.block_t, bk],
                                        gl.NVMMASharedLayout.get_default_for([c.block_t, bk], gl.bfloat16))
    mt = max_tiles(r, pe.e, c.block_t)
    te, tb = tiles if tiles is not None else tile_map(offsets, c.block_t, mt)
    sk, ke, post = scale_args(pe)
    words = pe.words.reshape(pe.e * n, -1)
    sb = pe.wscales.reshape(pe.e * n, -1)
    n_n = cdiv(n_out, 64) if act is not None else cdiv(n, 128)
    grid = min(te.numel() * n_n, target.num_sms(x.device))
    a_name, alpha, limit, layout = act if act is not None else ("", 1.0, 0.0, "")
    dummy = out
    launch_direct(kern._moe_prefill_ws_kernel, (grid,), desc, words, sb,
                  pe.global_scale if pe.global_scale is not None else dummy, bias if bias is not None else dummy, out,
                  rows if rows is not None else offsets, scatter if scatter is not None else dummy, te, tb, offsets,
                  pe.e, n, k, te.numel(), words.stride(0), sb.stride(0), bias.stride(0) if bias is not None else 0,
                  out.stride(0), ke, post, float(alpha or 1.0), float(limit or 0.0), BT=c.block_t, STAGES=c.stages,
                  GROUP_T=c.group_t, SK=sk, TPS=pe.fmt.block_size // 16, HAS_GS=pe.global_scale is not None,
                  HAS_BIAS=bias is not None, ACT=_ACT.get(a_name, 0), CONCAT=layout == "concat",
                  SCATTER=scatter is not None, num_warps=4)
    return out
