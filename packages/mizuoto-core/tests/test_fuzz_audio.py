"""Property tests: reading audio files that are random bytes, cut short, with damaged WAV/FLAC
headers, extreme sample rates or NaN/infinite float samples, and writing non-finite audio.
A file is read as finite samples at a supported rate, or refused with InvalidAudio."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import soundfile as sf
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mizuoto import Applied, Audio, SynthesisResult
from mizuoto.errors import InvalidAudio, NonFiniteAudio
from mizuoto.nn.dsp.audio_io import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, read_audio, write_audio
from mizuoto.nn.dsp.soxr_resample import load_like_librosa

FORMATS = [("WAV", "PCM_16"), ("WAV", "PCM_24"), ("WAV", "PCM_U8"), ("WAV", "FLOAT"),
           ("WAV", "DOUBLE"), ("FLAC", "PCM_16"), ("FLAC", "PCM_24")]
SPECIAL = [float("nan"), float("inf"), float("-inf"), 1e30, -1e30, 0.0]


def _encode(samples: np.ndarray, rate: int, file_format: str, subtype: str) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format=file_format, subtype=subtype)
    return buffer.getvalue()


@st.composite
def audio_files(draw) -> bytes:
    """Valid files, then damaged: cut short, bytes overwritten, the WAV rate or sizes rewritten,
    special float values in float WAVs; or random bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200))
    file_format, subtype = draw(st.sampled_from(FORMATS))
    channels = draw(st.integers(1, 3))
    frames = draw(st.integers(1, 400))
    rate = draw(st.sampled_from([8000, 16000, 22050, 44100]))
    samples = np.asarray(draw(st.lists(st.floats(-1, 1, width=32), min_size=frames * channels,
                                       max_size=frames * channels)), dtype=np.float32)
    samples = samples.reshape(frames, channels)
    if subtype in ("FLOAT", "DOUBLE") and draw(st.booleans()):
        index = draw(st.integers(0, samples.size - 1))
        samples.flat[index] = draw(st.sampled_from(SPECIAL))
    data = bytearray(_encode(samples, rate, file_format, subtype))
    damage = draw(st.sampled_from(["none", "truncate", "overwrite", "rate", "sizes"]))
    if damage == "truncate":
        del data[draw(st.integers(0, len(data) - 1)):]
    elif damage == "overwrite":
        for _ in range(draw(st.integers(1, 6))):
            data[draw(st.integers(0, min(len(data), 64) - 1))] = draw(st.integers(0, 255))
    elif damage == "rate" and file_format == "WAV":
        # fmt chunk: sample rate at byte 24, byte rate at 28
        data[24:28] = struct.pack("<I", draw(st.sampled_from(
            [0, 1, 999, 1000, 768000, 768001, 2**31 - 1, 2**32 - 1])))
    elif damage == "sizes" and file_format == "WAV":
        data[4:8] = struct.pack("<I", draw(st.integers(0, 2**32 - 1)))
        data[40:44] = struct.pack("<I", draw(st.integers(0, 2**32 - 1)))
    return bytes(data)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=audio_files(), suffix=st.sampled_from([".wav", ".flac", ".mp3", ".ogg", ""]))
def test_read_audio_gives_finite_samples_or_invalid_audio(tmp_path, content, suffix):
    path = tmp_path / f"input{suffix}"
    path.write_bytes(content)
    try:
        samples, rate = read_audio(path, field="reference.audio")
    except InvalidAudio as exc:
        assert exc.field == "reference.audio"
    else:
        assert samples.ndim == 2 and samples.shape[1] > 0 and samples.dtype == torch.float32
        assert bool(torch.isfinite(samples).all())
        assert MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE
    try:
        mono, rate = load_like_librosa(path, 16000, field="reference.audio")
    except InvalidAudio as exc:
        assert exc.field == "reference.audio"
    else:
        assert mono.ndim == 1 and np.isfinite(mono).all() and rate == 16000


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_float_wav_with_non_finite_samples_is_refused(tmp_path, value):
    path = tmp_path / "special.wav"
    samples = np.full(100, 0.1, dtype=np.float32)
    samples[50] = value
    sf.write(path, samples, 16000, subtype="FLOAT")
    with pytest.raises(InvalidAudio, match="NaN or infinite"):
        read_audio(path, field="reference.audio")
    with pytest.raises(InvalidAudio, match="NaN or infinite"):
        load_like_librosa(path, 16000, field="reference.audio")


@pytest.mark.parametrize("rate", [1, 999, 768001, 2**31 - 1])
def test_extreme_sample_rates_are_refused(tmp_path, rate):
    path = tmp_path / "rate.wav"
    sf.write(path, np.full(64, 0.1, dtype=np.float32), rate, subtype="PCM_16")
    with pytest.raises(InvalidAudio, match="sample rate"):
        read_audio(path, field="reference.audio")


@given(samples=st.lists(st.floats(width=32), min_size=1, max_size=64),
       suffix=st.sampled_from([".wav", ".flac"]))
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_non_finite_audio_is_never_written(tmp_path, samples, suffix):
    path = tmp_path / f"out{suffix}"
    path.unlink(missing_ok=True)
    values = torch.tensor(samples, dtype=torch.float32)
    finite = bool(torch.isfinite(values).all())
    try:
        write_audio(path, values, 24000)
    except NonFiniteAudio as exc:
        assert not finite and "written to" in exc.stage
        assert not path.exists()
    else:
        assert finite and path.is_file()


def test_results_and_chunks_refuse_non_finite_audio():
    from mizuoto import AudioChunk

    applied = Applied("fake", "m", 0, False, "float32", "cpu")
    with pytest.raises(NonFiniteAudio, match="fake output"):
        SynthesisResult(Audio([0.0, float("nan")], 8000), applied)
    with pytest.raises(NonFiniteAudio, match="stream chunk 3"):
        AudioChunk(Audio([float("inf")], 8000), 3)
    assert SynthesisResult(Audio([0.0, 0.5], 8000), applied).audio.num_samples == 2
