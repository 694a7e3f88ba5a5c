"""Reading, checking and writing audio files."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from mizuoto.errors import InvalidAudio, InvalidRequest
from mizuoto.nn.dsp.audio_io import check_not_silent, read_audio, to_mono, write_audio

torchaudio = pytest.importorskip("torchaudio")


def _frames(samples: int, channels: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random((samples, channels)) * 2 - 1).astype(np.float32)


@pytest.mark.parametrize(
    ("name", "subtype", "rate", "channels"),
    [
        ("a.wav", "PCM_16", 16000, 1),
        ("b.wav", "PCM_16", 44100, 2),
        ("c.wav", "PCM_24", 24000, 1),
        ("d.wav", "FLOAT", 22050, 2),
        ("e.flac", "PCM_16", 48000, 2),
    ],
)
def test_read_equals_torchaudio_load(tmp_path, name, subtype, rate, channels):
    path = tmp_path / name
    sf.write(path, _frames(3000, channels, seed=rate) * 0.9, rate, subtype=subtype)
    samples, sample_rate = read_audio(path)
    expected, expected_rate = torchaudio.load(str(path))
    assert sample_rate == expected_rate == rate
    assert samples.dtype == torch.float32
    assert samples.shape == (channels, 3000)
    assert samples.is_contiguous()
    assert torch.equal(samples, expected)


def test_16bit_pcm_reads_as_int_over_32768(tmp_path):
    ints = np.array([0, 1, -1, 16384, 32767, -32768], dtype=np.int16)
    sf.write(tmp_path / "i.wav", ints, 8000, subtype="PCM_16")
    samples, _ = read_audio(tmp_path / "i.wav")
    assert torch.equal(samples[0], torch.from_numpy(ints.astype(np.float32) / 32768))


def test_to_mono_matches_upstream_mean():
    stereo = torch.from_numpy(_frames(500, 2).T.copy())
    assert torch.equal(to_mono(stereo), torch.mean(stereo, dim=0, keepdim=True))
    mono = stereo[:1]
    assert to_mono(mono) is mono
    with pytest.raises(ValueError, match="channels"):
        to_mono(stereo[0])


def test_missing_unreadable_and_empty_files_name_the_field(tmp_path):
    with pytest.raises(InvalidAudio, match="reference.audio: file not found") as missing:
        read_audio(tmp_path / "none.wav", field="reference.audio")
    assert missing.value.field == "reference.audio"
    (tmp_path / "junk.wav").write_bytes(b"RIFF....garbage")
    with pytest.raises(InvalidAudio, match="reference.audio: cannot read"):
        read_audio(tmp_path / "junk.wav", field="reference.audio")
    sf.write(tmp_path / "empty.wav", np.zeros((0, 1), dtype=np.float32), 16000)
    with pytest.raises(InvalidAudio, match="no samples"):
        read_audio(tmp_path / "empty.wav", field="reference.audio")


def test_check_not_silent():
    check_not_silent(torch.tensor([[0.0, 0.01, -0.2]]), "prompt.audio")
    with pytest.raises(InvalidAudio, match="prompt.audio: is silent"):
        check_not_silent(torch.zeros(1, 100), "prompt.audio")
    with pytest.raises(InvalidAudio, match="is silent"):
        check_not_silent(np.full(100, 3e-5, dtype=np.float32), "prompt.audio")
    with pytest.raises(InvalidAudio, match="no samples"):
        check_not_silent(torch.zeros(1, 0), "prompt.audio")


@pytest.mark.parametrize(("name", "subtype"), [("out.wav", "FLOAT"), ("out.flac", "PCM_24"),
                                               ("out.wav", None)])
def test_write_round_trip_with_metadata(tmp_path, name, subtype):
    samples = torch.from_numpy(_frames(2400, 2, seed=4).T.copy()) * 0.5
    path = write_audio(tmp_path / "sub" / name, samples, 24000, subtype=subtype,
                       metadata={"title": "Mizuoto test", "comment": "seed 4"})
    assert path == tmp_path / "sub" / name
    assert sorted(p.name for p in path.parent.iterdir()) == [name]  # no temp file left
    back, rate = read_audio(path)
    assert rate == 24000
    assert back.shape == samples.shape
    if subtype == "FLOAT":
        assert torch.equal(back, samples)
    else:
        step = 2.0 ** -23 if subtype == "PCM_24" else 2.0 ** -15
        assert (back - samples).abs().max() <= step
    with sf.SoundFile(path) as file:
        assert file.format == ("WAV" if name.endswith("wav") else "FLAC")
        assert file.title == "Mizuoto test"
        assert file.comment == "seed 4"


def test_write_mono_bfloat16_and_errors(tmp_path):
    path = write_audio(tmp_path / "m.wav", torch.zeros(100, dtype=torch.bfloat16), 16000)
    assert read_audio(path)[0].shape == (1, 100)
    with pytest.raises(InvalidRequest, match=r"\.wav, \.flac, \.mp3, \.opus, \.ogg, \.aac or \.pcm"):
        write_audio(tmp_path / "m.xyz", torch.zeros(100), 16000)
    with pytest.raises(InvalidRequest, match="metadata"):
        write_audio(tmp_path / "m.wav", torch.zeros(100), 16000, metadata={"mood": "x"})


def test_failed_write_leaves_existing_file(tmp_path, monkeypatch):
    path = write_audio(tmp_path / "keep.wav", torch.full((1, 50), 0.25), 16000)
    before = path.read_bytes()
    with pytest.raises(ValueError):
        write_audio(path, torch.zeros(2, 2, 50), 16000)
    with pytest.raises(InvalidRequest, match="subtype"):
        write_audio(path, torch.zeros(1, 50), 16000, subtype="PCM_S8")

    def broken_write(self, data):
        raise OSError("disk full")

    monkeypatch.setattr(sf.SoundFile, "write", broken_write)
    with pytest.raises(OSError, match="disk full"):
        write_audio(path, torch.zeros(1, 50), 16000)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["keep.wav"]
