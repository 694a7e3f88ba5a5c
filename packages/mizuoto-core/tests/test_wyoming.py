"""``mizuoto wyoming`` driven by the wyoming package's own client (Home Assistant's), against
tiny random-init models on 127.0.0.1, next to ``mizuoto serve`` sharing its voice store."""

from __future__ import annotations

import asyncio
import io
import json

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("wyoming")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("mizuoto_f5tts")
pytest.importorskip("mizuoto_voxcpm")

from wyoming.audio import AudioChunk, AudioStart, AudioStop  # noqa: E402
from wyoming.client import AsyncTcpClient  # noqa: E402
from wyoming.error import Error  # noqa: E402
from wyoming.info import Describe, Info  # noqa: E402
from wyoming.tts import (  # noqa: E402
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

from mizuoto.serve import ServeConfig  # noqa: E402
from mizuoto.serve import serve_in_thread as http_in_thread  # noqa: E402
from mizuoto.wyoming.server import MAX_TEXT_CHARS, WyomingConfig, serve_in_thread  # noqa: E402

SEED = 7
STEPS = 2  # a tiny model at two sampling steps: a fraction of a second
TEXT = "Hello from the server."
TIMEOUT = 60  # seconds any one exchange may take: a hang fails instead of blocking CI


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from mizuoto_f5tts.fixtures import write_random_model_dir
    from mizuoto_voxcpm.fixtures import write_random_model

    root = tmp_path_factory.mktemp("wyoming-models")
    write_random_model_dir(root / "f5", "v1_base", size="tiny")
    write_random_model(root / "vox", "voxcpm2", dtype="float32")
    # three patches: the random stop head never fires (the HTTP tests' max_len)
    (root / "vox" / "mizuoto-defaults.json").write_text(json.dumps({"params": {"max_len": 3}}))
    return root


@pytest.fixture(scope="module")
def serve_config(model_dirs, tmp_path_factory):
    return ServeConfig(models={"f5": str(model_dirs / "f5"), "vox": str(model_dirs / "vox")},
                       voices_dir=tmp_path_factory.mktemp("voices"), queue_size=2)


@pytest.fixture(scope="module")
def http(serve_config):
    with http_in_thread(serve_config) as url:
        yield url


@pytest.fixture(scope="module")
def address(serve_config):
    config = WyomingConfig(serve_config, seed=SEED, steps=STEPS, max_connections=3)
    with serve_in_thread(config) as address:
        yield address


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, TIMEOUT))


async def _events(client, until: str) -> list:
    events = []
    while True:
        event = await client.read_event()
        assert event is not None, "the server closed the connection"
        events.append(event)
        if event.type == until or Error.is_type(event.type):
            return events


async def _exchange(address, *sent, until: str) -> list:
    async with AsyncTcpClient(*address) as client:
        for event in sent:
            await client.write_event(event.event())
        return await _events(client, until)


def _samples(events) -> np.ndarray:
    return np.frombuffer(b"".join(AudioChunk.from_event(e).audio for e in events
                                  if AudioChunk.is_type(e.type)), "<i2")


@pytest.fixture(scope="module")
def reader(http):
    """A voice made through the HTTP server (as the page makes one), for the F5 model."""
    from mizuoto_contract.reference import REFERENCE_TEXT, voiced_signal

    clip = io.BytesIO()
    sf.write(clip, voiced_signal(24000), 24000, format="WAV", subtype="PCM_16")
    created = httpx.post(f"{http}/v1/audio/voices",
                         data={"name": "reader", "model": "f5", "text": REFERENCE_TEXT},
                         files={"audio": ("reader.wav", clip.getvalue(), "audio/wav")},
                         timeout=60)
    assert created.status_code == 201, created.text
    return "reader"


