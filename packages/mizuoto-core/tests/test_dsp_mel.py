"""Mel features against torchaudio, bit for bit."""

from __future__ import annotations

import pytest
import torch

from mizuoto.nn.dsp.mel import (
    LogMelSpectrogram,
    MelSpectrogram,
    hz_to_mel,
    log_mel_spectrogram,
    melscale_fbanks,
)

torchaudio = pytest.importorskip("torchaudio")

VOCOS = dict(sample_rate=24000, n_fft=1024, win_length=1024, hop_length=256, n_mels=100)


def _signal(*shape: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=generator, dtype=torch.float64) * 2 - 1).to(dtype) * 0.5


@pytest.mark.parametrize(
    ("n_freqs", "f_min", "f_max", "n_mels", "sample_rate", "norm", "mel_scale"),
    [
        (513, 0.0, 12000.0, 100, 24000, None, "htk"),
        (513, 0.0, 8000.0, 80, 16000, None, "htk"),
        (1025, 20.0, 11025.0, 128, 22050, "slaney", "slaney"),
        (201, 50.0, 7600.0, 64, 16000, "slaney", "htk"),
        (513, 0.0, 12000.0, 100, 24000, None, "slaney"),
    ],
)
def test_filterbank_equals_torchaudio(n_freqs, f_min, f_max, n_mels, sample_rate, norm,
                                      mel_scale):
    ours = melscale_fbanks(n_freqs, f_min, f_max, n_mels, sample_rate, norm, mel_scale)
    theirs = torchaudio.functional.melscale_fbanks(n_freqs, f_min, f_max, n_mels, sample_rate,
                                                   norm, mel_scale)
    assert ours.dtype == torch.float32
    assert torch.equal(ours, theirs)


def test_hz_to_mel_slaney_switches_to_log_above_1khz():
    assert hz_to_mel(500.0, "slaney") == pytest.approx(7.5)
    assert hz_to_mel(1000.0, "slaney") == pytest.approx(15.0)
    assert hz_to_mel(6400.0, "slaney") == pytest.approx(42.0)
    with pytest.raises(ValueError, match="mel_scale"):
        hz_to_mel(1.0, "mel")


@pytest.mark.parametrize("shape", [(24000,), (1, 24000), (3, 6123), (2, 2, 5000)])
def test_vocos_mel_equals_torchaudio(shape):
    audio = _signal(*shape, seed=sum(shape))
    ours = MelSpectrogram(**VOCOS, power=1, center=True, pad_mode="reflect", norm=None,
                          mel_scale="htk")
    theirs = torchaudio.transforms.MelSpectrogram(**VOCOS, power=1, center=True,
                                                  pad_mode="reflect", norm=None,
                                                  mel_scale="htk")
    expected = theirs(audio)
    got = ours(audio)
    assert got.shape == expected.shape == (*shape[:-1], 100, shape[-1] // 256 + 1)
    assert torch.equal(got, expected)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(sample_rate=16000, n_fft=400, power=2.0),
        dict(sample_rate=22050, n_fft=1024, hop_length=256, win_length=800, n_mels=80,
             f_min=30.0, f_max=8000.0, norm="slaney", mel_scale="slaney", power=1.0),
        dict(sample_rate=16000, n_fft=512, pad=7, normalized=True, center=False, power=2.0),
        dict(sample_rate=16000, n_fft=512, normalized="frame_length", pad_mode="constant",
             power=0.5),
    ],
)
def test_other_settings_equal_torchaudio(kwargs):
    audio = _signal(2, 9000, seed=3)
    assert torch.equal(MelSpectrogram(**kwargs)(audio),
                       torchaudio.transforms.MelSpectrogram(**kwargs)(audio))


def test_float64_module_equals_torchaudio():
    audio = _signal(2, 7000, seed=5, dtype=torch.float64)
    ours = MelSpectrogram(**VOCOS, power=1).double()
    theirs = torchaudio.transforms.MelSpectrogram(**VOCOS, power=1).double()
    assert torch.equal(ours(audio), theirs(audio))


def test_log_mel_equals_f5_and_vocos_formula():
    audio = _signal(2, 12000, seed=7)
    audio[0, :3000] = 0.0  # silence reaches the clip floor
    mel = torchaudio.transforms.MelSpectrogram(**VOCOS, power=1, center=True, normalized=False,
                                               norm=None)(audio)
    f5 = mel.clamp(min=1e-5).log()
    vocos = torch.log(torch.clip(mel, min=1e-7))
    assert torch.equal(log_mel_spectrogram(audio), f5)
    assert torch.equal(LogMelSpectrogram()(audio), f5)
    assert torch.equal(LogMelSpectrogram(clip_val=1e-7)(audio), vocos)
    assert not torch.equal(f5, vocos)


def test_buffers_are_window_and_filterbank():
    names = dict(MelSpectrogram(**VOCOS).named_buffers())
    assert set(names) == {"window", "filterbank"}
    assert names["window"].shape == (1024,)
    assert names["filterbank"].shape == (513, 100)
