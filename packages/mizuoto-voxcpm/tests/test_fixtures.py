"""Random model directories: upstream's layout, deterministic, seeded per tensor name."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from mizuoto_voxcpm.fixtures import (
    random_state_dict,
    seeded_tensor,
    tiny_config,
    with_dtype,
    write_random_model,
)


def test_tensor_depends_on_seed_and_name_only():
    a = seeded_tensor(1, "base_lm.norm.weight", (4,))
    assert torch.equal(a, seeded_tensor(1, "base_lm.norm.weight", (4,)))
    assert not torch.equal(a, seeded_tensor(2, "base_lm.norm.weight", (4,)))
    assert not torch.equal(a, seeded_tensor(1, "residual_lm.norm.weight", (4,)))


def test_layout_and_determinism(tmp_path):
    first = write_random_model(tmp_path / "a", "voxcpm2", seed=5)
    second = write_random_model(tmp_path / "b", "voxcpm2", seed=5)
    names = sorted(p.name for p in first.iterdir())
    assert names == ["audiovae.safetensors", "config.json", "model.safetensors",
                     "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not any(k.startswith("audio_vae.") for k in a)
    config = json.loads((first / "config.json").read_text())
    assert config["architecture"] == "voxcpm2" and config["dtype"] == "bfloat16"
    assert config["feat_dim"] == config["audio_vae_config"]["latent_dim"]
    copy = with_dtype(first, tmp_path / "fp32", "float32")
    assert json.loads((copy / "config.json").read_text())["dtype"] == "float32"


def test_first_generation_layout(tmp_path):
    directory = write_random_model(tmp_path / "v1", "voxcpm-1.5")
    assert (directory / "audiovae.pth").exists()
    config = json.loads((directory / "config.json").read_text())
    assert config["architecture"] == "voxcpm" and config["patch_size"] == 4
    assert "fusion_concat_proj.weight" not in load_file(directory / "model.safetensors")


def test_stop_modes():
    config = tiny_config("voxcpm2", vocab_size=300)
    config["audio_vae_config"] = {"latent_dim": config["feat_dim"]}
    always = random_state_dict(config, stop="always")["stop_head.weight"]
    never = random_state_dict(config, stop="never")["stop_head.weight"]
    assert torch.equal(always, -never)
    with pytest.raises(ValueError, match="stop"):
        random_state_dict(config, stop="sometimes")