def test_describe_lists_every_model_and_saved_voice(address, reader):
    [event] = run(_exchange(address, Describe(), until="info"))
    info = Info.from_event(event)
    programs = {p.name: p for p in info.tts}
    assert set(programs) == {"mizuoto-f5", "mizuoto-vox"}
    assert [v.name for v in programs["mizuoto-f5"].voices] == ["f5/default", "f5/reader"]
    assert [v.name for v in programs["mizuoto-vox"].voices] == ["vox/default"]  # F5's voice
    # the model cards' languages (ModelInfo.languages): F5-TTS's, VoxCPM2's
    from mizuoto_voxcpm.engine import V2_LANGUAGES

    assert programs["mizuoto-f5"].voices[0].languages == ["en", "zh"]
    assert programs["mizuoto-vox"].voices[0].languages == list(V2_LANGUAGES)
    assert all(p.supports_synthesize_streaming for p in info.tts)
    assert "licence" in programs["mizuoto-vox"].description


@pytest.mark.parametrize("voice", ["vox/default", "f5/reader"])
def test_synthesize_is_the_http_apis_audio(address, http, reader, voice):
    model, name = voice.split("/")
    events = run(_exchange(address, Synthesize(TEXT, voice=SynthesizeVoice(voice)),
                           until="audio-stop"))
    start = AudioStart.from_event(events[0])
    assert (start.width, start.channels) == (2, 1)
    extension = {"seed": SEED, "steps": STEPS}
    response = httpx.post(f"{http}/v1/audio/speech", json={
        "model": model, "input": TEXT, "voice": name, "response_format": "wav",
        "mizuoto": extension}, timeout=60)
    assert response.status_code == 200, response.text
    expected, rate = sf.read(io.BytesIO(response.content), dtype="int16")
    assert start.rate == rate
    assert np.array_equal(_samples(events), expected)
    assert AudioStop.is_type(events[-1].type)


def test_streamed_text_is_spoken_before_synthesize_stop(address):
    async def exchange():
        async with AsyncTcpClient(*address) as client:
            voice = SynthesizeVoice("vox/default")
            await client.write_event(SynthesizeStart(voice=voice).event())
            await client.write_event(Synthesize("One. Two.", voice=voice).event())  # ignored
            await client.write_event(SynthesizeChunk("One sentence. And ").event())
            # the first sentence is complete: its audio comes before the stop is sent
            before = [await client.read_event(), await client.read_event()]
            await client.write_event(SynthesizeChunk("another").event())
            await client.write_event(SynthesizeStop().event())
            return before, await _events(client, "synthesize-stopped")

    before, after = run(exchange())
    assert AudioStart.is_type(before[0].type) and AudioChunk.is_type(before[1].type)
    kinds = [e.type for e in after]
    assert kinds[-2:] == ["audio-stop", "synthesize-stopped"]
    assert "audio-start" not in kinds and "audio-chunk" in kinds  # one audio stream in all
    assert not any(Error.is_type(k) for k in kinds)


def test_f5_audio_goes_out_chunk_by_chunk_of_its_text(address, monkeypatch):
    """A long text for F5-TTS: its first text chunk's audio reaches the client while the
    second chunk is held back at its vocoder (chunks counted, not timed)."""
    import threading

    import mizuoto_f5tts.engine as f5_engine

    vocode, vocoded, held = f5_engine.vocode, [], threading.Event()

    def counting_vocode(*args, **kwargs):
        vocoded.append(1)
        if len(vocoded) == 2:  # bounded: a server that sends nothing yet fails, not hangs
            held.wait(TIMEOUT / 2)
        return vocode(*args, **kwargs)

    monkeypatch.setattr(f5_engine, "vocode", counting_vocode)
    text = " ".join(f"This is sentence number {n} of a long text, read aloud in one request."
                    for n in range(1, 6))

    async def exchange():
        async with AsyncTcpClient(*address) as client:
            await client.write_event(Synthesize(text, voice=SynthesizeVoice("f5")).event())
            start, first = await client.read_event(), await client.read_event()
            vocoded_before_first = len(vocoded)
            held.set()
            return [start, first], vocoded_before_first, await _events(client, "audio-stop")

    (start, first), vocoded_before_first, rest = run(exchange())
    assert AudioStart.is_type(start.type) and AudioChunk.is_type(first.type)
    assert len(vocoded) >= 3, "the text is cut into three chunks or more"
    assert vocoded_before_first <= 2 < len(vocoded)
    chunks = [e for e in rest if AudioChunk.is_type(e.type)]
    assert len(chunks) == len(vocoded) - 1 and AudioStop.is_type(rest[-1].type)


