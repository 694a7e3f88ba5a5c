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


def _snr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    noise = (reference - other).pow(2).sum().clamp_min(1e-30)
    return float(10 * torch.log10(reference.pow(2).sum() / noise))


def test_int8_quantizes_the_attention_and_feed_forward_layers(model_dir, engine):
    options = mizuoto.Options.from_mapping({**CPU, "engines.f5tts.fast": "int8"})
    fast_engine = F5Engine.load(model_dir, options=options)
    transformer = fast_engine.model.transformer
    quantized = [m for m in transformer.modules()
                 if type(m).__module__.startswith("torch.ao.nn.quantized.dynamic")]
    # every block's q, k, v, out and two feed-forward layers; the embeddings, adaLN
    # modulation and output projection stay float32
    blocks = len(transformer.transformer_blocks)
    assert len(quantized) == 6 * blocks
    assert isinstance(transformer.proj_out, nn.Linear)
    assert all(isinstance(block.attn_norm.linear, nn.Linear)
               for block in transformer.transformer_blocks)
    result = _say(fast_engine)
    exact = _say(engine)
    assert result.applied.compute["fast"] == "int8"
    assert result.applied.compute["fast_int8_linears"] == 6 * blocks
    assert result.audio.samples.dtype == torch.float32
    assert result.audio.samples.shape == exact.audio.samples.shape
    assert torch.isfinite(result.audio.samples).all()
    assert not torch.equal(result.audio.samples, exact.audio.samples)
    # close to the exact path, not noise: int8 weights move a random tiny model by little
    assert _snr_db(exact.audio.samples, result.audio.samples) > 15


@pytest.mark.parametrize(("native", "expected"), [(True, "autocast"), (False, "int8")])
def test_auto_picks_autocast_where_bfloat16_is_native_else_int8(model_dir, monkeypatch,
                                                               native, expected):
    monkeypatch.setattr(fast, "cpu_native_dtype", lambda dtype: native)
    options = mizuoto.Options.from_mapping({**CPU, "engines.f5tts.fast": "auto"})
    result = _say(F5Engine.load(model_dir, options=options))
    assert result.applied.compute["fast"] == expected


def test_int8_outside_float32_is_refused_before_the_checkpoint_is_read(model_dir,
                                                                       monkeypatch):
    from mizuoto_f5tts import checkpoint

    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was read before the option was checked")

    monkeypatch.setattr(checkpoint, "load_f5_model", never)
    options = mizuoto.Options.from_mapping({**CPU, "compute.dtype": "bfloat16",
                                            "engines.f5tts.fast": "int8"})
    with pytest.raises(InvalidOption, match="engines.f5tts.fast") as error:
        F5Engine.load(model_dir, options=options)
    assert "compute.dtype=float32" in str(error.value)


def test_a_fast_profile_samples_its_documented_step_count_unless_asked(model_dir, engine):
    """A fast profile's requests that leave ``steps`` unset take 12 (upstream's EPSS grid for
    12), said in ``applied.sampler`` and ``sampler_defaults``; set steps are kept; the exact
    path keeps upstream's 32."""
    from mizuoto_f5tts.engine import DEFAULT_STEPS, FAST_PROFILE_STEPS

    options = mizuoto.Options.from_mapping({**CPU, "engines.f5tts.fast": "int8"})
    fast_engine = F5Engine.load(model_dir, options=options)
    assert fast_engine.sampler_defaults()["steps"] == FAST_PROFILE_STEPS == 12
    assert engine.sampler_defaults()["steps"] == DEFAULT_STEPS == 32
    unset = fast_engine.synthesize(mizuoto.SynthesisRequest("Hi.", seed=3))
    assert unset.applied.sampler["steps"] == 12
    assert _say(fast_engine).applied.sampler["steps"] == 2  # _say asks for 2


@pytest.mark.parametrize("profile", ["int8", "auto"])
def test_int8_where_torch_has_no_int8_kernels_is_refused_before_the_checkpoint_is_read(
        model_dir, monkeypatch, profile):
    from mizuoto.runtime import dynamic_int8
    from mizuoto_f5tts import checkpoint

    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was read before the option was checked")

    monkeypatch.setattr(checkpoint, "load_f5_model", never)
    monkeypatch.setattr(fast, "cpu_native_dtype", lambda dtype: False)  # auto picks int8
    monkeypatch.setattr(dynamic_int8, "dynamic_int8_unavailable",
                        lambda: "this torch has no int8 kernel for this CPU")
    options = mizuoto.Options.from_mapping({**CPU, "engines.f5tts.fast": profile})
    with pytest.raises(InvalidOption, match="engines.f5tts.fast") as error:
        F5Engine.load(model_dir, options=options)
    assert "no int8 kernel" in str(error.value) and "engines.f5tts.fast=off" in str(error.value)
