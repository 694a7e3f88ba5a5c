"""Reference preparation: pydub's arithmetic reproduced (parity tests compare whole files)."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile
import torch

from mizuoto import Audio
from mizuoto.errors import InvalidAudio, InvalidRequest
from mizuoto_f5tts import reference
from mizuoto_f5tts.pcm import PcmSegment, leading_silence_ms, ratecv, split_on_silence


def _tone(seconds: float, rate: int = 24000, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def _pcm(samples: np.ndarray, rate: int = 24000) -> PcmSegment:
    return PcmSegment(np.round(samples * 32767).astype(np.int64)[:, None], rate, 2)


def test_ratecv_yields_1198_samples_for_50_ms_of_silence():
    silence = PcmSegment.silent(50)
    assert silence.frames == 551 and silence.rate == 11025
    assert ratecv(silence.samples, 2, 11025, 24000).shape == (1198, 1)


def test_ratecv_interpolates_and_truncates():
    samples = np.array([[0], [1000], [-1000]], dtype=np.int64)
    out = ratecv(samples, 2, 1, 2)  # (3 - 1) * 2 // 1 + 1 = 5 frames
    assert out[:, 0].tolist() == [0, 500, 1000, 0, -1000]


def test_lengths_round_and_slices_pad_like_pydub():
    segment = PcmSegment(np.ones((24013, 1), dtype=np.int64), 24000, 2)
    assert len(segment) == 1001  # 1000.54 ms rounds up
    tail = segment.slice(1000, None)
    assert tail.frames == 24 and tail.samples[-11:].sum() == 0  # 11 zero frames appended


def test_split_on_silence_keeps_the_sounding_parts():
    audio = np.concatenate([_tone(1.0), np.zeros(48000, np.float32), _tone(1.0)])
    parts = split_on_silence(_pcm(audio), 1000, -50, 100, 10)
    assert len(parts) == 2
    assert all(1050 <= len(part) <= 1150 for part in parts)


def test_leading_silence_is_found_in_10_ms_steps():
    audio = np.concatenate([np.zeros(12000, np.float32), _tone(0.5)])
    assert leading_silence_ms(_pcm(audio), -42) == 500


def test_long_reference_is_clipped_to_12_seconds(tmp_path):
    path = tmp_path / "long.wav"
    soundfile.write(path, _tone(20.0), 24000, subtype="PCM_16")
    waveform, rate = reference.prepare_pcm(path)
    assert rate == 24000 and waveform.shape == (1, 12000 * 24 + 1198)
    assert not waveform[0, -1198:].any()


def test_24_bit_samples_widen_with_pydubs_low_byte(tmp_path):
    path = tmp_path / "a.wav"
    soundfile.write(path, np.array([-0.5, 0.5] * 12000, np.float32), 24000, subtype="PCM_24")
    samples = reference._read_pcm(path).samples[:2, 0]
    assert samples.tolist() == [-(2**30) | 0xFF, 2**30]


def test_reference_text_endings():
    assert reference.prepare_reference_text("Hello") == "Hello. "
    assert reference.prepare_reference_text("Hello.") == "Hello. "
    assert reference.prepare_reference_text("你好。") == "你好。"
    assert reference.prompt_text("Hello. ") == "Hello.  "
    assert reference.prompt_text("你好。") == "你好。"
    with pytest.raises(InvalidRequest, match="reference.text"):
        reference.prepare_reference_text("  ")


def test_silent_reference_is_refused(tmp_path):
    path = tmp_path / "silent.wav"
    soundfile.write(path, np.zeros(24000, np.float32), 24000)
    with pytest.raises(InvalidAudio, match="silent"):
        reference.prepare_pcm(path)


def test_audio_object_equals_its_16_bit_file(tmp_path):
    samples = _tone(2.0, 16000)
    path = tmp_path / "ref.wav"
    soundfile.write(path, samples, 16000, subtype="PCM_16")
    from_file = reference.prepare_pcm(path)
    from_audio = reference.prepare_pcm(Audio(samples, 16000))
    assert from_file[1] == from_audio[1] and torch.equal(from_file[0], from_audio[0])


def test_quiet_reference_is_raised_before_resampling(tmp_path):
    path = tmp_path / "quiet.wav"
    soundfile.write(path, _tone(2.0, 16000, amplitude=0.02), 16000)
    prepared = reference.prepare_reference(path, "Quiet.", target_rms=0.1)
    assert prepared.raised and prepared.source_rate == 16000
    assert prepared.audio.shape[-1] == int(np.ceil(prepared.source_samples * 24000 / 16000))
    rms = float(torch.sqrt(torch.mean(prepared.audio**2)))
    assert abs(rms - 0.1) < 0.01
