"""``mizuoto serve`` against a hostile client (issue 22's server cases): the API key, body
limits counted as bytes arrive, decompression bombs through voice uploads, nesting, the
server's options, one validation for every front end, and ``--max-loaded`` under load. Live
servers on 127.0.0.1 (threads; one subprocess), tiny random-init F5-TTS models, offline."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("mizuoto_f5tts")

import soundfile as sf  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from mizuoto import SynthesisRequest  # noqa: E402
from mizuoto.cli import cli  # noqa: E402
from mizuoto.errors import InvalidRequest  # noqa: E402
from mizuoto.serve import ServeConfig, serve_in_thread  # noqa: E402
from mizuoto.serve.app import bind, wait_healthy  # noqa: E402
from mizuoto.serve.gate import MAX_OTHER_BODY, MAX_SPEECH_BODY  # noqa: E402
from mizuoto.serve.uploads import ClipLimits, read_clip  # noqa: E402

F5 = {"steps": 2, "seed": 3}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from mizuoto_f5tts.fixtures import write_random_model_dir

    root = tmp_path_factory.mktemp("hardening-models")
    for name in ("f5", "g5"):
        write_random_model_dir(root / name, "v1_base", size="tiny")
    return root


class _Errors(logging.Handler):
    """Collects ERROR records of the server's loggers and uvicorn's (which does not propagate
    to the root logger that pytest's caplog watches)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record) -> None:
        self.records.append(record)


@contextlib.contextmanager
def _serving_watched(config: ServeConfig):
    """The server's URL and the ERROR records its loggers emit meanwhile."""
    errors = _Errors()
    loggers = [logging.getLogger(name) for name in ("mizuoto", "uvicorn", "uvicorn.error")]
    with serve_in_thread(config) as url:
        for logger in loggers:
            logger.addHandler(errors)
        try:
            yield url, errors
        finally:
            for logger in loggers:
                logger.removeHandler(errors)


@pytest.fixture(scope="module")
def served(model_dirs, tmp_path_factory):
    voices = tmp_path_factory.mktemp("voices")
    config = ServeConfig(models={"f5": str(model_dirs / "f5")}, voices_dir=voices,
                         queue_size=4)
    with _serving_watched(config) as (url, errors):
        yield url, voices, errors


@pytest.fixture
def server(served):
    url, _, errors = served
    errors.records.clear()
    yield url
    assert not errors.records, [r.getMessage() for r in errors.records]  # no 4xx is an ERROR


def _speech(url, **mizuoto):
    return {"model": "f5", "input": "Hello there.", "voice": "default", "response_format": "wav",
            "mizuoto": {**F5, **mizuoto}}


def _error(response, status, code=None, param=None):
    assert response.status_code == status, response.text[:300]
    error = response.json()["error"]
    assert code is None or error["code"] == code, error
    assert param is None or error["param"] == param, error
    return error


# ---------------------------------------------------------------------------- 1: the API key


@pytest.mark.parametrize("key", ["", " ", "\t\n", "two words", "caf\u00e9", "nul\x00"])
def test_an_empty_blank_or_unsendable_api_key_is_refused(key):
    with pytest.raises(InvalidRequest) as caught:
        ServeConfig(models={"m": "m"}, api_key=key)
    assert caught.value.field == "api_key"


def test_the_cli_refuses_an_empty_key_from_the_option_or_the_environment(model_dirs):
    runner = CliRunner()
    model = str(model_dirs / "f5")
    result = runner.invoke(cli, ["serve", "-m", model, "--api-key", ""], obj={})
    assert result.exit_code == 2 and "--api-key: is empty" in result.output
    for value in ("", "   "):  # click reads an empty variable as unset: not here
        result = runner.invoke(cli, ["serve", "-m", model], obj={},
                               env={"MIZUOTO_API_KEY": value})
        assert result.exit_code == 2 and "MIZUOTO_API_KEY: is empty" in result.output


def test_the_key_is_checked_on_every_path_but_health(model_dirs, tmp_path):
    config = ServeConfig(models={"f5": str(model_dirs / "f5")}, api_key="s3same",
                         voices_dir=tmp_path)
    with serve_in_thread(config) as url:
        for path in ("/v1/models", "/metrics", "/v1/audio/voices", "/nowhere"):
            assert httpx.get(f"{url}{path}").status_code == 401, path
            assert httpx.get(f"{url}{path}", headers={"Authorization": "s3same"}
                             ).status_code == 401, path
        _error(httpx.post(f"{url}/v1/audio/speech", json=_speech(url)), 401, "invalid_api_key")
        assert httpx.get(f"{url}/health").status_code == 200
        for scheme in ("Bearer", "bearer", "BEARER"):  # the scheme is case-insensitive
            ok = httpx.get(f"{url}/v1/models", headers={"Authorization": f"{scheme} s3same"})
            assert ok.status_code == 200, scheme
        for wrong in ("Bearer s3sam", "Bearer s3same2", "Bearer", "Basic s3same", "s3same"):
            assert httpx.get(f"{url}/v1/models", headers={"Authorization": wrong}
                             ).status_code == 401, wrong
        doubled = [("Authorization", "Bearer nope"), ("Authorization", "Bearer s3same")]
        assert httpx.get(f"{url}/v1/models", headers=doubled).status_code == 401


def test_the_start_line_says_whether_auth_is_on_and_a_busy_port_exits_2(model_dirs, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "MIZUOTO_HOME": str(tmp_path), "MIZUOTO_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "MIZUOTO_API_KEY": "k3y"}
    process = subprocess.Popen([sys.executable, "-m", "mizuoto", "serve", "-m",
                                str(model_dirs / "f5"), "--port", str(port)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", process)
        busy = subprocess.run([sys.executable, "-m", "mizuoto", "serve", "-m",
                               str(model_dirs / "f5"), "--port", str(port)], env=env,
                              capture_output=True, text=True, timeout=120)
        assert busy.returncode == 2, busy.stderr
        assert f"port: 127.0.0.1:{port} is already in use" in busy.stderr
        assert "Traceback" not in busy.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    lines = [line for line in stderr.splitlines() if "authentication:" in line]
    assert len(lines) == 1 and "authentication: on" in lines[0], stderr


# ------------------------------------------------------------- 2: bodies counted as they arrive


def _raw(url: str, head: bytes, chunks, *, limit_bytes: int) -> tuple[int, int, bytes]:
    """Send ``head`` then ``chunks`` (bytes, each already framed) until the server answers or
    ``limit_bytes`` were sent; the status, the bytes of body sent, and the answer."""
    host, port = url.removeprefix("http://").split(":")
    sent = 0
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head)
        for chunk in chunks:
            if select.select([sock], [], [], 0)[0]:
                break  # the server has answered: it stopped reading
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
            if sent >= limit_bytes:
                break
        answer = b""
        sock.settimeout(30)
        try:
            while b"\r\n\r\n" not in answer or len(answer) < answer.index(b"\r\n\r\n") + 40:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
        except (ConnectionResetError, TimeoutError):
            pass
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1") else 0
    return status, sent, answer


def _chunked(size: int, piece: int = 64 << 10, prefix: bytes = b""):
    data = b" " * piece
    if prefix:
        yield b"%x\r\n%s\r\n" % (len(prefix), prefix)
    for _ in range(size // piece):
        yield b"%x\r\n%s\r\n" % (piece, data)
    yield b"0\r\n\r\n"


@pytest.mark.parametrize(("method", "path", "limit"), [
    ("POST", "/v1/audio/speech", MAX_SPEECH_BODY),
    ("POST", "/v1/audio/voices", 10 << 20),
    ("GET", "/v1/models", MAX_OTHER_BODY),
    ("POST", "/nowhere", MAX_OTHER_BODY),
])
def test_a_chunked_body_is_cut_off_at_the_limit(server, method, path, limit):
    content_type = b"multipart/form-data; boundary=x" if "voices" in path else \
        b"application/json"
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() +
            b"Transfer-Encoding: chunked\r\nContent-Type: " + content_type + b"\r\n\r\n")
    prefix = (b'--x\r\nContent-Disposition: form-data; name="audio"; filename="a.flac"\r\n'
              b"Content-Type: audio/flac\r\n\r\n") if "voices" in path else b""
    total = 64 << 20  # the bypass read 300 MB; 64 MB is enough to see the server stop
    status, sent, answer = _raw(server, head, _chunked(total, prefix=prefix), limit_bytes=total)
    if path == "/nowhere" or method == "GET":
        assert status in (200, 404, 413), answer[:300]  # routes that read no body
    else:
        assert status == 413, answer[:300]
        assert b"request_too_large" in answer
        assert b"connection: close" in answer.lower()  # the rest of the body is not read
    assert sent < limit + (16 << 20), f"the server read {sent} bytes"  # + socket buffers


def test_a_declared_length_over_the_limit_is_refused_before_reading(server):
    head = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            b"application/json\r\nContent-Length: %d\r\n\r\n" % (300 << 20))
    status, sent, answer = _raw(server, head, iter([b"{" * 1024] * 4096), limit_bytes=4 << 20)
    assert status == 413 and b"request_too_large" in answer
    assert b"connection: close" in answer.lower()


@pytest.mark.parametrize(("path", "content_type", "first"), [
    ("/v1/audio/speech", b"application/json", b'{"model": "f5", "inp'),
    ("/v1/audio/voices", b"multipart/form-data; boundary=x", b"--x\r\nContent-Disp"),
    ("/v1/models", b"application/json", b"{"),
])
def test_a_body_that_stalls_is_cut_off_with_408(server, monkeypatch, path, content_type,
                                                first):
    """A client sending a few bytes then nothing (one byte a minute holds the handler
    forever) gets a 408 once the body's next bytes are late, on every route."""
    import mizuoto.serve.gate as gate

    monkeypatch.setattr(gate, "BODY_IDLE_SECONDS", 0.5)
    method = "GET" if path == "/v1/models" else "POST"
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
            + b"Content-Type: " + content_type + b"\r\nContent-Length: 5000\r\n\r\n" + first)
    status, _, answer = _raw(server, head, iter([]), limit_bytes=1)
    if method == "GET":
        assert status in (200, 408), answer[:300]  # a route that reads no body may answer
    else:
        assert status == 408, answer[:300]
        assert b"request_timeout" in answer and b"connection: close" in answer.lower()


def test_a_stream_waiting_for_its_client_has_no_body_deadline(server, monkeypatch):
    """The deadline is for the body only: a streamed answer longer than it goes on."""
    import mizuoto.serve.gate as gate

    monkeypatch.setattr(gate, "BODY_IDLE_SECONDS", 0.01)
    body = _speech(server, stream=True)
    body["input"] = "A longer sentence, so that the stream takes a while to finish. " * 3
    with httpx.stream("POST", f"{server}/v1/audio/speech", json=body, timeout=120) as response:
        data = b"".join(response.iter_bytes())
    assert response.status_code == 200 and len(data) > 1000


def test_a_body_just_under_the_limit_is_read(server):
    body = json.dumps(_speech(server)).encode()
    body += b" " * (MAX_SPEECH_BODY - len(body))
    response = httpx.post(f"{server}/v1/audio/speech", content=iter([body]), timeout=120,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text[:300]


# ------------------------------------------------------------- 3: decompression bombs


def _clip(rate: int, channels: int, seconds: float, fmt: str = "FLAC") -> bytes:
    """A clip that compresses to almost nothing (silence, a click a second), written a second
    at a time."""
    buffer = io.BytesIO()
    second = np.zeros((rate, channels), np.float32)
    second[0] = 0.25
    with sf.SoundFile(buffer, "w", rate, channels, format=fmt, subtype="PCM_16") as handle:
        for _ in range(int(seconds)):
            handle.write(second)
        handle.write(second[:int(rate * (seconds % 1))])
    return buffer.getvalue()


def _upload(url, data: bytes, name="bomb", content_type="audio/flac"):
    return httpx.post(f"{url}/v1/audio/voices", data={"name": name, "model": "f5",
                                                      "text": "Some words."},
                      files={"audio": ("clip.flac", data, content_type)}, timeout=120)


@pytest.mark.parametrize(("rate", "channels", "seconds", "fmt", "said"), [
    (384000, 8, 20, "FLAC", "sample rate"),  # the bomb (59 s: 197 KB), shorter
    (384000, 1, 0.5, "WAV", "sample rate"),
    (48000, 9, 1, "WAV", "channels"),
    (48000, 8, 30, "FLAC", "decodes to"),  # under 60 s, but 11.5 M samples
    (96000, 2, 45, "FLAC", "decodes to"),
])
def test_a_clip_is_refused_by_its_decoded_size_before_decoding(server, rate, channels, seconds,
                                                              fmt, said):
    data = _clip(rate, channels, seconds, fmt)
    assert len(data) < (10 << 20)  # small enough to upload: the size of the file is no guide
    error = _error(_upload(server, data), 413, "audio_too_large", "audio")
    assert said in error["message"]


def test_clips_are_decoded_in_blocks_holding_only_the_mono_mix():
    data = _clip(48000, 2, 20)
    tracemalloc.start()
    try:
        audio = read_clip(data, ClipLimits.for_seconds(60))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    mono = 48000 * 20 * 4
    assert audio.samples.numel() == 48000 * 20
    assert peak < mono * 1.5, f"peak {peak} bytes for a {mono}-byte mono clip"
    # the same samples as decoding the whole file then mixing it
    whole, _ = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    assert np.array_equal(audio.samples.numpy(), whole.mean(axis=1))


@pytest.mark.parametrize("data", [b"", b"RIFF" + b"\0" * 40, b"fLaC" + os.urandom(200),
                                  b"OggS" + b"\xff" * 100, b"ID3" + b"\0" * 64])
def test_a_damaged_upload_is_a_400_never_an_error_in_the_log(server, data):
    error = _error(_upload(server, data, content_type="application/x-evil; charset=\"\\"),
                   400, param="audio")
    assert "BytesIO" not in error["message"] and " at 0x" not in error["message"], error


# ------------------------------------------------------------- 4: nesting and 4xx logging


@pytest.mark.parametrize("body", [
    b'{"model": "f5", "input": "x", "voice": "default", "mizuoto": {"params": '
    + b"[" * 50_000 + b"]" * 50_000 + b"}}",
    b'{"model": "f5", "input": "x", "voice": "default", "mizuoto": {"params": {"a": '
    + b"[" * 40 + b"]" * 40 + b"}}}",
    b"[" * 900_000,
    b'{"a": ' * 20_000,
    b'{"model": "f5", "input": "x", "voice": "default", "mizuoto": {"seed": 1' + b"0" * 5000
    + b"}}",
])
def test_deep_nesting_and_huge_literals_are_400(server, body):
    response = httpx.post(f"{server}/v1/audio/speech", content=body,
                          headers={"Content-Type": "application/json"})
    _error(response, 400, "invalid_json")


def test_a_damaged_voice_file_is_a_400_without_the_servers_path(served, server):
    _, voices, _ = served
    (voices / "broken.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{\"a\":1}" + b"x" * 64)
    response = httpx.post(f"{server}/v1/audio/speech", json={**_speech(server),
                                                            "voice": "broken"})
    error = _error(response, 400, "voice_damaged", "voice")
    assert str(voices) not in error["message"]


# ------------------------------------------------------------- 13, 18: the server's options


@pytest.mark.parametrize(("field", "value"), [
    ("grace", math.nan), ("grace", -5.0), ("grace", math.inf), ("grace", 1e9), ("grace", "30"),
    ("port", 99999), ("port", -1), ("port", 0), ("port", 8000.0), ("port", True),
    ("queue_size", 0), ("max_loaded", 0), ("memory_budget", -1), ("max_upload_seconds", 0),
])
def test_server_settings_are_checked_at_start(field, value):
    with pytest.raises(InvalidRequest) as caught:
        ServeConfig(models={"m": "m"}, **{field: value})
    assert caught.value.field == field


@pytest.mark.parametrize(("args", "named"), [
    (["--grace", "nan"], "--grace"), (["--grace", "-5"], "--grace"),
    (["--grace", "inf"], "--grace"), (["--port", "99999"], "--port"),
    (["--port", "-1"], "--port"), (["--queue-size", "0"], "--queue-size"),
])
def test_the_cli_names_a_bad_server_option_and_exits_2(model_dirs, args, named):
    result = CliRunner().invoke(cli, ["serve", "-m", str(model_dirs / "f5"), *args], obj={})
    assert result.exit_code == 2, result.output
    assert f"Error: {named}:" in result.output and "Traceback" not in result.output


def test_binding_a_busy_port_or_a_foreign_address_names_the_option():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(InvalidRequest) as caught:
            bind("127.0.0.1", busy.getsockname()[1])
        assert caught.value.field == "port"
    for host in ("203.0.113.7", "no-such-host.invalid"):
        with pytest.raises(InvalidRequest) as caught:
            bind(host, 0)
        assert caught.value.field == "host"


# ------------------------------------------------------------- 19: one validation


VALUES = [True, False, "2", "", 2.0, 2.5, None, [2], {"v": 2}, 2, -1, 10**30, 1e308]


@pytest.mark.parametrize(("field", "value"), [
    *[(field, value) for field in ("seed", "steps", "guidance") for value in VALUES],
    *[("params", value) for value in (None, {}, [1], "x", 5, True)],
])
def test_the_server_accepts_a_value_exactly_when_the_python_api_does(server, field, value):
    try:
        SynthesisRequest("Hello there.", **{field: value})
        accepted = True
    except InvalidRequest:
        accepted = False
    body = _speech(server)
    body["mizuoto"] = {**body["mizuoto"], field: value}
    if field == "steps" and accepted and value is not None:
        body["mizuoto"]["steps"] = value if value <= 2 else 2  # keep the run short
    response = httpx.post(f"{server}/v1/audio/speech", json=body, timeout=120)
    if accepted:
        assert response.status_code == 200, response.text[:300]
    else:
        _error(response, 400, param=f"mizuoto.{field}")


@pytest.mark.parametrize(("fields", "param"), [
    ({"speed": True}, "speed"), ({"speed": "1.0"}, "speed"), ({"speed": math.nan}, "speed"),
    ({"speed": 4.5}, "speed"), ({"mizuoto": {"stream": "false"}}, "mizuoto.stream"),
    ({"mizuoto": {"stream": 0}}, "mizuoto.stream"),
    ({"mizuoto": {"params": {"speed": True}}}, "mizuoto.params.speed"),
    ({"mizuoto": {"params": {"speed": "1"}}}, "mizuoto.params.speed"),
])
def test_other_fields_refuse_bools_and_strings_for_numbers(server, fields, param):
    body = {**_speech(server), **fields}
    if "mizuoto" in fields:
        body["mizuoto"] = {**F5, **fields["mizuoto"]}
    response = httpx.post(f"{server}/v1/audio/speech",
                          content=json.dumps(body, allow_nan=True),
                          headers={"Content-Type": "application/json"})
    _error(response, 400, param=param)


# ------------------------------------------------------------- 12: --max-loaded under load


def test_one_model_loaded_at_a_time_serves_concurrent_requests_without_503(model_dirs,
                                                                          tmp_path):
    loads = []

    class Loads(logging.Handler):
        def emit(self, record) -> None:
            if record.getMessage().startswith("model ") and " ready " in record.getMessage():
                loads.append(record.getMessage().split()[1])

    handler = Loads()
    logger = logging.getLogger("mizuoto.serve")
    config = ServeConfig(models={"f5": str(model_dirs / "f5"), "g5": str(model_dirs / "g5")},
                         voices_dir=tmp_path, max_loaded=1, queue_size=16)
    with serve_in_thread(config) as url:
        logger.addHandler(handler)
        level = logger.level
        logger.setLevel(logging.INFO)
        try:
            def speak(index: int):
                body = {**_speech(url), "model": ("f5", "g5")[index % 2]}
                return httpx.post(f"{url}/v1/audio/speech", json=body, timeout=300)

            for _ in range(2):  # two rounds of 12 at once, alternating models
                with ThreadPoolExecutor(12) as pool:
                    statuses = [r.status_code for r in pool.map(speak, range(12))]
                assert statuses == [200] * 12, statuses
            health = httpx.get(f"{url}/health").json()["models"]
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
    assert sorted(health.values()) == ["ready", "unloaded"]
    # the loads after start: models alternate in batches (not once per request), and a model
    # is never unloaded under requests queued for it
    assert len(loads) <= 5, loads


def test_a_pinned_model_is_not_unloaded_and_a_waiting_load_gets_its_turn():
    import asyncio

    from mizuoto.serve.worker import DONE, Job, ModelPool, ModelWorker, Pin

    async def scenario():
        loop = asyncio.get_running_loop()
        pool = ModelPool(max_loaded=1)
        workers = {name: ModelWorker(name, name, load=object, queue_size=4, pool=pool,
                                     preload=name == "a") for name in ("a", "b")}
        for worker in workers.values():
            worker.start()
        await asyncio.to_thread(workers["a"].loaded.wait, 60)
        a, b = workers["a"], workers["b"]
        held = Pin(a)  # a request for a, not yet queued
        load_b = Job(lambda engine, job: None, loop, pin=pool.turn(b))
        b.submit(load_b)
        await asyncio.sleep(0.3)
        assert a.engine is not None and b.engine is None  # b waits: a is pinned
        assert pool.turn(a) is None  # new requests for a wait their turn behind b
        held.release()
        assert await asyncio.wait_for(load_b.get(), 10) is DONE
        assert a.engine is None and b.engine is not None
        assert pool.turn(a) is not None  # nobody waits now
        for worker in workers.values():
            worker.stop(5)
        return a.loads, b.loads

    assert asyncio.run(scenario()) == (1, 1)


def test_a_load_waiting_for_room_gives_up_when_its_client_leaves():
    import asyncio

    from mizuoto.serve.worker import DONE, Job, ModelPool, ModelWorker, Pin

    async def scenario():
        loop = asyncio.get_running_loop()
        pool = ModelPool(max_loaded=1)
        a = ModelWorker("a", "a", load=object, queue_size=4, pool=pool)
        b = ModelWorker("b", "b", load=object, queue_size=4, pool=pool, preload=False)
        for worker in (a, b):
            worker.start()
        await asyncio.to_thread(a.loaded.wait, 60)
        held = Pin(a)
        load_b = Job(lambda engine, job: None, loop)
        b.submit(load_b)
        await asyncio.sleep(0.3)
        load_b.cancel()  # the client went away while b waited for a's room
        assert await asyncio.wait_for(load_b.get(), 10) is DONE
        held.release()
        await asyncio.sleep(0.3)
        for worker in (a, b):
            worker.stop(5)
        return a.engine is not None, b.loads

    assert asyncio.run(scenario()) == (True, 0)


def test_a_model_loading_at_start_counts_against_max_loaded():
    import asyncio

    from mizuoto.serve.worker import DONE, Job, ModelPool, ModelWorker

    async def scenario():
        loop = asyncio.get_running_loop()
        release = threading.Event()
        pool = ModelPool(max_loaded=1)
        a = ModelWorker("a", "a", load=lambda: release.wait(60) and object(), queue_size=4,
                        pool=pool)
        b = ModelWorker("b", "b", load=object, queue_size=4, pool=pool, preload=False)
        for worker in (a, b):
            worker.start()
        load_b = Job(lambda engine, job: None, loop)
        b.submit(load_b)
        await asyncio.sleep(0.3)
        loading_together = b.engine is not None  # b must wait for a's start-up load
        release.set()
        assert await asyncio.wait_for(load_b.get(), 60) is DONE
        for worker in (a, b):
            worker.stop(5)
        return loading_together, a.loads, b.loads, a.engine is None

    assert asyncio.run(scenario()) == (False, 1, 1, True)


def test_a_named_error_from_any_route_is_its_status_and_only_a_500_is_logged(tmp_path):
    import asyncio

    from mizuoto.serve import create_app

    gate = create_app(ServeConfig(models={"m": str(tmp_path / "m")}, voices_dir=tmp_path))

    async def bad_request():
        raise InvalidRequest("thing", "is wrong")

    async def broken():
        raise RuntimeError("a bug")

    async def echo():  # a message echoing text that UTF-8 cannot encode
        raise InvalidRequest("params.\ud800", "is not a known setting")

    gate.app.add_api_route("/v1/echo", echo)
    gate.app.add_api_route("/v1/bad", bad_request)
    gate.app.add_api_route("/v1/broken", broken)
    errors = _Errors()
    loggers = [logging.getLogger(name) for name in ("mizuoto", "uvicorn", "uvicorn.error")]
    for logger in loggers:
        logger.addHandler(errors)

    async def ask(path):
        # raise_app_exceptions: what escapes the application is what uvicorn logs again
        transport = httpx.ASGITransport(app=gate, raise_app_exceptions=True)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.get(path)

    try:
        _error(asyncio.run(ask("/v1/bad")), 400, param="thing")
        _error(asyncio.run(ask("/v1/echo")), 400, param="params.\ud800")
        assert not errors.records
        _error(asyncio.run(ask("/v1/broken")), 500, "internal_error")
        assert len(errors.records) == 1 and errors.records[0].exc_info  # once, with traceback
    finally:
        for logger in loggers:
            logger.removeHandler(errors)


@pytest.mark.parametrize(("body", "said"), [
    (b'{"model": "f5", "model": "f5", "input": "x", "voice": "default"}', "'model' is given twice"),
    (b'{"model": "f5", "input": "x", "voice": "default", "mizuoto": {"steps": 2, "steps": 3}}',
     "'steps' is given twice"),
    (b'{"model": "f5", "input": "\\ud800 hi", "voice": "default"}', "U+D800"),
    (b'{"model": "f5", "input": "x", "voice": "default", "mizuoto": {"params": {"\\udfff": 1}}}',
     "U+DFFF"),
])
def test_duplicate_keys_and_lone_surrogates_are_400(server, body, said):
    response = httpx.post(f"{server}/v1/audio/speech", content=body,
                          headers={"Content-Type": "application/json"})
    assert said in _error(response, 400, "invalid_json")["message"]


# ------------------------------------------------ round 3: slow, idle and malformed connections


@pytest.fixture(scope="module")
def quick(model_dirs, tmp_path_factory):
    """A server whose header deadline and keep-alive are short, so that they are reached."""
    config = ServeConfig(models={"f5": str(model_dirs / "f5")},
                         voices_dir=tmp_path_factory.mktemp("quick-voices"), header_timeout=1.0,
                         keep_alive=1.0)
    with _serving_watched(config) as (url, errors):
        yield url
    assert not errors.records, [r.getMessage() for r in errors.records]


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (30 s at most)."""
    sock.settimeout(30)
    answer = b""
    try:
        while data := sock.recv(65536):
            answer += data
    except (ConnectionResetError, TimeoutError):
        pass
    return answer


def test_a_connection_that_sends_nothing_is_closed(quick):
    with socket.create_connection(_address(quick)) as sock:
        assert _answer(sock) == b""  # closed by the server, no answer: nothing was asked


def test_headers_trickled_a_line_at_a_time_get_408(quick):
    import time

    with socket.create_connection(_address(quick)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for n in range(30):  # 30 x 0.3 s: far past the 1 s deadline unless it is kept
            if select.select([sock], [], [], 0.3)[0]:
                break
            try:
                sock.sendall(f"X-Slow-{n}: {'q' * n}\r\n".encode())
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0)
        answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert b'"request_timeout"' in answer


def test_an_endless_header_stream_gets_431(quick):
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    line = b"X-Filler: " + b"w" * 2000 + b"\r\n"
    status, _, answer = _raw(quick, head, iter(lambda: line, None), limit_bytes=4 << 20)
    assert status == 431, answer[:120]
    assert b"request_header_fields_too_large" in answer


def test_a_keep_alive_connection_serves_its_requests_then_closes_when_idle(quick):
    request = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
    with socket.create_connection(_address(quick)) as sock:
        sock.sendall(request + request)  # pipelined
        answer = _answer(sock)  # then idle: closed after the keep-alive
    assert answer.count(b"HTTP/1.1 200") == 2


def _status(url: str, raw_request: bytes) -> tuple[int, bytes]:
    with socket.create_connection(_address(url)) as sock:
        sock.sendall(raw_request)
        answer = _answer(sock)
    return int(answer.split(b" ", 2)[1]), answer


@pytest.mark.parametrize("headers, code", [
    (b"Host: 127.0.0.1\r\nHost: evil.example\r\n", b"multiple Host"),  # h11 refuses it
    (b"Host: localhost\r\nOrigin: http://localhost\r\norigin: https://evil.example\r\n",
     b"duplicate_header"),
    (b"Host: localhost\r\nContent-Type: application/json\r\nContent-type: text/plain\r\n",
     b"duplicate_header"),
    (b"Host: 127.0.0.1:8000@attacker.test\r\n", b"host_not_allowed"),
    (b"Host: localhost:1@x\r\n", b"host_not_allowed"),
    (b"Host: user@localhost\r\n", b"host_not_allowed"),
    (b"Host: localhost/evil\r\n", b"host_not_allowed"),
])
def test_a_repeated_or_disguised_header_is_refused(quick, headers, code):
    body = b'{"model": "f5", "input": "Hi.", "voice": "default"}'
    status, answer = _status(quick, b"POST /v1/audio/speech HTTP/1.1\r\n" + headers
                             + b"Connection: close\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert status in (400, 403) and code in answer, answer[:300]


def test_a_404_does_not_echo_a_huge_name(quick):
    name = "m" * 200_000
    response = httpx.post(f"{quick}/v1/audio/speech", json={"model": name, "input": "Hi.",
                                                            "voice": "default"})
    error = _error(response, 404, "model_not_found")
    assert len(error["message"]) < 400 and "200,000 characters" in error["message"]


def test_a_client_closing_mid_pipeline_leaves_no_error_in_the_log(quick):
    request = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
    speech = json.dumps(_speech(quick)).encode()
    post = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
            b"application/json\r\nContent-Length: " + str(len(speech)).encode() + b"\r\n\r\n")
    for _ in range(3):
        with socket.create_connection(_address(quick)) as sock:
            sock.sendall(post + speech + request * 3 + post[:30])
            sock.recv(10)  # the answer has begun; the client leaves in the middle
    assert httpx.get(f"{quick}/health").status_code == 200


def test_the_descriptor_limit_is_raised_to_the_hard_limit(monkeypatch, caplog):
    import resource

    from mizuoto.serve.app import raise_descriptor_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda which: (256, hard))
    monkeypatch.setattr(resource, "setrlimit", lambda which, limits: calls.append(limits))
    with caplog.at_level(logging.INFO, logger="mizuoto.serve"):
        raise_descriptor_limit()
    assert calls == [(hard, hard)]
    assert "open files: at most" in caplog.text and "LimitNOFILE" in caplog.text


def test_dropped_control_characters_are_said_in_a_warning_header(quick):
    body = {**_speech(quick), "input": "Hello\x07 there\x1b[0m.\x00"}
    response = httpx.post(f"{quick}/v1/audio/speech", json=body, timeout=60)
    assert response.status_code == 200, response.text[:300]
    warning = response.headers["X-Mizuoto-Warning"]
    assert "input: dropped 3 control character(s)" in warning and "U+0007" in warning


@pytest.mark.parametrize("name", ["nul", "Com3", "LPT9", "aux"])
def test_a_voice_named_as_a_windows_device_is_refused(quick, name):
    error = _error(_upload(quick, _clip(24000, 1, 2), name=name), 400, "invalid_value", "name")
    assert "device name" in error["message"]


def test_voice_names_that_differ_only_in_case_are_one_voice(quick):
    from mizuoto_contract.reference import REFERENCE_TEXT, voiced_signal

    clip = io.BytesIO()
    sf.write(clip, voiced_signal(24000), 24000, format="FLAC")
    made = httpx.post(f"{quick}/v1/audio/voices",
                      data={"name": "Narrator", "model": "f5", "text": REFERENCE_TEXT},
                      files={"audio": ("n.flac", clip.getvalue(), "audio/flac")}, timeout=120)
    assert made.status_code == 201, made.text
    for other in ("narrator", "NARRATOR", "Default"):
        error = _error(_upload(quick, clip.getvalue(), name=other), 409, "voice_exists", "name")
        assert "case" in error["message"]
