"""Column/row-parallel quantized linears and ``parallelize`` on real process groups (gloo, CPU).

One spawn of 4 processes runs every check, on the 4-rank world and on a 2-rank subgroup:
column-parallel gathered outputs equal the single-process ``ms.linear`` bit for bit for every
registry format; row-parallel reduced outputs within float32 summation order; a tiny Llama and a
tiny BERT (the demo model's architecture) built from configs, quantized and parallelized, give the
single-process quantized forward."""
from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import microscale as ms
from microscale.distributed import ColumnParallelQuantLinear, RowParallelQuantLinear, parallelize

WORLD = 4


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))


#: one format per element/scale family for the 2-rank subgroup (the 4-rank world runs every format)
SUBSET = ("nvfp4", "mxfp4", "mxfp6_e3m2", "mxint8", "int3_fp32", "int4_affine_g32", "fp8_e4m3_block128x128")


def _layers(group, world: int, rank: int) -> None:
    for i, name in enumerate(sorted(ms.registry)):
        if world == 2 and name not in SUBSET:
            continue
        f = ms.get_format(name)
        g = torch.Generator().manual_seed(100 + i)
        n = 4 * max(f.block_rows, f.block_size)  # N is also the K of the row-parallel layer after it
        k = 4 * f.block_size
        for ragged in (False, True):
            nn_, kk = (n - (f.block_rows if f.block_rows > 1 else 3), k - f.block_size) if ragged else (n, k)  # ragged: neither splits evenly
            w = torch.randn(nn_, kk, generator=g)
            q = ms.quantize(w, name, pad=True)
            x = torch.randn(3, kk, generator=g)
            b = torch.randn(nn_, generator=g)
            xb = x.to(torch.bfloat16)  # bf16 activations take ms.linear (its float64 reference on CPU)
            col = ColumnParallelQuantLinear.from_qtensor(q, b, group, gather_output=True, pad=ragged)
            full = ms.linear(xb, q, b)
            y = col(xb)
            assert y.dtype == full.dtype and y.shape == full.shape and torch.equal(y, full), (name, world, "column")
            full = torch.nn.functional.linear(x, q.dequantize(), b)  # float32 activations: the dequantize path
            y = col(x)
            # float32 GEMMs may block the K sum differently for another N: equal within summation order
            assert y.shape == full.shape and _rel(y, full) <= 1e-6, (name, world, rank, "column fp32")
            row = RowParallelQuantLinear.from_qtensor(q, b, group, pad=ragged)
            y = row(x)
            assert y.shape == full.shape and _rel(y, full) <= 1e-5, (name, world, rank, "row", _rel(y, full))
            # the pair column (no gather) -> row (parallel input) a tensor-parallel MLP uses
            q2 = ms.quantize(torch.randn(kk, nn_, generator=g), name, pad=True)
            if not ragged:
                h = ColumnParallelQuantLinear.from_qtensor(q, b, group, gather_output=False)(x)
                y = RowParallelQuantLinear.from_qtensor(q2, None, group, input_is_parallel=True)(h)
                ref = torch.nn.functional.linear(full, q2.dequantize())
                assert _rel(y, ref) <= 1e-5, (name, world, "column->row")
    # a shard boundary inside a block is an error naming the tensor, dim and world size
    q = ms.quantize(torch.randn(8, 48), "nvfp4")
    try:
        RowParallelQuantLinear.from_qtensor(q, None, group, name="mlp.down_proj") if world == 4 else None
    except ValueError as e:
        assert "mlp.down_proj" in str(e) and "4 equal shards" in str(e)
    else:
        assert world != 4


def _llama(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=8, num_key_value_heads=4,
                      num_hidden_layers=2, vocab_size=96, max_position_embeddings=64, attn_implementation="eager")
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def _bert(seed: int):
    from transformers import BertConfig, BertModel

    cfg = BertConfig(hidden_size=128, intermediate_size=256, num_attention_heads=8, num_hidden_layers=2,
                     vocab_size=96, max_position_embeddings=64, attn_implementation="eager")
    torch.manual_seed(seed)
    return BertModel(cfg, add_pooling_layer=False).eval()


def _models(group, world: int, rank: int) -> None:
    from microscale.nn import quantize_model

    ids = torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(5))
    cases = ((_llama, "nvfp4"), (_llama, "mxfp4"), (_bert, "nvfp4")) if world == 4 else ((_llama, "nvfp4"), (_bert, "mxfp4"))
    for build, fmt in cases:
        model = quantize_model(build(0), fmt)
        ref_model = copy.deepcopy(model)
        with torch.no_grad():
            ref = ref_model(ids)
            ref = ref.logits if hasattr(ref, "logits") else ref.last_hidden_state
            parallelize(model, group=group)
            out = model(ids)
            out = out.logits if hasattr(out, "logits") else out.last_hidden_state
        kinds = {type(m).__name__ for m in model.modules()}
        assert {"ColumnParallelQuantLinear", "RowParallelQuantLinear"} <= kinds
        assert out.shape == ref.shape and _rel(out, ref) <= 1e-5, (build.__name__, fmt, world, _rel(out, ref))


def _worker(rank: int, init: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    try:
        pair = dist.new_group([0, 1])  # every rank takes part in creating the subgroup
        for group, world in ((None, WORLD), (pair, 2)):
            if world == 2 and rank >= 2:
                continue
            _layers(group, world, rank)
            _models(group, world, rank)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_tensor_parallel_spawn(tmp_path):
    init = "file://" + os.path.join(str(tmp_path), "rendezvous")
    mp.spawn(_worker, args=(init,), nprocs=WORLD, join=True)
