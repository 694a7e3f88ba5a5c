"""One writer for every front end: a format added in one row of ``audio_formats`` (here a
test-only row with its own encoder) is written by ``Audio.save``, ``say --stream``'s
``write_stream``, the server (whole and streamed) and long-form, with nothing else changed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mizuoto import Audio, SynthesisRequest
from mizuoto.audio_encoding import BytesEncoder, StreamEncoder, encode, write_stream
from mizuoto.audio_formats import AudioFormat, format_for_path, format_named
from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.engine import Engine, ModelInfo
from mizuoto.contracts.results import Rendered
from mizuoto.longform import synthesize_to

RATE = 8000


class U8Encoder(BytesEncoder):
    """Unsigned 8-bit samples, no header: a format no other file knows."""

    def write(self, samples: np.ndarray) -> None:
        self.file.write(_u8(samples))


def _u8(samples) -> bytes:
    samples = np.asarray(samples, dtype=np.float32)
    return np.rint(np.clip(samples, -1.0, 1.0) * 127.0 + 128.0).astype(np.uint8).tobytes()


U8 = AudioFormat("u8", (".u8",), "audio/x-u8", container=False, encoder=f"{__name__}:U8Encoder")


@pytest.fixture
def u8(monkeypatch):
    from mizuoto import audio_formats

    monkeypatch.setitem(audio_formats._TABLE, U8.name, U8)  # the one row a new format adds
    return U8


class ChunkedNoise(Engine):
    """Seeded noise, 40 samples per character, streamed in three chunks."""

    name = "chunked-noise"
    request_settings = frozenset()
    info = ModelInfo("chunked-noise", "noise-model", "v0", RATE, "float32", "cpu",
                     frozenset({Capability.ZERO_SHOT, Capability.STREAM, Capability.LONG_TEXT}))
    load = classmethod(lambda cls, model_dir, **kwargs: cls())

    def _stream(self, request, params, generator, progress):
        samples = 0.4 * torch.randn(40 * len(request.text), generator=generator)
        pieces = samples.tensor_split(3)
        for index, piece in enumerate(pieces):
            yield Rendered(Audio(piece, RATE), last=index == len(pieces) - 1)


REQUEST = SynthesisRequest("A format added in one row.", seed=5)


def test_the_row_is_a_format_like_any_other(u8):
    assert format_named("u8") is u8 and format_for_path("x.U8") is u8


def test_audio_save_and_encode_write_the_rows_encoder(u8, tmp_path):
    samples = np.linspace(-1.5, 1.5, 999, dtype=np.float32)
    Audio(torch.from_numpy(samples), RATE).save(tmp_path / "a.u8")
    assert (tmp_path / "a.u8").read_bytes() == _u8(samples) == encode(samples, RATE, "u8")
    stream = StreamEncoder("u8", RATE)
    parts = [stream.feed(samples[:500]), stream.feed(samples[500:]), stream.close()]
    assert parts[0] == _u8(samples[:500])  # streamable: handed out as it comes
    assert b"".join(parts) == _u8(samples)


def test_say_streams_and_long_form_write_it(u8, tmp_path):
    engine = ChunkedNoise()
    samples = engine.synthesize(REQUEST).audio.numpy()
    written = []
    applied = write_stream(engine.stream(REQUEST), tmp_path / "s.u8", RATE,
                           on_chunk=lambda chunks, seconds: written.append(chunks))
    assert (tmp_path / "s.u8").read_bytes() == _u8(samples)
    assert written == [1, 2, 3] and applied.seed == 5
    assert synthesize_to(engine, tmp_path / "l.u8", REQUEST).complete
    assert (tmp_path / "l.u8").read_bytes() == _u8(samples)


def test_the_server_sends_it_whole_and_streamed(u8, tmp_path):
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from mizuoto.serve import ServeConfig, create_app

    engine = ChunkedNoise()
    samples = engine.synthesize(REQUEST).audio.numpy()
    config = ServeConfig(models={"noise": "noise"}, voices_dir=tmp_path)
    app = create_app(config, loader=lambda name, model: (lambda: engine, True))
    body = {"model": "noise", "input": REQUEST.text, "voice": "default",
            "response_format": "u8", "mizuoto": {"seed": 5}}
    with TestClient(app, base_url="http://127.0.0.1") as client:
        assert "u8" in client.get("/v1/models").json()["mizuoto"]["formats"]
        for stream in (True, False):
            response = client.post("/v1/audio/speech",
                                   json={**body, "mizuoto": {"seed": 5, "stream": stream}})
            assert response.status_code == 200, response.text
            assert response.headers["content-type"] == "audio/x-u8"
            assert response.content == _u8(samples)


def test_the_command_line_offers_it(u8):
    # the choices are read from the table when the command runs, not when it was defined
    from click.testing import CliRunner

    from mizuoto.cli import cli

    result = CliRunner().invoke(cli, ["batch", "--help"])
    assert result.exit_code == 0 and "u8" in result.output
    from mizuoto.commands.toolkit import FormatChoice

    assert FormatChoice().convert("U8", None, None) == "u8"
