"""The prefill's local encoder runs only where the prompt holds audio (no oracle needed).

Upstream encodes every prompt position's patch, text positions' zero patches included, and then
multiplies those by the feature mask's 0. A prompt without audio (zero-shot, voice design)
therefore skips the encoder here; its states must be those of encoding everything.
"""

from __future__ import annotations

import pytest
import torch

from mizuoto_voxcpm.config import VoxCPMConfig
from mizuoto_voxcpm.fixtures import write_random_model
from mizuoto_voxcpm.model import load_model

GENERATIONS = ["voxcpm-0.5b", "voxcpm-1.5", "voxcpm2"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefill")
    return {g: write_random_model(root / g, g, dtype="float32", size="wide")
            for g in GENERATIONS}


def _prompt(model, length: int, audio: slice | None, seed: int):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 100, (1, length), generator=generator)
    feat_mask = torch.zeros(1, length, dtype=torch.int32)
    if audio is not None:
        feat_mask[:, audio] = 1
    text_mask = 1 - feat_mask
    feats = torch.zeros(1, length, model.patch_size, model.config.feat_dim)
    feats[feat_mask.bool()] = torch.randn(int(feat_mask.sum()), model.patch_size,
                                          model.config.feat_dim, generator=generator)
    return tokens, text_mask, feats.to(model.dtype), feat_mask


def _states(prefilled):
    yield prefilled.lm_hidden
    yield prefilled.residual_hidden
    for pairs in (prefilled.lm_pairs, prefilled.residual_pairs):
        for key, value in pairs:
            yield key
            yield value


def _encoder_calls(model, monkeypatch) -> list:
    calls = []
    original = model.encode_patches

    def counted(patches):
        calls.append(patches.shape)
        return original(patches)

    monkeypatch.setattr(model, "encode_patches", counted)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_prompt_without_audio_skips_the_encoder_with_the_same_states(
        model_dirs, generation, dtype, monkeypatch):
    directory = model_dirs[generation]
    model = load_model(directory, VoxCPMConfig.from_model_dir(directory), dtype=dtype)
    prompt = _prompt(model, 13, None, seed=3)
    calls = _encoder_calls(model, monkeypatch)
    with torch.inference_mode():
        skipped = model.prefill_states(*prompt)
        assert calls == []
        # upstream's way: every position's (zero) patch through the encoder, then masked
        monkeypatch.setattr(model, "encode_prompt_patches",
                            lambda feats, feat_mask: model.encode_patches(feats))
        encoded = model.prefill_states(*prompt)
    assert len(calls) == 1
    for got, expected in zip(_states(skipped), _states(encoded), strict=True):
        assert torch.equal(got, expected)


def test_a_prompt_with_audio_encodes_every_position(model_dirs, monkeypatch):
    directory = model_dirs["voxcpm2"]
    model = load_model(directory, VoxCPMConfig.from_model_dir(directory), dtype=torch.float32)
    calls = _encoder_calls(model, monkeypatch)
    with torch.inference_mode():
        model.prefill_states(*_prompt(model, 11, slice(4, 9), seed=5))
    assert calls == [torch.Size([1, 11, model.patch_size, model.config.feat_dim])]
