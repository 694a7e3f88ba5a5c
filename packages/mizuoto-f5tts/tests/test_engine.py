"""The F5-TTS engine on a tiny random model: loading, requests, voices, editing, fallbacks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mizuoto
from mizuoto import Capability, EditRequest, SynthesisRequest
from mizuoto.errors import InvalidRequest, ModelFilesMissing, VoiceMismatch
from mizuoto_f5tts import F5Engine
from mizuoto_f5tts.joining import join_chunks

TEXT = "Hello there, this is a test."


def _request(ref, text=TEXT, **fields):
    fields.setdefault("seed", 5)
    fields.setdefault("steps", 2)
    return SynthesisRequest(text, reference=ref, **fields)


def test_load_reports_model(engine):
    info = engine.info
    assert (info.engine, info.variant, info.sample_rate) == ("f5tts", "v1_base", 24000)
    assert (info.dtype, info.device) == ("float32", "cpu")
    assert {Capability.CLONE, Capability.EDIT, Capability.ZERO_SHOT} <= info.capabilities
    assert len(info.fingerprint) == 64 and info.license is None  # local weights: unknown


def test_missing_files_are_named(tmp_path):
    (tmp_path / "vocab.txt").write_text(" \n")
    with pytest.raises(ModelFilesMissing) as raised:
        F5Engine.load(tmp_path)
    message = str(raised.value)
    assert "model_<step>.safetensors" in message and "vocos/pytorch_model.bin" in message


def test_recognizes_its_layout(model_dir, tmp_path):
    assert F5Engine.recognizes(model_dir) and not F5Engine.recognizes(tmp_path)


def test_seeded_requests_repeat_and_report(engine, ref):
    first, second = engine.synthesize(_request(ref)), engine.synthesize(_request(ref))
    assert torch.equal(first.audio.samples, second.audio.samples)
    applied = first.applied
    assert (applied.seed, applied.seed_drawn, applied.chunks) == (5, False, 1)
    assert applied.sampler["steps"] == 2 and applied.sampler["guidance"] == 2.0
    assert applied.sampler["method"] == "euler" and applied.sampler["sway"] == -1.0
    drawn = engine.synthesize(_request(ref, seed=None))
    assert drawn.applied.seed_drawn


def test_duration_follows_text_speed_and_fix_duration(engine, ref):
    short = engine.synthesize(_request(ref, params={"fix_duration": 3.0}))
    assert short.audio.num_samples < 3.0 * 24000
    fixed = engine.synthesize(_request(ref, params={"fix_duration": 4.0}))
    # fix_duration counts frames of 256 samples at 24 kHz (93.75 per second)
    assert fixed.audio.num_samples - short.audio.num_samples == (375 - 281) * 256
    slow = engine.synthesize(_request(ref, params={"speed": 0.5}))
    normal = engine.synthesize(_request(ref))
    assert slow.audio.num_samples > normal.audio.num_samples


def test_bad_params_are_named(engine, ref):
    for params, field in (({"speed": 0}, "params.speed"), ({"method": "rk4"}, "params.method"),
                          ({"nope": 1}, "params.nope")):
        with pytest.raises(InvalidRequest) as raised:
            engine.synthesize(_request(ref, params=params))
        assert raised.value.field == field


def test_text_beyond_the_position_table_is_refused(engine, ref):
    with pytest.raises(InvalidRequest) as raised:
        engine.synthesize(_request(ref, params={"fix_duration": 100.0}))
    # the fixed duration asked for the frames, not the text (issue 54): it is what is named
    assert raised.value.field == "params.fix_duration" and "8192" in str(raised.value)


def test_dit_without_text_conv_layers_has_no_position_table():
    """Upstream's DiT without conv layers runs past 8192 frames (no sinusoidal table)."""
    from mizuoto.nn.transformer import DiT
    from mizuoto_f5tts.duration import check_positions

    kwargs = dict(dim=16, depth=1, heads=1, dim_head=16, text_num_embeds=4, text_dim=16)
    check_positions(DiT(**kwargs, conv_layers=0), 10, 10, 9000, "text")
    with pytest.raises(InvalidRequest, match="8192"):
        check_positions(DiT(**kwargs, conv_layers=1), 10, 10, 9000, "text")


