"""The one audio writer against hostile targets, for every front end that writes a file through
it (``Audio.save``, ``say --stream``'s ``write_stream``, long-form): a symlink is written
through and stays a link, a FIFO is written into and stays a FIFO, a full device says so by
name and stays a device, a folder is refused, and an error leaves neither the file nor a
temporary beside it."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from mizuoto import Audio, SynthesisRequest
from mizuoto.audio_encoding import open_writer, write_stream
from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.engine import Engine, ModelInfo
from mizuoto.contracts.results import Rendered
from mizuoto.errors import DiskFull
from mizuoto.longform import synthesize_to

RATE = 8000
REQUEST = SynthesisRequest("Hostile targets, one writer.", seed=11)


class Chunks(Engine):
    name = "chunks"
    request_settings = frozenset()
    info = ModelInfo("chunks", "chunks-model", "v0", RATE, "float32", "cpu",
                     frozenset({Capability.ZERO_SHOT, Capability.STREAM, Capability.LONG_TEXT}))
    load = classmethod(lambda cls, model_dir, **kwargs: cls())

    def _stream(self, request, params, generator, progress):
        samples = 0.3 * torch.randn(30 * len(request.text), generator=generator)
        pieces = samples.tensor_split(3)
        for index, piece in enumerate(pieces):
            yield Rendered(Audio(piece, RATE), last=index == len(pieces) - 1)


def _save(path: Path) -> None:
    Audio(torch.zeros(800), RATE).save(path)


def _stream(path: Path) -> None:
    engine = Chunks()
    write_stream(engine.stream(REQUEST), path, RATE)


def _long_form(path: Path) -> None:
    assert synthesize_to(Chunks(), path, REQUEST).complete


WRITERS = {"save": _save, "stream": _stream, "long-form": _long_form}


@pytest.mark.parametrize("write", WRITERS.values(), ids=WRITERS)
@pytest.mark.parametrize("extension", [".wav", ".flac", ".mp3", ".pcm"])
def test_a_symlink_is_written_through_and_stays_a_link(write, extension, tmp_path):
    target = tmp_path / "real" / f"out{extension}"
    target.parent.mkdir()
    link = tmp_path / f"link{extension}"
    link.symlink_to(target)
    write(link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.stat().st_size > 0
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # no temporary


@pytest.mark.parametrize("write", WRITERS.values(), ids=WRITERS)
def test_a_fifo_is_written_into_and_stays_a_fifo(write, tmp_path):
    fifo = tmp_path / "out.wav"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write(fifo)
    reader.join(30)
    assert got and got[0][:4] == b"RIFF"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.wav"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
@pytest.mark.parametrize("write", [_save, _stream], ids=["save", "stream"])
def test_a_full_device_is_named_and_stays_a_device(write):
    with pytest.raises(DiskFull, match="/dev/full"):
        write(Path("/dev/full"))
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


@pytest.mark.parametrize("write", WRITERS.values(), ids=WRITERS)
def test_a_folder_is_refused_and_left_as_it_was(write, tmp_path):
    folder = tmp_path / "out.wav"
    folder.mkdir()
    (folder / "keep").write_text("mine")
    with pytest.raises(Exception):  # noqa: B017 (each writer names it its own way)
        write(folder)
    assert folder.is_dir() and (folder / "keep").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.wav"]


def test_an_error_mid_write_leaves_nothing_behind(tmp_path):
    path = tmp_path / "half.wav"
    with pytest.raises(RuntimeError, match="mid-write"):
        with open_writer(path, "wav", RATE) as writer:
            writer.write(np.zeros(400, np.float32))
            raise RuntimeError("mid-write")
    assert list(tmp_path.iterdir()) == []


def test_two_writers_on_one_path_leave_one_whole_file(tmp_path):
    # two runs on one folder: each writes its own temporary, the last rename wins whole
    path = tmp_path / "same.wav"
    first, second = open_writer(path, "wav", RATE), open_writer(path, "wav", RATE)
    first.write(np.full(400, 0.1, np.float32))
    second.write(np.full(800, -0.1, np.float32))
    first.close()
    second.close()
    import soundfile as sf

    data, rate = sf.read(path, dtype="float32")
    assert rate == RATE and data.shape == (800,) and np.all(data < 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same.wav"]