def test_bad_requests_get_an_error_and_the_connection_stays_usable(address):
    async def exchange():
        async with AsyncTcpClient(*address) as client:
            errors = []
            for event in (Synthesize(TEXT, voice=SynthesizeVoice("f5/nobody")),
                          Synthesize(TEXT, voice=SynthesizeVoice("nomodel/default")),
                          Synthesize("   ", voice=SynthesizeVoice("f5/default")),
                          Synthesize("a" * (MAX_TEXT_CHARS + 1)),
                          SynthesizeChunk("no start")):
                await client.write_event(event.event())
                [error] = await _events(client, "error")
                errors.append(Error.from_event(error))
            await client.write_event(Synthesize(TEXT, voice=SynthesizeVoice("f5")).event())
            return errors, await _events(client, "audio-stop")

    errors, events = run(exchange())
    assert [e.code for e in errors] == ["voice_not_found", "voice_not_found", "invalid_value",
                                        "string_above_max_length", "invalid_value"]
    assert "nobody" in errors[0].text and "empty" in errors[2].text
    assert len(_samples(events)) > 0


def test_a_client_leaving_mid_stream_frees_the_engine(address, caplog):
    import logging

    async def leave_while_another_speaks():
        async with AsyncTcpClient(*address) as first:
            await first.write_event(Synthesize(TEXT, voice=SynthesizeVoice("vox")).event())
            # the second one's job waits behind the first's; it leaves before its turn
            second = AsyncTcpClient(*address)
            await second.connect()
            await second.write_event(Synthesize(TEXT, voice=SynthesizeVoice("vox")).event())
            await asyncio.sleep(0.01)
            await second.disconnect()
            return await _events(first, "audio-stop")

    with caplog.at_level(logging.INFO, logger="mizuoto.serve"):
        events = run(leave_while_another_speaks())
        assert not any(Error.is_type(e.type) for e in events)
        # the abandoned job is skipped, not generated: the engine is free for the next ones
        for _ in range(4):  # more clients in turn than the connection limit: none leaked
            events = run(_exchange(address, Synthesize(TEXT, voice=SynthesizeVoice("vox")),
                                   until="audio-stop"))
            assert not any(Error.is_type(e.type) for e in events)
    assert any("request cancelled" in r.getMessage() for r in caplog.records)


def test_clients_past_the_connection_limit_are_refused(address):
    async def crowd():
        clients = [AsyncTcpClient(*address) for _ in range(3)]  # the fixture's limit
        for client in clients:
            await client.connect()
            await client.write_event(Describe().event())
            assert Info.is_type((await client.read_event()).type)
        async with AsyncTcpClient(*address) as extra:
            await extra.write_event(Describe().event())
            refused = await extra.read_event()
        for client in clients:
            await client.disconnect()
        return refused

    refused = run(crowd())
    assert Error.is_type(refused.type)
    assert Error.from_event(refused).code == "too_many_connections"


def test_sentences_are_cut_as_they_complete():
    from mizuoto.wyoming.sentences import SentenceSplitter

    splitter = SentenceSplitter()
    assert splitter.add("Pi is 3.14 and") == []
    assert splitter.add(" round. Next") == ["Pi is 3.14 and round."]
    assert splitter.add("! 你好。再") == ["Next!", "你好。"]
    assert splitter.finish() == "再"


