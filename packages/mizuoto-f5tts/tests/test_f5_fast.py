"""engines.f5tts.fast: the exact default reports itself off and is untouched; autocast runs
the transformer under autocast where the device has the dtype natively, and is refused where
it would emulate it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mizuoto
from mizuoto.errors import InvalidOption
from mizuoto_f5tts import fast
from mizuoto_f5tts.engine import F5Engine

CPU = {"compute.device": "cpu", "compute.cpu_threads": 1}


def _say(engine):
    return engine.synthesize(mizuoto.SynthesisRequest("Hi there.", seed=3, steps=2))


def test_exact_default_says_off(engine):
    result = _say(engine)
    assert result.applied.compute["fast"] == "off" and "fast_dtype" not in result.applied.compute
    assert "autocast_forward" not in repr(engine.model.transformer.forward)


def test_autocast_runs_where_bfloat16_is_native(model_dir, engine, monkeypatch):
    monkeypatch.setattr(fast, "cpu_native_dtype", lambda dtype: True)
    options = mizuoto.Options.from_mapping({**CPU, "engines.f5tts.fast": "autocast"})
    fast_engine = F5Engine.load(model_dir, options=options)
    seen = []
    # a layer inside the transformer (the transformer's own hooks run outside its forward)
    inner = next(m for m in fast_engine.model.transformer.modules() if isinstance(m, nn.Linear))
    hook = inner.register_forward_hook(
        lambda module, args, out: seen.append(torch.is_autocast_enabled("cpu")))
    result = _say(fast_engine)
    hook.remove()
    assert seen and all(seen)
    assert result.applied.compute["fast"] == "autocast"
    assert result.applied.compute["fast_dtype"] == "bfloat16"
    assert result.audio.samples.dtype == torch.float32
    assert not torch.equal(result.audio.samples, _say(engine).audio.samples)


def test_autocast_is_refused_where_bfloat16_is_emulated(model_dir, monkeypatch):
    monkeypatch.setattr(fast, "cpu_native_dtype", lambda dtype: False)
    options = mizuoto.Options.from_mapping({**CPU, "engines.f5tts.fast": "autocast"})
    with pytest.raises(InvalidOption, match="engines.f5tts.fast"):
        F5Engine.load(model_dir, options=options)


def test_unknown_profile_is_named(model_dir):
    options = mizuoto.Options.from_mapping({**CPU, "engines.f5tts.fast": "turbo"})
    with pytest.raises(InvalidOption, match="engines.f5tts.fast"):
        F5Engine.load(model_dir, options=options)


def test_prepack_off_from_a_shared_settings_file_is_accepted(model_dir, engine):
    """A settings file written for VoxCPM (compute.prepack=off) loads F5, which packs no
    weights: the same audio, and applied.compute says nothing was packed."""
    options = mizuoto.Options.from_mapping({**CPU, "compute.prepack": "off"})
    result = _say(F5Engine.load(model_dir, options=options))
    assert result.applied.compute["prepack"] == {"mode": "off"}
    assert _say(engine).applied.compute["prepack"] == {"mode": "off"}  # auto packs nothing
    assert torch.equal(result.audio.samples, _say(engine).audio.samples)
