"""soxr resampling and loading against librosa, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from mizuoto.errors import InvalidAudio
from mizuoto.nn.dsp.soxr_resample import load_like_librosa, mono_like_librosa, resample_soxr

librosa = pytest.importorskip("librosa")

RATE_PAIRS = [
    (24000, 16000),
    (16000, 24000),
    (44100, 16000),
    (16000, 44100),
    (48000, 22050),
    (22050, 24000),
    (8000, 16000),
    (44100, 48000),
]


def _signal(*shape: int, seed: int = 0, dtype=np.float32) -> np.ndarray:
    return (np.random.default_rng(seed).random(shape) * 2 - 1).astype(dtype) * 0.5


@pytest.mark.parametrize(("orig", "new"), RATE_PAIRS)
def test_mono_equals_librosa(orig, new):
    audio = _signal(orig // 8 + 13, seed=orig + new)
    expected = librosa.resample(audio, orig_sr=orig, target_sr=new, res_type="soxr_hq")
    got = resample_soxr(audio, orig, new)
    assert got.dtype == expected.dtype == np.float32
    assert got.shape == expected.shape
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_multichannel_and_float64_equal_librosa(dtype):
    audio = _signal(2, 3, 4001, seed=1, dtype=dtype)
    expected = librosa.resample(audio, orig_sr=44100, target_sr=24000, res_type="soxr_hq")
    got = resample_soxr(audio, 44100, 24000, "soxr_hq")
    assert got.dtype == dtype
    assert np.array_equal(got, expected)
    # time on the first axis, as librosa's axis=0
    frames = np.ascontiguousarray(audio[0].T)
    assert np.array_equal(
        resample_soxr(frames, 16000, 22050, axis=0),
        librosa.resample(frames, orig_sr=16000, target_sr=22050, res_type="soxr_hq", axis=0),
    )


def test_other_qualities_and_tensor_input():
    audio = _signal(5000, seed=2)
    for quality in ("VHQ", "MQ"):
        expected = librosa.resample(audio, orig_sr=22050, target_sr=16000,
                                    res_type=f"soxr_{quality.lower()}")
        assert np.array_equal(resample_soxr(audio, 22050, 16000, quality), expected)
    tensor = resample_soxr(torch.from_numpy(audio), 22050, 16000)
    assert isinstance(tensor, torch.Tensor)
    assert np.array_equal(tensor.numpy(), resample_soxr(audio, 22050, 16000))


def test_same_rate_and_bad_input():
    audio = _signal(100)
    assert resample_soxr(audio, 16000, 16000) is audio
    with pytest.raises(TypeError, match="floating point"):
        resample_soxr(np.zeros(100, dtype=np.int16), 16000, 24000)
    bad = audio.copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        resample_soxr(bad, 16000, 24000)


@pytest.mark.parametrize(
    ("rate", "channels", "subtype", "target"),
    [
        (48000, 2, "PCM_16", 16000),
        (44100, 1, "PCM_24", 16000),
        (22050, 2, "FLOAT", 24000),
        (16000, 1, "PCM_16", 16000),
        (8000, 3, "PCM_16", 22050),
        (24000, 2, "PCM_16", None),
    ],
)
def test_load_equals_librosa(tmp_path, rate, channels, subtype, target):
    path = tmp_path / f"a{rate}.wav"
    sf.write(path, _signal(rate // 4, channels, seed=rate + channels), rate, subtype=subtype)
    expected, expected_sr = librosa.load(path, sr=target)
    got, got_sr = load_like_librosa(path, sr=target)
    assert got_sr == expected_sr
    assert got.dtype == expected.dtype == np.float32
    assert np.array_equal(got, expected)


def test_load_keeps_channels_when_not_mono(tmp_path):
    path = tmp_path / "stereo.flac"
    sf.write(path, _signal(4000, 2, seed=3), 44100)
    expected, _ = librosa.load(path, sr=16000, mono=False)
    got, _ = load_like_librosa(path, sr=16000, mono=False)
    assert got.shape == expected.shape == (2, 1452)
    assert np.array_equal(got, expected)


def test_load_missing_and_unreadable(tmp_path):
    with pytest.raises(InvalidAudio, match="prompt.audio: file not found"):
        load_like_librosa(tmp_path / "nope.wav", 16000, field="prompt.audio")
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"not audio at all")
    with pytest.raises(InvalidAudio, match="cannot read"):
        load_like_librosa(junk, 16000)


@pytest.mark.parametrize("shape", [(4000,), (2, 4000), (3, 4000)])
def test_mono_equals_librosa_to_mono(shape):
    audio = _signal(*shape, dtype=np.float64)
    expected = librosa.to_mono(audio)
    got = mono_like_librosa(audio)
    assert got.dtype == expected.dtype and np.array_equal(got, expected)
    with pytest.raises(ValueError, match="non-finite"):
        mono_like_librosa(np.full(shape, np.nan))