def test_languages_are_the_model_cards_unless_overridden(caplog):
    import logging
    from types import SimpleNamespace

    from mizuoto.wyoming.info import languages

    def engine(spoken):
        return SimpleNamespace(info=SimpleNamespace(model="m", languages=spoken))

    assert languages(engine(("en", "zh"))) == ["en", "zh"]
    assert languages(engine(("en", "zh")), ("de",)) == ["de"]
    with caplog.at_level(logging.WARNING, logger="mizuoto.wyoming"):
        assert languages(engine(())) == []  # announced as it is, with the fix logged
    assert "--language" in caplog.text


def test_the_zeroconf_registration_is_what_home_assistant_browses():
    """Built, not sent: no multicast needed on the machine running the tests."""
    from mizuoto.wyoming.server import zeroconf_service

    service = zeroconf_service(10200, "127.0.0.1", "kitchen")
    assert service.type == "_wyoming._tcp.local."
    assert service.name == "kitchen._wyoming._tcp.local."
    assert service.port == 10200 and service.parsed_addresses() == ["127.0.0.1"]
    default = zeroconf_service(10300, "127.0.0.1")
    assert default.name.startswith("mizuoto-") and default.name.endswith(
        "-10300._wyoming._tcp.local.")
    assert len(default.name.removesuffix("._wyoming._tcp.local.").encode()) <= 63


def test_zeroconf_without_its_package_is_a_named_error(monkeypatch, tmp_path):
    import sys

    from click.testing import CliRunner

    from mizuoto.cli import cli

    monkeypatch.setitem(sys.modules, "zeroconf", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "zeroconf.asyncio", None)
    result = CliRunner().invoke(cli, ["wyoming", "-m", str(tmp_path), "--zeroconf"])
    assert result.exit_code != 0
    assert "--zeroconf needs the zeroconf package" in result.output
    assert "pip install" in result.output


# --- hostile clients: frames, lengths, idle and slow connections, streamed text -------------


@pytest.fixture(scope="module")
def strict(serve_config):
    """A server with short timeouts and small limits, so that they are reached quickly."""
    from mizuoto.wyoming.frames import FrameLimits

    config = WyomingConfig(serve_config, seed=SEED, steps=STEPS, max_connections=2,
                           frames=FrameLimits(idle=1.5, read=1.5), write_timeout=1.5,
                           max_pending_chars=300)
    with serve_in_thread(config) as address:
        yield address


async def _raw(address, sent: bytes, *, shut: bool = False, until_eof: bool = False) -> list:
    """Send ``sent`` as it is; the events answered until an error (or until the server
    closes the connection, with ``until_eof``)."""
    from wyoming.event import async_read_event

    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(sent)
        await writer.drain()
        if shut:
            writer.write_eof()
        events = []
        while True:
            event = await async_read_event(reader)
            if event is None:
                return events
            events.append(event)
            if not until_eof and event.type in ("error", "audio-stop", "info"):
                return events
    finally:
        writer.close()


def _line(value) -> bytes:
    return (value if isinstance(value, str) else json.dumps(value)).encode() + b"\n"


DESCRIBE = _line({"type": "describe"})


