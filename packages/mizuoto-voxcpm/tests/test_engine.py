"""The engine on tiny random models: loading errors, capabilities, params, retry accounting,
voices, the context limit and long-text splitting (no upstream needed)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import mizuoto
from mizuoto import Capability, Options, Reference, SynthesisRequest
from mizuoto.errors import (
    CheckpointMismatch,
    InvalidOption,
    InvalidRequest,
    ModelFilesMissing,
    UnsupportedCapability,
    VoiceMismatch,
)
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import write_random_model
from mizuoto_voxcpm.generation import Sampling, build_sequence, generate, patch_cap
from mizuoto_voxcpm.long_text import pack_chunks, split_sentences

FAST = {"max_len": 3, "inference_timesteps": 2}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        "v1": write_random_model(root / "v1", "voxcpm-0.5b"),
        "v2": write_random_model(root / "v2", "voxcpm2", dtype="float32"),
        "v2b": write_random_model(root / "v2b", "voxcpm2", seed=9, dtype="float32"),
    }


@pytest.fixture(scope="module")
def engines(dirs):
    return {name: VoxCPMEngine.load(path) for name, path in dirs.items()}


@pytest.fixture(scope="module")
def wav(tmp_path_factory):
    import soundfile as sf

    path = tmp_path_factory.mktemp("audio") / "ref.wav"
    t = torch.arange(int(0.4 * 22050)) / 22050
    sf.write(path, (0.3 * torch.sin(2 * torch.pi * 220 * t)).numpy(), 22050)
    return path


def test_info_and_capabilities(engines):
    v1, v2 = engines["v1"].info, engines["v2"].info
    assert v1.engine == v2.engine == "voxcpm"
    assert v1.variant == "voxcpm" and v2.variant == "voxcpm2"
    assert Capability.DESIGN in v2.capabilities and Capability.DESIGN not in v1.capabilities
    for capability in (Capability.ZERO_SHOT, Capability.CLONE, Capability.STREAM,
                       Capability.VOICE_CACHE, Capability.LONG_TEXT, Capability.CONTINUATION):
        assert capability in v1.capabilities
    assert v1.dtype == "bfloat16" and v2.dtype == "float32"  # auto = the config's dtype
    assert v1.license == "Apache-2.0" and v1.fingerprint != v2.fingerprint


def test_dtype_option_overrides_config(dirs):
    engine = VoxCPMEngine.load(dirs["v1"], options=Options.from_mapping(
        {"engines": {"voxcpm": {"dtype": "float32"}}}))
    assert engine.info.dtype == "float32" and engine.model.dtype == torch.float32
    assert next(engine.vae.parameters()).dtype == torch.float32
    # parsing options imports no engine: the bad value is refused when the engine loads
    with pytest.raises(InvalidOption, match="engines.voxcpm.dtype"):
        VoxCPMEngine.load(dirs["v1"], options=Options.from_mapping(
            {"engines": {"voxcpm": {"dtype": "int8"}}}))


def test_applied_record(engines):
    result = engines["v2"].synthesize(SynthesisRequest("hello world", seed=5, params=FAST))
    applied = result.applied
    assert applied.seed == 5 and not applied.seed_drawn
    assert applied.sampler["steps"] == 2 and applied.sampler["guidance"] == 2.0
    assert applied.extra["patches"] == 3 and applied.retries == 0
    assert result.audio.sample_rate == engines["v2"].info.sample_rate
    drawn = engines["v2"].synthesize(SynthesisRequest("hello world", params=FAST)).applied
    assert drawn.seed_drawn


def test_same_seed_same_audio_request_steps_win(engines):
    engine = engines["v2"]
    a = engine.synthesize(SynthesisRequest("hello", seed=3, steps=3, params=FAST))
    b = engine.synthesize(SynthesisRequest("hello", seed=3, params={**FAST,
                                                                   "inference_timesteps": 3}))
    c = engine.synthesize(SynthesisRequest("hello", seed=4, steps=3, params=FAST))
    assert torch.equal(a.audio.samples, b.audio.samples)
    assert not torch.equal(a.audio.samples, c.audio.samples)


def test_params_are_validated(engines):
    engine = engines["v2"]
    with pytest.raises(InvalidRequest, match="params.temperature"):
        engine.synthesize(SynthesisRequest("hi", params={"temperature": 0.5}))
    with pytest.raises(InvalidRequest, match="retry_badcase_max_times"):
        engine.synthesize(SynthesisRequest("hi", params={"retry_badcase_max_times": 0}))
    with pytest.raises(InvalidRequest, match="normalize"):
        engine.synthesize(SynthesisRequest("hi", params={"normalize": "yes"}))


def test_first_generation_limits(engines, wav):
    engine = engines["v1"]
    with pytest.raises(UnsupportedCapability):
        engine.synthesize(SynthesisRequest("hi", instruction="calm", params=FAST))
    with pytest.raises(InvalidRequest, match="reference.text"):
        engine.synthesize(SynthesisRequest("hi", reference=Reference(wav), params=FAST))


def test_retry_accounting(engines):
    engine = engines["v2"]
    params = {**FAST, "retry_badcase_ratio_threshold": 0.1}  # every attempt is a badcase
    result = engine.synthesize(SynthesisRequest("hello", seed=20, params=params))
    assert result.applied.retries == 2  # three attempts, the last kept
    last = engine.synthesize(SynthesisRequest("hello", seed=22, params={
        **params, "retry_badcase": False}))
    assert torch.equal(result.audio.samples, last.audio.samples)  # attempt k uses seed + k
    once = engine.synthesize(SynthesisRequest("hello", seed=20, params={
        **params, "retry_badcase_max_times": 1}))
    assert once.applied.retries == 0
    # streaming never retries (upstream turns retry off when streaming)
    chunks = list(engine.stream(SynthesisRequest("hello", seed=20, params=params)))
    assert chunks[-1].applied.retries == 0 and len(chunks) == 3


def test_voice_roundtrip_and_mismatch(engines, wav, tmp_path):
    voice = engines["v2"].build_voice(Reference(wav, "hello"))
    assert set(voice.tensors) == {"prompt_latents", "reference_latents"}
    voice = mizuoto.Voice.load(voice.save(tmp_path / "v.safetensors"))
    direct = engines["v2"].synthesize(SynthesisRequest("hi", seed=1, reference=Reference(
        wav, "hello"), params=FAST))
    cached = engines["v2"].synthesize(SynthesisRequest("hi", seed=1, voice=voice, params=FAST))
    assert torch.equal(direct.audio.samples, cached.audio.samples)
    with pytest.raises(VoiceMismatch):
        engines["v2b"].synthesize(SynthesisRequest("hi", voice=voice, params=FAST))
    with pytest.raises(VoiceMismatch):
        engines["v1"].synthesize(SynthesisRequest("hi", voice=voice, params=FAST))


def test_strict_loading_names_keys(dirs, tmp_path):
    source = dirs["v2"]
    broken = tmp_path / "broken"
    shutil.copytree(source, broken)
    state = load_file(broken / "model.safetensors")
    state.pop("stop_head.weight")
    state["base_lm.layers.9.mlp.up_proj.weight"] = torch.zeros(2, 2)
    state["stop_proj.bias"] = torch.zeros(3)
    save_file(state, broken / "model.safetensors")
    with pytest.raises(CheckpointMismatch) as error:
        VoxCPMEngine.load(broken)
    message = str(error.value)
    assert "stop_head.weight" in message and "stop_proj.bias" in message
    # upstream loads with strict=False: an extra tensor is not an error (a warning names it)
    assert "base_lm.layers.9.mlp.up_proj.weight" not in message
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelFilesMissing, match="model.safetensors or pytorch_model.bin"):
        VoxCPMEngine.load(broken)


def test_extra_tensors_load_with_a_warning(dirs, tmp_path, caplog):
    # a released checkpoint may carry tensors the model does not use; upstream ignores them
    broken = tmp_path / "extra"
    shutil.copytree(dirs["v2"], broken)
    state = load_file(broken / "model.safetensors")
    state["discriminator.weight"] = torch.zeros(2, 2)
    save_file(state, broken / "model.safetensors")
    with caplog.at_level("WARNING"):
        engine = VoxCPMEngine.load(broken)
    assert "discriminator.weight" in caplog.text
    assert engine.synthesize(SynthesisRequest("hi", seed=0, params=FAST)).audio.num_samples > 0


def test_pytorch_model_bin_loads(tmp_path):
    path = write_random_model(tmp_path / "bin", "voxcpm-0.5b", weights_format="bin")
    assert (path / "pytorch_model.bin").exists()
    engine = VoxCPMEngine.load(path)
    assert engine.synthesize(SynthesisRequest("hi", seed=0, params=FAST)).audio.num_samples > 0


def test_recognizes(dirs, tmp_path):
    assert VoxCPMEngine.recognizes(dirs["v1"])
    (tmp_path / "config.json").write_text(json.dumps({"model": "x"}))
    assert not VoxCPMEngine.recognizes(tmp_path)


def test_cache_full_raises(engines):
    engine = engines["v2"]
    ids = engine.tokenizer.encode("hello world")
    config = engine.config
    sequence = build_sequence(ids, None, patch_size=config.patch_size, feat_dim=config.feat_dim)
    room = config.max_length - sequence.tokens.size(1)
    with pytest.raises(InvalidRequest, match="max_len.*full"):
        generate(engine.model, sequence, Sampling(1, 2.0, 2, room + 2), seed=0,
                 target_tokens=len(ids), retry_badcase=False, retry_max_times=1,
                 retry_ratio=6.0)
    # exactly as many patches as fit: the last one still checks the cache, like upstream
    result = generate(engine.model, sequence, Sampling(1, 2.0, 2, room), seed=0,
                      target_tokens=len(ids), retry_badcase=False, retry_max_times=1,
                      retry_ratio=6.0)
    assert result.patches.size(1) == room
    too_long = build_sequence(ids * (config.max_length // len(ids) + 1), None, patch_size=config.patch_size,
                              feat_dim=config.feat_dim)
    with pytest.raises(InvalidRequest, match="text"):
        generate(engine.model, too_long, Sampling(1, 2.0, 2, 1), seed=0, target_tokens=1,
                 retry_badcase=False, retry_max_times=1, retry_ratio=6.0)


def test_patch_cap():
    assert patch_cap(5, 6.0, 4096) == 40
    assert patch_cap(5, 6.0, 12) == 12
    assert patch_cap(3, 0.5, 100) == 11


def test_long_text_is_split(engines):
    engine = engines["v2"]
    text = "Hello world. This is a test! And one more sentence? 你好。世界！"
    assert split_sentences(text) == ["Hello world.", " This is a test!",
                                     " And one more sentence?", " 你好。", "世界！"]
    chunks = pack_chunks(text, lambda s: len(engine.tokenizer.encode(s)), 8)
    assert len(chunks) > 1 and all(chunk == chunk.strip() for chunk in chunks)
    result = engine.synthesize(SynthesisRequest(text, seed=0, params={
        **FAST, "split_text": True, "chunk_tokens": 8}))
    assert result.applied.chunks == len(chunks)
    assert result.applied.extra["patches"] == 3 * len(chunks)


def test_sampler_defaults_are_what_a_request_without_steps_gets(engines, dirs):
    engine = engines["v2"]
    assert engine.sampler_defaults() == {"steps": 10, "guidance": 2.0}
    applied = engine.synthesize(SynthesisRequest("hello", seed=1, params={"max_len": 2})).applied
    assert {k: applied.sampler[k] for k in ("steps", "guidance")} == engine.sampler_defaults()
    # a model directory's own defaults are the sampler's
    from mizuoto.contracts.model_defaults import write_model_defaults

    write_model_defaults(dirs["v2"], {"inference_timesteps": 3}, "a test")
    try:
        assert VoxCPMEngine.load(dirs["v2"]).sampler_defaults() == {"steps": 3, "guidance": 2.0}
    finally:
        (dirs["v2"] / "mizuoto-defaults.json").unlink()
