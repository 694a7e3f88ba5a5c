"""Sinc resampling against torchaudio, bit for bit."""

from __future__ import annotations

import pytest
import torch

from mizuoto.nn.dsp.resample import SincResampler, resample, sinc_resample_kernel

torchaudio = pytest.importorskip("torchaudio")

RATE_PAIRS = [
    (24000, 16000),
    (16000, 24000),
    (44100, 24000),
    (24000, 44100),
    (48000, 16000),
    (22050, 24000),
    (8000, 22050),
    (44100, 48000),
]


def _signal(*shape: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=generator, dtype=torch.float64) * 2 - 1).to(dtype)


@pytest.mark.parametrize(("orig", "new"), RATE_PAIRS)
def test_functional_equals_torchaudio(orig, new):
    audio = _signal(2, orig // 10 + 17, seed=orig + new)
    expected = torchaudio.functional.resample(audio, orig, new)
    got = resample(audio, orig, new)
    assert got.shape == expected.shape
    assert torch.equal(got, expected)


@pytest.mark.parametrize(("orig", "new"), RATE_PAIRS)
def test_module_equals_torchaudio(orig, new):
    audio = _signal(orig // 10 + 3, seed=orig - new)
    theirs = torchaudio.transforms.Resample(orig, new)
    ours = SincResampler(orig, new)
    assert torch.equal(ours.kernel, theirs.kernel)
    assert torch.equal(ours(audio), theirs(audio))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(resampling_method="sinc_interp_kaiser"),
        dict(resampling_method="sinc_interp_kaiser", beta=8.555, lowpass_filter_width=16,
             rolloff=0.9475937167399596),
        dict(lowpass_filter_width=3, rolloff=0.8),
    ],
)
@pytest.mark.parametrize(("orig", "new"), [(22050, 16000), (16000, 48000)])
def test_methods_and_parameters_equal_torchaudio(kwargs, orig, new):
    audio = _signal(3, 2345, seed=11)
    assert torch.equal(resample(audio, orig, new, **kwargs),
                       torchaudio.functional.resample(audio, orig, new, **kwargs))
    assert torch.equal(SincResampler(orig, new, **kwargs)(audio),
                       torchaudio.transforms.Resample(orig, new, **kwargs)(audio))


def test_float64_and_batched_shapes_equal_torchaudio():
    audio = _signal(2, 3, 1500, seed=4, dtype=torch.float64)
    assert torch.equal(resample(audio, 16000, 24000),
                       torchaudio.functional.resample(audio, 16000, 24000))
    ours = SincResampler(16000, 24000, dtype=torch.float64)
    theirs = torchaudio.transforms.Resample(16000, 24000, dtype=torch.float64)
    assert ours(audio).shape == (2, 3, 2250)
    assert torch.equal(ours(audio), theirs(audio))


def test_module_kernel_is_built_in_float64_unlike_functional():
    # The reason SincResampler and resample() must stay separate paths.
    audio = _signal(4000, seed=9)
    assert not torch.equal(SincResampler(24000, 16000)(audio), resample(audio, 24000, 16000))
    kernel, width = sinc_resample_kernel(24000, 16000)
    assert kernel.dtype == torch.float32
    assert kernel.shape == (2, 1, 2 * width + 3)


def test_same_rate_is_identity_and_bad_input_raises():
    audio = _signal(100)
    assert resample(audio, 16000, 16000) is audio
    assert SincResampler(16000, 16000)(audio) is audio
    with pytest.raises(ValueError, match="integer"):
        resample(audio, 16000.5, 24000)
    with pytest.raises(ValueError, match="resampling_method"):
        resample(audio, 16000, 24000, resampling_method="linear")
    with pytest.raises(TypeError, match="floating-point"):
        resample(torch.zeros(100, dtype=torch.int16), 16000, 24000)