@pytest.mark.parametrize("line, problem", [
    ("[2, 3]", "holds an array"),
    ('"synthesize"', "holds a string"),
    ("-4.5", "holds a number"),
    ("{not json", "is not valid JSON"),
    ("[" * 25_000 + "]" * 25_000, "nests deeper than"),
    ({"data": {"text": "hi"}}, 'needs a "type"'),
    ({"type": 12, "data": {}}, 'needs a "type"'),
    ({"type": "describe", "data": "words"}, '"data" must be an object, not a string'),
    ({"type": "describe", "data": [1, 2]}, '"data" must be an object, not an array'),
    ({"type": "synthesize", "data": {"voice": {"name": "f5"}}}, "data.text is missing"),
    ({"type": "synthesize", "data": {"text": "Hi.", "voice": "f5/default"}},
     "data.voice must be an object or null, not a string"),
    ({"type": "synthesize", "data": {"text": "Hi.", "voice": 3}}, "data.voice must be"),
    ({"type": "synthesize", "data": {"text": "Hi.", "voice": [{"name": "f5"}]}},
     "data.voice must be"),
    ({"type": "synthesize", "data": {"text": "Hi.", "voice": {"name": ["f5"]}}},
     "data.voice.name must be a string, not an array"),
    ({"type": "synthesize", "data": {"text": None}}, "data.text must be a string, not null"),
    ({"type": "synthesize-start", "data": {"voice": "vox"}}, "data.voice must be"),
    ({"type": "synthesize-chunk", "data": {"text": 67890}},
     "data.text must be a string, not a number"),
    ('{"type": "synthesize", "data": {"text": "a", "text": "b"}}', "given twice"),
])
def test_events_not_shaped_as_the_protocol_says_get_an_error_and_the_connection_lives(
        address, line, problem, caplog):
    events = run(_raw(address, _line(line) + DESCRIBE, until_eof=False))
    assert [e.type for e in events] == ["error"]
    error = Error.from_event(events[0])
    assert error.code == "invalid_event" and problem in error.text, error.text

    async def then_describe():  # the same connection answers the next event
        reader, writer = await asyncio.open_connection(*address)
        from wyoming.event import async_read_event
        writer.write(_line(line) + DESCRIBE)
        await writer.drain()
        kinds = [(await async_read_event(reader)).type, (await async_read_event(reader)).type]
        writer.close()
        return kinds

    assert run(then_describe()) == ["error", "info"]
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize("header, problem, code", [
    ({"type": "describe", "data_length": "16"}, "data_length must be a non-negative integer",
     "invalid_event"),
    ({"type": "describe", "data_length": 2.5}, "data_length must be", "invalid_event"),
    ({"type": "describe", "payload_length": -9}, "payload_length must be", "invalid_event"),
    ({"type": "describe", "payload_length": True}, "payload_length must be", "invalid_event"),
    ({"type": "describe", "data_length": 3 * 2**30}, "more than this server reads",
     "frame_too_large"),
    ({"type": "synthesize", "payload_length": 2**40}, "more than this server reads",
     "frame_too_large"),
])
def test_declared_lengths_are_checked_before_a_byte_of_them_is_read(address, header, problem,
                                                                    code):
    # nothing follows the header: a server that waited for the declared bytes would hang here
    events = run(_raw(address, _line(header), until_eof=True))
    assert [e.type for e in events] == ["error"]  # then the server closed the connection
    error = Error.from_event(events[0])
    assert error.code == code and problem in error.text, error.text


def test_a_data_block_and_payload_within_bounds_are_read_and_the_event_answered(address):
    data = json.dumps({"text": TEXT, "voice": {"name": "vox"}}).encode()
    frame = _line({"type": "synthesize", "data_length": len(data), "payload_length": 5})
    events = run(_raw(address, frame + data + b"\x00" * 5))
    assert events[0].type == "audio-start" and events[-1].type == "audio-stop"


def test_an_overlong_header_line_is_refused_without_buffering_it(address):
    events = run(_raw(address, b'{"type": "describe", "pad": "' + b"y" * (300 << 10),
                      until_eof=True))
    assert [Error.from_event(e).code for e in events] == ["frame_too_large"]


def test_a_half_closed_client_still_gets_its_audio(strict):
    synthesize = Synthesize("Half closed.", voice=SynthesizeVoice("vox")).event()
    frame = _line({"type": "synthesize", "data": synthesize.data})
    events = run(_raw(strict, frame, shut=True, until_eof=True))
    assert events[0].type == "audio-start" and events[-1].type == "audio-stop"
    assert len(_samples(events)) > 0