def test_long_text_is_chunked_and_crossfaded(engine, ref):
    text = " ".join(f"Sentence number {i} is here." for i in range(12))
    result = engine.synthesize(_request(ref, text=text))
    assert result.applied.chunks > 1


def test_a_long_text_streams_chunk_by_chunk_as_it_is_synthesized(engine, ref):
    """Each text chunk's audio comes as soon as it is made (the first before the second
    chunk is sampled: counted in progress reports), and the joined stream is the synthesis."""
    # three chunks of this reference's size; a fixed total keeps each chunk's audio short
    request = _request(ref, text=" ".join(f"Sentence number {i} is here." for i in range(24)),
                       params={"fix_duration": 9.0})
    seen = []
    stream = engine.stream(request, progress=seen.append)
    first = next(stream)
    chunks_begun = [p.done for p in seen if p.stage == "chunk"]
    rest = list(stream)
    result = engine.synthesize(request)
    assert result.applied.chunks >= 3
    assert chunks_begun == [0] and len(rest) == result.applied.chunks - 1
    joined = torch.cat([c.audio.samples for c in [first, *rest]])
    assert torch.equal(joined, result.audio.samples)
    assert rest[-1].is_last and rest[-1].applied == result.applied


def test_the_streamed_crossfade_is_the_joined_one():
    """Chunk by chunk, what is final comes out at once and only the overlap is kept back:
    the pieces join to upstream's crossfade (chunks shorter than it included)."""
    from mizuoto_f5tts.joining import CrossFade

    draw = np.random.default_rng(0)
    waves = [draw.standard_normal(n).astype(np.float32) for n in (30, 5, 0, 12, 40, 3)]
    for fade in (0.0, 8 / 24000, 100 / 24000):
        joiner = CrossFade(fade)
        pieces = [joiner.add(wave) for wave in waves]
        assert all(len(p) <= len(w) + joiner.fade for p, w in zip(pieces, waves, strict=True))
        streamed = np.concatenate([*pieces, joiner.finish()])
        assert np.array_equal(streamed, join_chunks(waves, fade))


def test_crossfade_is_computed_in_float64_like_upstream():
    a, b = np.ones(10, np.float32), np.full(10, 3, np.float32)
    joined = join_chunks([a, b], 4 / 24000)
    assert joined.dtype == np.float64 and len(joined) == 16
    assert np.allclose(joined[6:10], [1, 1 + 2 / 3, 1 + 4 / 3, 3])


def test_voice_speaks_like_its_reference(engine, ref, tmp_path):
    voice = engine.build_voice(ref)
    path = voice.save(tmp_path / "v.safetensors")
    loaded = mizuoto.Voice.load(path)
    by_voice = engine.synthesize(SynthesisRequest(TEXT, voice=loaded, seed=5, steps=2,
                                                  params={"target_rms": 0.2}))
    by_ref = engine.synthesize(_request(ref, params={"target_rms": 0.2}))
    assert torch.equal(by_voice.audio.samples, by_ref.audio.samples)
    foreign = mizuoto.Voice(engine="f5tts", model_fingerprint="0" * 64, sample_rate=16000,
                            tensors=dict(voice.tensors), texts=dict(voice.texts))
    with pytest.raises(VoiceMismatch):
        engine.synthesize(SynthesisRequest(TEXT, voice=foreign, seed=5, steps=2))


def test_default_voice_without_reference(engine):
    result = engine.synthesize(SynthesisRequest("Hi there, friend.", seed=1, steps=2))
    assert "default voice" in result.applied.warnings[0]


