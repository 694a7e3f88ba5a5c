"""One table of output formats: every writer and front end derives from it and writes every
format it can (issue 23 item 5, issue 22 item 20)."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
import torch

from mizuoto import Audio
from mizuoto.audio_encoding import MEDIA_TYPES, encode
from mizuoto.audio_formats import BY_EXTENSION, FORMATS, format_for_path, format_named
from mizuoto.errors import InvalidRequest

SAMPLES = 0.3 * torch.sin(torch.arange(2400) / 7.0)


def _decoded_seconds(fmt, data: bytes, rate: int) -> float:
    """Length of the audio in ``data``: raw PCM by its size, AAC through PyAV, the rest through
    libsndfile."""
    if not fmt.container:
        return len(data) / 2 / fmt.output_rate(rate)
    if fmt.soundfile is None:
        av = pytest.importorskip(fmt.needs)
        with av.open(io.BytesIO(data)) as container:
            samples = sum(frame.samples for frame in container.decode(audio=0))
        return samples / fmt.output_rate(rate)
    info = sf.info(io.BytesIO(data))
    return info.frames / info.samplerate


@pytest.mark.parametrize("name", list(FORMATS))
def test_audio_save_writes_every_format_by_extension(tmp_path, name):
    fmt = FORMATS[name]
    for extension in fmt.extensions:
        path = tmp_path / f"out{extension}"
        Audio(SAMPLES, 24000).save(path, metadata={"comment": "seed 1"})
        data = path.read_bytes()
        if not fmt.metadata and name != "opus":  # an Ogg stream has a random serial number
            assert data == encode(SAMPLES.numpy(), 24000, name)  # the server's bytes
        # lossy codecs add priming and pad to whole frames (AAC: 1024 samples each)
        assert _decoded_seconds(fmt, data, 24000) == pytest.approx(0.1, abs=0.08)
        if fmt.metadata:
            assert sf.SoundFile(path).comment == "seed 1"


def test_an_unknown_extension_is_refused_listing_every_format(tmp_path):
    for bad in ("out.xyz", "out", "out.wav.bak", "out.m4a"):
        with pytest.raises(InvalidRequest) as caught:
            Audio(SAMPLES, 24000).save(tmp_path / bad)
        assert caught.value.field == "output"
        for extension in BY_EXTENSION:
            assert extension in str(caught.value)
    assert not list(tmp_path.iterdir())
    assert format_for_path("X.FLAC").name == "flac"  # extensions are case-insensitive
    with pytest.raises(InvalidRequest, match="wav, flac, mp3, opus, aac, pcm"):
        format_named("ogg-vorbis")


def test_the_servers_request_model_and_media_types_come_from_the_table():
    pytest.importorskip("fastapi")
    from pydantic import ValidationError

    from mizuoto.serve.routes import SpeechBody

    for name in FORMATS:
        assert SpeechBody(model="m", input="x", voice="v", response_format=name)
    with pytest.raises(ValidationError, match="'wav', 'flac', 'mp3', 'opus', 'aac' or 'pcm'"):
        SpeechBody(model="m", input="x", voice="v", response_format="ogg")
    assert MEDIA_TYPES == {name: fmt.media_type for name, fmt in FORMATS.items()}


def test_batch_and_say_offer_every_format():
    from mizuoto.commands.batch import batch
    from mizuoto.commands.say import say

    choice = next(p for p in batch.params if p.name == "file_format").type
    assert list(choice.choices) == list(FORMATS)
    help_text = next(p for p in say.params if p.name == "output").help
    assert all(extension in help_text for extension in BY_EXTENSION)


@pytest.mark.parametrize("name", list(FORMATS))
def test_batch_and_say_write_every_format(fake_plugin, tmp_path, name):
    from click.testing import CliRunner

    from mizuoto.cli import cli

    fmt = FORMATS[name]
    (tmp_path / "fake.json").write_text("{}")
    (tmp_path / "in.txt").write_text("one\ntwo\n", encoding="utf-8")
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["batch", "-m", str(tmp_path), "-o", str(out),
                                      "--format", name, str(tmp_path / "in.txt")], obj={})
    assert result.exit_code == 0, result.output
    written = sorted(path.name for path in out.iterdir() if path.name != "manifest.jsonl")
    assert written == [f"000001{fmt.extension}", f"000002{fmt.extension}"]
    assert _decoded_seconds(fmt, (out / written[0]).read_bytes(), 8000) == \
        pytest.approx(1.0, abs=0.2)
    for extension in fmt.extensions:
        said = tmp_path / f"said{extension}"
        result = CliRunner().invoke(cli, ["say", "-m", str(tmp_path), "-o", str(said), "hi"],
                                    obj={})
        assert result.exit_code == 0, result.output
        assert _decoded_seconds(fmt, said.read_bytes(), 8000) == pytest.approx(1.0, abs=0.2)


def test_contracts_audio_does_not_import_the_dsp_package(tmp_path):
    # the cycle contracts/audio -> nn/dsp/audio_io -> contracts/results -> contracts/audio
    code = ("import sys, torch, mizuoto.contracts.audio as a;"
            "a.Audio(torch.zeros(8), 8000).save(sys.argv[1]);"
            "print(sorted(m for m in sys.modules if m.startswith('mizuoto.nn')))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.wav")],
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_write_audio_keeps_its_old_import_path():
    from mizuoto.audio_encoding import write_audio
    from mizuoto.nn.dsp import audio_io

    assert audio_io.write_audio is write_audio
    assert np.isclose(FORMATS["pcm"].output_rate(44100), 24000)
