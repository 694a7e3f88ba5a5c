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


def test_write_random_model_carries_no_defaults(tmp_path):
    # parity tests load these directories beside upstream, which has only its own defaults
    assert not (write_random_model(tmp_path / "m", "voxcpm2") / "mizuoto-defaults.json").exists()


def test_the_demo_fixtures_speak_a_sentence_with_short_defaults(tmp_path):
    import mizuoto
    from mizuoto.registry import random_models
    from mizuoto_voxcpm.plugin import DEMO_DEFAULTS

    directory = tmp_path / "tiny-2"
    random_models()["voxcpm/tiny-2"].make(directory)
    saved = json.loads((directory / "mizuoto-defaults.json").read_text())
    assert saved["params"] == DEMO_DEFAULTS and "never fires" in saved["why"]
    tts = mizuoto.load(directory)
    plain = tts.synthesize(mizuoto.SynthesisRequest("Hello from Mizuoto.", seed=3))
    assert dict(plain.applied.model_defaults) == DEMO_DEFAULTS
    assert plain.applied.retries == 0
    assert plain.applied.extra["patches"] == DEMO_DEFAULTS["max_len"]  # it never stops
    assert plain.applied.sampler["max_len"] == DEMO_DEFAULTS["max_len"]
    # the defaults are only params: the same request spelling them out gives the same bits
    spelled = tts.synthesize(mizuoto.SynthesisRequest("Hello from Mizuoto.", seed=3,
                                                      params=DEMO_DEFAULTS))
    assert torch.equal(plain.audio.samples, spelled.audio.samples)
    assert dict(spelled.applied.model_defaults) == {}
    # a request's own param wins; the others still apply
    short = tts.synthesize(mizuoto.SynthesisRequest("Hello from Mizuoto.", seed=3,
                                                    params={"max_len": 4}))
    assert short.applied.extra["patches"] == 4
    assert dict(short.applied.model_defaults) == {"retry_badcase": False}


def test_the_realsize_fixtures_keep_upstreams_defaults(tmp_path, monkeypatch):
    import mizuoto_voxcpm.fixtures
    from mizuoto_voxcpm.plugin import _write

    written = []
    monkeypatch.setattr(mizuoto_voxcpm.fixtures, "write_random_model",
                        lambda directory, generation, size: written.append(size))
    _write(tmp_path, "voxcpm2", size="realsize")
    assert written == ["realsize"] and not (tmp_path / "mizuoto-defaults.json").exists()