def test_tiled_vocos_stays_close_to_untiled(engine, ref):
    params = {"fix_duration": 6.0}  # ~480 generated frames: two tiles
    whole = engine.synthesize(_request(ref, params=params))
    tiled = engine.synthesize(_request(ref, params={**params, "tiled_decode": True}))
    assert tiled.applied.fallbacks == ("vocos_tiled",) and whole.applied.fallbacks == ()
    assert whole.audio.num_samples == tiled.audio.num_samples
    difference = (whole.audio.samples - tiled.audio.samples).abs().max().item()
    assert difference < 1e-3 * whole.audio.samples.abs().max().item()  # measured: ~1e-8


def test_out_of_memory_falls_back_to_tiles(engine, ref, monkeypatch):
    calls = []
    original = engine.vocoder.decode

    def decode(mel):
        calls.append(mel.shape[-1])
        if mel.shape[-1] > 256:
            raise torch.OutOfMemoryError("simulated")
        return original(mel)

    monkeypatch.setattr(engine.vocoder, "decode", decode)
    result = engine.synthesize(_request(ref, params={"fix_duration": 6.0}))
    assert result.applied.fallbacks == ("vocos_tiled",)
    assert max(calls[1:]) <= 256


def test_progress_reports_chunks_and_steps(engine, ref):
    seen = []
    engine.synthesize(_request(ref, params={"method": "midpoint"}), progress=seen.append)
    stages = [(p.stage, p.done, p.total) for p in seen]
    # one report per ODE step (the sampler's on_step), midpoint or not
    assert [s for s in stages if s[0] == "sampling"] == [("sampling", 1, 2), ("sampling", 2, 2)]
    assert ("chunk", 1, 1) in stages


def test_edit_keeps_the_rest_of_the_recording(engine, ref):
    request = EditRequest(ref, "A long reference line.", [(0.3, 0.6)], seed=2, steps=2)
    result = engine.edit(request)
    assert torch.equal(result.audio.samples, engine.edit(request).audio.samples)
    assert abs(result.audio.duration - 2.0) < 0.02
    longer = engine.edit(EditRequest(ref, "A long reference line.", [(0.3, 0.6)], seed=2,
                                     steps=2, params={"edit_durations": [0.8]}))
    assert longer.audio.num_samples > result.audio.num_samples
    with pytest.raises(InvalidRequest, match="segments"):
        engine.edit(EditRequest(ref, "x", [(5.0, 6.0)], seed=2, steps=2))
    # a segment may end past the recording (upstream regenerates it at its length, so the
    # edit grows): past the model's positions, the error names the segment, not the text
    with pytest.raises(InvalidRequest, match="0.3:99 ends past the recording's end") as info:
        engine.edit(EditRequest(ref, "x", [(0.3, 99.0)], seed=2, steps=2))
    assert info.value.field == "segments"


def test_plugin_registers_engine_models_and_fixtures():
    from mizuoto import registry

    registry.clear_cache()
    assert registry.engines()["f5tts"] is F5Engine
    catalog = registry.catalog()
    assert {"f5tts/v1-base", "f5tts/base", "f5tts/e2-base"} <= set(catalog)
    entry = catalog["f5tts/v1-base"]
    assert entry.files["model_1250000.safetensors"].repo == "SWivid/F5-TTS"
    assert entry.non_commercial and entry.license == "CC-BY-NC-4.0"
    assert "vocab.txt" in catalog["f5tts/e2-base"].optional
    fixtures = registry.contract_fixtures()
    assert {"f5tts/tiny-v1-base", "f5tts/tiny-base", "f5tts/tiny-e2-base"} <= set(fixtures)


def test_sampler_defaults_are_what_a_request_without_steps_gets(engine):
    assert engine.sampler_defaults() == {"steps": 32, "guidance": 2.0}
    applied = engine.synthesize(SynthesisRequest("Hi.", seed=1,
                                                 params={"fix_duration": 0.2})).applied
    assert {k: applied.sampler[k] for k in ("steps", "guidance")} == engine.sampler_defaults()