def test_idle_connections_are_closed_and_free_their_slots(strict):
    async def idle_then_served():
        from wyoming.event import async_read_event

        idle = [await asyncio.open_connection(*strict) for _ in range(2)]  # the limit
        refused = await _raw(strict, b"")  # over the limit: answered before it sends a byte
        closed = [await async_read_event(reader) for reader, _ in idle]  # after 1.5 s
        gone = [await async_read_event(reader) for reader, _ in idle]
        for _, writer in idle:
            writer.close()
        return refused, closed, gone, await _raw(strict, DESCRIBE)

    refused, closed, gone, served = run(idle_then_served())
    assert Error.from_event(refused[0]).code == "too_many_connections"
    assert [Error.from_event(e).code for e in closed] == ["idle_timeout"] * 2
    assert gone == [None, None]
    assert served[0].type == "info"


def test_streamed_text_without_a_sentence_end_is_bounded(strict):
    async def stream():
        async with AsyncTcpClient(*strict) as client:
            await client.write_event(SynthesizeStart(voice=SynthesizeVoice("vox")).event())
            for _ in range(4):  # 4 x 100 characters, no stop: past the server's 300
                await client.write_event(SynthesizeChunk("word " * 20).event())
            [error] = await _events(client, "error")
            # the connection lives: a new stream is spoken
            await client.write_event(SynthesizeStart(voice=SynthesizeVoice("vox")).event())
            await client.write_event(SynthesizeChunk("Short. ").event())
            await client.write_event(SynthesizeStop().event())
            return Error.from_event(error), await _events(client, "synthesize-stopped")

    error, events = run(stream())
    assert error.code == "string_above_max_length" and "synthesize-chunk" in error.text
    assert events[-1].type == "synthesize-stopped" and len(_samples(events)) > 0


def test_a_long_run_of_stops_is_scanned_in_one_pass():
    from mizuoto.wyoming.sentences import SentenceSplitter

    splitter = SentenceSplitter()
    for _ in range(40):  # 40 chunks of 5,000 dots: re-scanning or backtracking would not end
        assert splitter.add("." * 5_000) == []
    assert splitter.add(" next") == ["." * 200_000]
    assert splitter.finish() == "next"


def test_a_client_that_takes_no_audio_is_disconnected_after_the_write_timeout():
    """Unit: the write that does not drain in time aborts the connection."""
    from types import SimpleNamespace

    from wyoming.event import Event

    from mizuoto.wyoming.handler import WyomingHandler

    aborted = []

    class StalledWriter:
        transport = SimpleNamespace(abort=lambda: aborted.append(True))

        def write(self, data):
            pass

        async def drain(self):
            await asyncio.sleep(3600)

    service = SimpleNamespace(config=SimpleNamespace(write_timeout=0.05))
    handler = WyomingHandler(None, StalledWriter(), service)
    with pytest.raises(TimeoutError, match="took no audio"):
        run(handler.write_event(Event("audio-chunk", {}, b"\x00" * 10)))
    assert aborted == [True]


def test_a_damaged_saved_voice_is_a_named_error_and_the_connection_lives(address,
                                                                         serve_config):
    import torch
    from safetensors.torch import save_file

    path = serve_config.voices_dir / "tangled.safetensors"
    save_file({"x": torch.zeros(2)}, str(path), metadata={
        "format": "mizuoto-voice/1", "engine": "f5tts", "model_fingerprint": "00",
        "sample_rate": "24000", "texts": "{\"t\": " + "[" * 9_000 + "]" * 9_000 + "}"})
    async def exchange():
        async with AsyncTcpClient(*address) as client:
            await client.write_event(
                Synthesize(TEXT, voice=SynthesizeVoice("f5/tangled")).event())
            await client.write_event(Describe().event())
            return await client.read_event(), await client.read_event()

    try:
        refused, answered = run(exchange())
    finally:
        path.unlink()
    error = Error.from_event(refused)
    assert error.code == "voice_damaged" and "nests deeper than" in error.text, error.text
    assert answered.type == "info"
