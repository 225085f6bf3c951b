"""The one skip-pattern dialect: the same pattern selects the same layers in quantize_model
(module names) and in checkpoint conversion (tensor names)."""
import pytest
from torch import nn

from microscale._names import skip_matches
from microscale.io import should_quantize
from microscale.formats import get_format
from microscale.nn import QuantLinear, quantize_model


@pytest.mark.parametrize("name, pattern, hit", [
    ("lm_head", "lm_head", True), ("model.lm_head", "lm_head", True), ("lm_head.weight", "lm_head", True),
    ("layers.0.self_attn.q_proj", "self_attn", True), ("layers.0.self_attn.q_proj", "attn", False),
    ("layers.0.self_attn.q_proj", "*attn*", True), ("bert.pooler.dense", "pooler*", True),
    ("pooler.dense", "pooler*", True), ("encoder.dense", "pooler*", False), ("a.b", "a.b", True),
    ("xa.b", "a.b", False),
])
def test_dialect(name, pattern, hit):
    assert (skip_matches(name, [pattern]) == pattern) is hit


@pytest.mark.parametrize("pattern", ["attn", "self_attn", "*q_proj*", "q_proj", "layers.1"])
def test_model_and_checkpoint_agree(pattern):
    """A module is skipped by quantize_model iff its weight tensor is skipped by conversion."""
    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj = nn.Linear(32, 32), nn.Linear(32, 32)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = Attn()

    model = nn.Module()
    model.layers = nn.ModuleList([Layer(), Layer()])
    fmt = get_format("mxfp4")
    skipped_tensor = {n.rsplit(".", 1)[0] for n, p in model.state_dict().items()
                      if n.endswith("weight") and not should_quantize(n, tuple(p.shape), p.dtype, fmt, [pattern])}
    q = quantize_model(model, fmt, skip=[pattern], inplace=False)
    skipped_module = {n for n, m in q.named_modules() if type(m) is nn.Linear}
    assert skipped_module == skipped_tensor
    assert any(type(m) is QuantLinear for m in q.modules()) or skipped_module
