"""The f16x2 GEMV on the canonical layout for up to a few tokens (4/8-bit float or integer
codes; device code: :mod:`microscale.linear._kernels._gemv_kernels`; docs/decisions/linear-gemv.md)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from ...formats.kinds import scale_kind
from ...qtensor import QTensor
from ...runtime import target
from ...runtime.launch import launch
from ...runtime.workspace import scratch
from .. import tuning
from ..eligibility import OP, gemv_kind
from ..weight_state import views_hit


@dataclass(frozen=True)
class GemvConfig:
    """Tiles of the GEMV: ``block_n`` weight rows x ``block_kw`` int32 words of codes per
    step, K split ``split_k`` ways (fp32 atomics when > 1); ``chain``: words whose products
    accumulate in f16 before one conversion to f32 (0: as many as a scale block holds,
    at most 4); ``tokens``: tokens sharing one decode (0: all, at most 4); ``pdl``: launch
    the GEMV as a programmatic dependent of the activation prep (Hopper+), which also
    brings the launch chain with the previous call and, once the weight's views are cached,
    its first weight loads ahead of the wait (``tuning.gemv_pdl_chain`` / ``tuning.gemv_early_w``); ``prefetch``:
    load the next K step's operands before the current step's arithmetic; ``f4_select``:
    4-bit float codes decoded by the select variant (``_gemv_kernels._decode_word_ptx``:
    11% fewer SASS per word); ``scale_pairs``: UE4M3 scales applied in the PTX loaded as
    16-bit pairs of neighbouring chains (half the loads, a smaller layout conversion). Both
    are on by default and ignored where they do not apply (other element kinds, other scales,
    odd scale strides). ``scale_direct``: block scales loaded by PTX straight into the layout
    of their use (no shared-memory layout conversion and barriers per K step; PTX path,
    unmasked tiles; zero points likewise), on by default, bit-identical outputs. Measured
    choices: docs/decisions/linear-gemv.md."""

    block_n: int = 8
    block_kw: int = 256
    split_k: int = 1
    num_warps: int = 2
    num_stages: int = 4
    chain: int = 0
    tokens: int = 0
    pdl: bool = False
    prefetch: bool = False
    f4_select: bool = True
    scale_pairs: bool = True
    scale_direct: bool = True


def gemv_supported(q: QTensor, x: torch.Tensor, max_m: int | None = None) -> bool:
    """Whether :func:`gemv` serves ``x @ dequant(q)^T``: a CUDA weight of 4/8-bit
    minifloats (E2M1, E4M3, E5M2), signed 4/8-bit integers, or unsigned 4/8-bit integers
    with a zero point (affine), with 1-D blocks of whole words, unpadded, at most
    ``max_m`` tokens (default ``tuning.gemv_max_m``)."""
    if max_m is None:
        max_m = tuning.get().gemv_max_m
    f = q.fmt
    return (x.is_cuda and q.data.is_cuda and len(q.shape) == 2 and x.dim() >= 1
            and x.shape[-1] == q.shape[-1] and x.numel() // max(x.shape[-1], 1) <= max_m
            and x.dtype in (torch.bfloat16, torch.float16) and gemv_kind(f) is not None
            and f.block_rows == 1 and (f.block_size * f.element.bits) % 32 == 0
            and tuple(q.padded_shape) == tuple(q.shape))


def choose_gemv_config(n: int, k: int, device: torch.device, m: int = 1, bits: int = 4) -> GemvConfig:
    """Few rows and long K strips per program, the next step's loads issued early, and a
    programmatic dependent launch on Hopper; K split only when rows give fewer than about 4
    programs per SM. One token: 4 rows per program on weights of at least
    ``gemv_programs_per_sm * SMs * 4`` rows, else 2 (twice the programs in flight); two tokens of
    4-bit weights likewise; 8-bit codes at one token on the short weights run one warp per
    program, with 512-word steps on rows of at least 4096 words (docs/decisions/linear-gemv.md)."""
    return _choose_gemv_config(n, k, m, bits, target.pdl_capable(device), target.num_sms(device),
                               tuning.get().gemv_programs_per_sm)


@functools.lru_cache(maxsize=1024)  # a pure function of its arguments, asked on every call
def _choose_gemv_config(n: int, k: int, m: int, bits: int, pdl: bool, sms: int, per_sm: int) -> GemvConfig:
    rows = 4 if n >= 4 * per_sm * sms else 2
    kw = k * bits // 32
    if m == 1 and bits == 8 and rows == 2:  # one warp per program; 512-word steps on long rows
        d = GemvConfig(block_n=2, block_kw=512 if kw >= 8 * 512 else 256, num_warps=1, num_stages=4, pdl=pdl,
                       prefetch=True)
    elif m == 1 or (m == 2 and bits == 4):
        d = GemvConfig(block_n=rows, block_kw=256, num_warps=2, num_stages=4, pdl=pdl, prefetch=True)
    elif m == 2:
        d = GemvConfig(block_n=4, block_kw=256, num_warps=2, num_stages=4, pdl=pdl)
    else:
        d = GemvConfig(block_n=4, block_kw=128, num_warps=1, num_stages=4, pdl=pdl, prefetch=True)
    bn, bkw = d.block_n, d.block_kw
    while bkw > 8 and kw % bkw:
        bkw //= 2
    tiles = -(-n // bn)
    want = 4 * sms
    split = 1
    while tiles * split < want and kw // (bkw * split * 2) >= 4:
        split *= 2
    return replace(d, block_kw=bkw, split_k=split)


def gemv(x2: torch.Tensor, q: QTensor, bias: torch.Tensor | None = None, config: GemvConfig | None = None,
         use_asm: bool | None = None) -> torch.Tensor:
    """``x2 [M, K] @ dequant(q)^T (+ bias)`` for few tokens, reading q's canonical layout
    (see :mod:`microscale.linear._kernels._gemv_kernels`). ``use_asm=False`` runs the plain-Triton
    twin of the PTX decode (what the interpreter runs)."""
    from .._kernels import _gemv_kernels as kern

    m, k = x2.shape
    n = q.shape[0]
    if k != q.shape[1]:
        raise ValueError(f"{OP}: x has K={k} but the weight has K={q.shape[1]}")
    kind = gemv_kind(q.fmt)
    if kind is None:
        raise ValueError(f"{OP}: the GEMV has no decode for element {q.fmt.element.name}")
    f = q.fmt
    bits = f.element.bits
    kw = k * bits // 32
    wpg = f.block_size * bits // 32
    if k % (32 // bits) or f.block_size * bits % 32:
        raise ValueError(f"{OP}: K={k} and block {f.block_size} must be whole int32 words of codes")
    c = config or choose_gemv_config(n, k, x2.device, m, bits)
    chain = c.chain or min(wpg, 4)
    tokens = min(c.tokens or m, 4, m)
    if kw % c.block_kw or c.block_kw % wpg or wpg % chain or c.block_kw % chain:
        raise ValueError(f"{OP}: block_kw={c.block_kw} must divide {kw} words and hold whole blocks "
                         f"({wpg} words) of whole chains ({chain})")
    asm = (not target.interpreting()) if use_asm is None else use_asm
    # UE4M3 block scales (<= 448) are applied in f16 inside the PTX when a chain is a block
    s_in = f.scale.name == "ue4m3" and chain == wpg and c.block_kw % (2 * chain) == 0
    xe = kern.x_exponent(kind, chain, 2 * 448.0 if s_in else 1.0)  # two scaled chains summed in f16
    x2 = x2.contiguous()
    mp = -(-m // tokens) * tokens
    nch = kw // c.block_kw  # activation chunks, one power of two each
    xp = scratch((mp, k), torch.float16, x2.device)
    xs = scratch((mp, nch), torch.float32, x2.device)
    if mp > m:
        xp[m:].zero_()
        xs[m:].zero_()
    # everything the GEMV launch needs is made before the prep, so that the GEMV directly
    # follows it (its programmatic-launch primary): views (copies on a first use), output
    wv, settled = views_hit(q)
    scales = wv.scales_int
    spair = (c.scale_pairs and s_in and scales.element_size() == 1 and scales.stride(0) % 2 == 0
             and scales.data_ptr() % 2 == 0)
    split = c.split_k
    out = (torch.zeros if split > 1 else torch.empty)((m, n), dtype=torch.float32 if split > 1 else x2.dtype,
                                                      device=x2.device)
    pdl = asm and c.pdl
    chain_pdl = pdl and tuning.get().gemv_pdl_chain
    launch(kern._prep_x_kernel, (m, nch), x2, xp, xs, x2.stride(0), K=k, XE=xe, KIND=kind, CW=c.block_kw,
           USE_PDL=pdl, WAIT_PDL=chain_pdl, num_warps=4, **({"launch_pdl": True} if chain_pdl else {}))
    gs = q.global_scale if q.global_scale is not None else xs
    b = bias if bias is not None else xs
    zp = wv.zero_points if f.zero_point else scales
    kw_per = -(-kw // split)
    kw_per = -(-kw_per // c.block_kw) * c.block_kw
    even_n, even_k = n % c.block_n == 0, kw_per * split == kw
    sdirect = kern.scale_load_asm(2 if spair else scales.element_size()) \
        if c.scale_direct and asm and even_n and even_k else ""
    el = f.element
    elem_c = 2.0 ** (15 - el.bias) if kind == kern.F4 else 2.0 ** (-el.frac_bits) if el.kind == "int" else 1.0
    launch(kern._gemv_kernel, (-(-n // c.block_n), split),
        xp.view(torch.int32), xs, wv.words, scales, zp, gs, b, out,
        n, kw, scales.stride(0), zp.stride(0), out.stride(0), M=m, KW=kw, KIND=kind, MBITS=el.mbits, ELEM_C=elem_c,
        SCALE_KIND=int(scale_kind(f)), WPG=wpg, HAS_GS=f.global_scale, HAS_BIAS=bias is not None,
        BLOCK_N=c.block_n, BLOCK_KW=c.block_kw, KW_PER_SPLIT=kw_per, SPLIT_K=split, CHAIN=chain, T=tokens,
        USE_ASM=asm, ASM=kern.word_asm(kind, el.mbits, tokens, c.f4_select) if asm else "",
        CONS=kern.word_constraints(kind, tokens), SCALE_IN_ASM=s_in,
        USE_PDL=pdl, PREFETCH=c.prefetch, HAS_ZP=f.zero_point, SPAIR=spair, EARLY_W=tuning.get().gemv_early_w and settled,
        PDL_CHAIN=chain_pdl, SDIRECT=sdirect, **({"launch_pdl": True} if pdl else {}),
        EVEN_N=even_n, EVEN_K=even_k, num_warps=c.num_warps, num_stages=c.num_stages)
    return out.to(x2.dtype) if split > 1 else out
