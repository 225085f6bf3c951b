import os

import pytest
import torch


def write_checkpoint(root, shards: dict[str, dict[str, torch.Tensor]], config: dict | None = None,
                     index: bool = True) -> str:
    """A HF-style checkpoint directory from {shard file: {name: tensor}}."""
    import json

    from safetensors.torch import save_file

    os.makedirs(root, exist_ok=True)
    wm = {}
    for fname, tensors in shards.items():
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(root, fname), metadata={"format": "pt"})
        wm.update({k: fname for k in tensors})
    if index:
        with open(os.path.join(root, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, f)
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump(config or {"model_type": "toy", "hidden_size": 64}, f)
    with open(os.path.join(root, "tokenizer.json"), "w") as f:
        f.write('{"toy": true}')
    return str(root)


@pytest.fixture
def make_checkpoint():
    return write_checkpoint


@pytest.fixture
def toy_checkpoint(tmp_path):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    shards = {
        "model-00001-of-00002.safetensors": {
            "model.embed_tokens.weight": r(100, 64).bfloat16(),
            "model.layers.0.self_attn.q_proj.weight": r(64, 64).bfloat16(),
            "model.layers.0.mlp.up_proj.weight": r(128, 64).bfloat16(),
            "model.layers.0.input_layernorm.weight": r(64).bfloat16(),
        },
        "model-00002-of-00002.safetensors": {
            "model.layers.0.mlp.down_proj.weight": r(64, 128).bfloat16(),
            "model.layers.0.mlp.down_proj.bias": r(64).bfloat16(),
            "lm_head.weight": r(100, 64).bfloat16(),
            "model.rotary.inv_freq": r(16).float(),
        },
    }
    return write_checkpoint(tmp_path / "src", shards)
