"""Downloaded VoxCPM voice files that do not fit the model: refused by name (the voice, with the
fix) when the request is planned, before anything is generated (issue 33, 2)."""

from __future__ import annotations

import attrs
import pytest
import torch

from mizuoto import Reference, SynthesisRequest, Voice
from mizuoto.errors import InvalidRequest
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import write_random_model


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return VoxCPMEngine.load(write_random_model(tmp_path_factory.mktemp("v2") / "m", "voxcpm2",
                                                dtype="float32"))


@pytest.fixture(scope="module")
def voice(engine, tmp_path_factory):
    import soundfile as sf

    path = tmp_path_factory.mktemp("audio") / "ref.wav"
    t = torch.arange(int(0.4 * 22050)) / 22050
    sf.write(path, (0.3 * torch.sin(2 * torch.pi * 220 * t)).numpy(), 22050)
    return engine.build_voice(Reference(path, "hello"))


def _with(voice: Voice, **tensors) -> Voice:
    changed = {**voice.tensors, **tensors}
    return attrs.evolve(voice, tensors={k: v for k, v in changed.items() if v is not None})


def _hostile(voice: Voice, engine) -> dict[str, tuple[Voice, str]]:
    ref = voice.tensors["reference_latents"]
    patch, feat = engine.config.patch_size, engine.config.feat_dim
    return {
        "wrong feature size": (_with(voice, reference_latents=torch.zeros(3, patch, feat + 1)),
                               "shape"),
        "1-D latents": (_with(voice, prompt_latents=torch.zeros(ref.numel())), "shape"),
        "0 patches": (_with(voice, reference_latents=torch.zeros(0, patch, feat)), "shape"),
        "no reference_latents": (_with(voice, reference_latents=None), "no reference_latents"),
        "prompt without its text": (attrs.evolve(voice, texts={}), "prompt_text"),
        "integer latents": (_with(voice, reference_latents=ref.to(torch.int32)), "not float"),
        "100,000 patches": (_with(voice, prompt_latents=torch.zeros(100_000, patch, feat)),
                            r"10000\d patches"),
    }


@pytest.mark.parametrize("case", ["wrong feature size", "1-D latents", "0 patches",
                                  "no reference_latents", "prompt without its text",
                                  "integer latents", "100,000 patches"])
def test_a_voice_that_does_not_fit_is_refused_by_name(engine, voice, case, monkeypatch):
    hostile, named = _hostile(voice, engine)[case]
    monkeypatch.setattr(engine.model, "forward", None)  # nothing may be generated
    with pytest.raises(InvalidRequest, match=named) as info:
        engine.synthesize(SynthesisRequest("hello", seed=1, voice=hostile))
    assert info.value.field == "voice" and "save" in info.value.fix


def test_the_voice_as_built_still_speaks(engine, voice):
    result = engine.synthesize(SynthesisRequest("hi", seed=1, voice=voice,
                                                params={"max_len": 2, "inference_timesteps": 2}))
    assert result.audio.samples.numel() > 0
