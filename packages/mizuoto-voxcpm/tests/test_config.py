"""config.json parsing and the constraints upstream only finds at run time."""

from __future__ import annotations

import copy

import pytest
import torch

from mizuoto.errors import ModelFilesMissing
from mizuoto_voxcpm.config import ConfigError, VoxCPMConfig
from mizuoto_voxcpm.fixtures import realsize_config, tiny_config
from mizuoto_voxcpm.model import VoxCPMModel


def _config(generation="voxcpm2", **changes):
    raw = copy.deepcopy(tiny_config(generation, vocab_size=500))
    raw["audio_vae_config"] = {"latent_dim": raw["feat_dim"]}
    raw.update(changes)
    return raw


def test_generations_and_defaults():
    v2 = VoxCPMConfig.from_dict(_config("voxcpm2"))
    assert v2.is_v2 and v2.architecture == "voxcpm2"
    raw = _config("voxcpm-0.5b")
    for key in ("patch_size", "residual_lm_num_layers", "scalar_quantization_latent_dim",
                "max_length"):
        del raw[key]
    del raw["architecture"]  # upstream's default generation
    v1 = VoxCPMConfig.from_dict(raw)
    assert not v1.is_v2
    assert (v1.patch_size, v1.residual_lm_num_layers, v1.scalar_quantization_latent_dim,
            v1.max_length) == (2, 6, 256, 4096)
    raw = _config("voxcpm2")
    for key in ("patch_size", "residual_lm_num_layers", "max_length"):
        del raw[key]
    v2 = VoxCPMConfig.from_dict(raw)
    assert (v2.patch_size, v2.residual_lm_num_layers, v2.max_length) == (4, 8, 8192)


def test_realsize_configs_are_valid():
    for generation in ("voxcpm-0.5b", "voxcpm-1.5", "voxcpm2"):
        raw = realsize_config(generation)
        config = VoxCPMConfig.from_dict(raw)
        assert config.lm.head_dim == 2 * len(config.lm.rope_scaling.long_factor)
        with torch.device("meta"):
            model = VoxCPMModel(config)
        params = sum(p.numel() for p in model.parameters())
        assert params > 4e8, f"{generation}: {params} parameters"


def test_residual_lm_no_rope_only_in_v2():
    raw = _config("voxcpm-1.5", residual_lm_no_rope=True)
    assert not VoxCPMConfig.from_dict(raw).residual_lm().no_rope
    assert VoxCPMConfig.from_dict(_config("voxcpm2", residual_lm_no_rope=True)
                                  ).residual_lm().no_rope


def test_null_kv_channels_is_refused():
    raw = _config()
    raw["encoder_config"]["kv_channels"] = None
    with pytest.raises(ConfigError, match="encoder_config.kv_channels.*null"):
        VoxCPMConfig.from_dict(raw)


def test_head_dim_must_match_rope_factors():
    raw = _config()
    raw["dit_config"]["num_heads"] = 4  # 32 / 4 = 8, but 8 factors need head dim 16
    with pytest.raises(ConfigError, match="dit_config.*head dim 8.*8 rope scaling factors"):
        VoxCPMConfig.from_dict(raw)
    raw = _config()
    raw["dit_config"]["num_heads"] = 4
    raw["dit_config"]["kv_channels"] = 16  # explicit head dim fixes it
    assert VoxCPMConfig.from_dict(raw).local(VoxCPMConfig.from_dict(raw).dit).head_dim == 16


def test_feat_dim_must_equal_vae_latent_dim():
    raw = _config(feat_dim=16)
    with pytest.raises(ConfigError, match="feat_dim.*latent_dim 8"):
        VoxCPMConfig.from_dict(raw)


def test_required_and_typed_fields():
    raw = _config()
    del raw["lm_config"]["scale_emb"]
    with pytest.raises(ConfigError, match="lm_config.scale_emb.*required"):
        VoxCPMConfig.from_dict(raw)
    raw = _config()
    raw["lm_config"]["hidden_size"] = "64"
    with pytest.raises(ConfigError, match="lm_config.hidden_size"):
        VoxCPMConfig.from_dict(raw)
    with pytest.raises(ConfigError, match="architecture"):
        VoxCPMConfig.from_dict(_config(architecture="voxcpm3"))
    with pytest.raises(ConfigError, match="dtype"):
        VoxCPMConfig.from_dict(_config(dtype="int8"))


def test_missing_config_file(tmp_path):
    with pytest.raises(ModelFilesMissing, match="config.json"):
        VoxCPMConfig.from_model_dir(tmp_path)
