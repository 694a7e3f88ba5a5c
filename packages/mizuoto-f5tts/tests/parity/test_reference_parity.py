"""Reference preparation against upstream's pydub pipeline (preprocess_ref_audio_text)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from mizuoto_f5tts import reference

pytestmark = pytest.mark.parity

EXAMPLES = Path(str(files("f5_tts").joinpath("infer/examples/basic")))


def _speech(rate: int = 24000) -> np.ndarray:
    data, file_rate = soundfile.read(EXAMPLES / "basic_ref_en.wav", dtype="float32")
    if file_rate != rate:
        positions = np.arange(int(len(data) * rate / file_rate)) * file_rate / rate
        data = np.interp(positions, np.arange(len(data)), data).astype(np.float32)
    return data


def _with_gaps(gap_s: float, repeats: int, rate: int = 24000) -> np.ndarray:
    speech = _speech(rate)
    gap = np.zeros(int(gap_s * rate), np.float32) + 1e-5
    return np.concatenate([np.concatenate([speech, gap]) for _ in range(repeats)])


def _cases(tmp: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    made: dict[str, Path] = {
        "en": EXAMPLES / "basic_ref_en.wav",
        "zh": EXAMPLES / "basic_ref_zh.wav",
        "multi_flac": EXAMPLES.parent / "multi" / "main.flac",  # 44.1 kHz FLAC
    }

    def write(name, data, rate, subtype="PCM_16", fmt="WAV"):
        path = tmp / f"{name}.{fmt.lower()}"
        soundfile.write(path, data, rate, subtype=subtype, format=fmt)
        made[name] = path

    write("long_gaps", _with_gaps(1.3, 4), 24000)  # clipped at a long silence
    write("short_gaps", _with_gaps(0.3, 5), 24000)  # clipped at a short silence
    write("no_silence", (rng.standard_normal(24000 * 15) * 0.2).astype(np.float32), 24000)
    speech44 = _speech(44100)
    write("stereo44", np.stack([speech44, speech44[::-1] * 0.5], axis=1), 44100)
    write("pcm24_48k", _speech(48000) * 0.9, 48000, "PCM_24")
    write("pcm32_16k", _speech(16000), 16000, "PCM_32")
    write("u8_16k", _speech(16000), 16000, "PCM_U8")
    write("rate8k", _speech(8000), 8000)  # below pydub's 11025 Hz silence rate
    write("float22k", _speech(22050) * 0.3, 22050, "FLOAT")
    write("flac", _speech(24000)[:24013], 24000, "PCM_16", "FLAC")
    write("odd_length", np.concatenate([_speech(24000), np.zeros(13, np.float32)]), 24000)
    write("quiet", _speech(24000) * 0.05, 24000)
    return made


@pytest.fixture(scope="module")
def upstream():
    from f5_tts.infer import utils_infer

    return utils_infer


def test_reference_audio_matches_pydub(tmp_path, upstream):
    import torchaudio

    checked = []
    for name, path in _cases(tmp_path).items():
        upstream._ref_audio_cache.clear()
        temp_wav, text = upstream.preprocess_ref_audio_text(str(path), "Some text",
                                                            show_info=lambda *_: None)
        expected, expected_rate = torchaudio.load(temp_wav)
        waveform, rate = reference.prepare_pcm(path)
        assert rate == expected_rate, name
        assert waveform.shape == expected.shape, (name, waveform.shape, expected.shape)
        assert torch.equal(waveform, expected), name
        assert reference.prepare_reference_text("Some text") == text
        checked.append(name)
    assert len(checked) == 15


def test_silent_reference_is_refused_where_upstream_yields_silence(tmp_path, upstream):
    import torchaudio

    path = tmp_path / "faint.wav"
    soundfile.write(path, _speech(24000) * 0.01, 24000, subtype="PCM_16")  # below -50 dBFS
    upstream._ref_audio_cache.clear()
    temp_wav, _ = upstream.preprocess_ref_audio_text(str(path), "x", show_info=lambda *_: None)
    expected, rate = torchaudio.load(temp_wav)
    # upstream keeps only its 50 ms of silence (551 samples at 11025 Hz): its RMS is zero
    assert rate == 11025 and expected.shape == (1, 551) and not expected.any()
    with pytest.raises(reference.InvalidAudio, match="silent"):
        reference.prepare_pcm(path)
