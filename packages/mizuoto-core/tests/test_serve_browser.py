"""``mizuoto serve`` against web pages in the user's browser and clients that stall (issue
33): DNS rebinding (a foreign ``Host``), cross-site requests (a foreign ``Origin``,
``text/plain`` or no content type), metric labels per raw path, the stored voices' caps, a
stream its client never reads, and the 413 read by a client still sending. Live servers on
127.0.0.1 (threads) on the example plugin's toy model, offline; raw sockets where a client
would fix the headers up."""

from __future__ import annotations

import io
import json
import socket

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("mizuoto_example")

import soundfile as sf  # noqa: E402

from mizuoto.errors import InvalidRequest  # noqa: E402
from mizuoto.serve import ServeConfig, serve_in_thread  # noqa: E402
from mizuoto.serve.browser import BrowserPolicy  # noqa: E402

# every route: (method, path, content type, body)
SPEECH = json.dumps({"model": "toy", "input": "Hi.", "voice": "default",
                     "response_format": "wav"}).encode()
ROUTES = [("GET", "/", None, b""), ("GET", "/web/studio.js", None, b""),
          ("GET", "/health", None, b""), ("GET", "/metrics", None, b""),
          ("GET", "/v1/models", None, b""), ("GET", "/v1/audio/voices", None, b""),
          ("POST", "/v1/audio/speech", "application/json", SPEECH),
          ("POST", "/v1/audio/voices", "multipart/form-data; boundary=x", b"--x--\r\n"),
          ("DELETE", "/v1/audio/voices/someone", None, b""), ("GET", "/nowhere", None, b"")]


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory):
    from mizuoto_example.engine import write_tiny_model

    root = tmp_path_factory.mktemp("browser-models")
    write_tiny_model(root / "toy")
    return root / "toy"


@pytest.fixture(scope="module")
def server(toy_dir, tmp_path_factory):
    config = ServeConfig(models={"toy": str(toy_dir)}, queue_size=4,
                         voices_dir=tmp_path_factory.mktemp("voices"), max_voices=2)
    with serve_in_thread(config) as url:
        yield url


def _request(url: str, method: str, path: str, headers: dict[str, str],
             body: bytes = b"") -> tuple[int, dict, bytes]:
    """One request as written (no client adds or fixes a header): status, headers, body."""
    port = int(url.rsplit(":", 1)[1])
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in
                                                     headers.items())
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head.encode() + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    top, _, payload = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), fields, payload


def _code(payload: bytes) -> str:
    return json.loads(payload)["error"]["code"]


def _clip() -> bytes:
    buffer = io.BytesIO()
    t = np.arange(16000) / 16000
    sf.write(buffer, (0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 16000,
             format="WAV")
    return buffer.getvalue()


def _upload(url: str, name: str, headers=None):
    return httpx.post(f"{url}/v1/audio/voices", data={"name": name, "model": "toy"},
                      files={"audio": ("clip.wav", _clip(), "audio/wav")}, headers=headers,
                      timeout=60)


# ---------------------------------------------------------------------------- Host


@pytest.mark.parametrize(("method", "path", "kind", "body"), ROUTES)
@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "localhost.evil.example",
                                  "127.0.0.1.nip.io", "", "[::2]"])
def test_a_foreign_host_is_refused_on_every_route(server, method, path, kind, body, host):
    headers = {"Host": host, **({"Content-Type": kind} if kind else {})}
    status, fields, payload = _request(server, method, path, headers, body)
    assert status == 403, payload[:300]
    assert _code(payload) == "host_not_allowed"
    assert fields["content-type"] == "application/json"
    assert b"--allowed-host" in payload


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:8000", "localhost", "LOCALHOST:1",
                                  "[::1]", "[::1]:8000", "127.9.9.9"])
def test_loopback_names_are_answered(server, host):
    status, _, payload = _request(server, "GET", "/v1/models", {"Host": host})
    assert status == 200 and b'"toy"' in payload


def test_a_rebinding_page_can_neither_read_nor_speak_nor_delete(server):
    """A page at evil.example whose name now resolves to 127.0.0.1: its requests are
    same-origin for the browser, so Host and Origin are both its own."""
    _upload(server, "mine")
    page = {"Host": "evil.example:8000", "Origin": "http://evil.example:8000"}
    for method, path, kind, body in ROUTES:
        headers = {**page, **({"Content-Type": kind} if kind else {})}
        status, _, payload = _request(server, method, path, headers, body)
        assert (status, _code(payload)) == (403, "host_not_allowed"), (path, payload[:200])
    delete = {**page, "Host": "evil.example:8000"}
    assert _request(server, "DELETE", "/v1/audio/voices/mine", delete)[0] == 403
    assert "mine" in [v["id"] for v in httpx.get(f"{server}/v1/audio/voices").json()["voices"]]
    assert httpx.delete(f"{server}/v1/audio/voices/mine").status_code == 200


# ---------------------------------------------------------------------------- Origin


@pytest.mark.parametrize("origin", ["https://evil.example", "http://127.0.0.1:1",
                                    "http://localhost", "null", "file://", "chrome-extension://x"])
def test_a_foreign_origin_cannot_delete_speak_or_upload(server, origin):
    _upload(server, "kept")
    try:
        host = server.removeprefix("http://")
        for method, path, kind, body in ROUTES:
            if method == "GET":
                continue
            headers = {"Host": host, "Origin": origin,
                       **({"Content-Type": kind} if kind else {})}
            status, _, payload = _request(server, method, path, headers, body)
            assert (status, _code(payload)) == (403, "origin_not_allowed"), (path, payload)
        status, _, _ = _request(server, "DELETE", "/v1/audio/voices/kept",
                                {"Host": host, "Origin": origin})
        assert status == 403
        upload = _upload(server, "cross", headers={"Origin": origin})
        assert upload.status_code == 403 and upload.json()["error"]["code"] == \
            "origin_not_allowed"
        voices = [v["id"] for v in httpx.get(f"{server}/v1/audio/voices").json()["voices"]]
        assert "kept" in voices and "cross" not in voices
    finally:
        httpx.delete(f"{server}/v1/audio/voices/kept")


def test_the_pages_own_origin_and_no_origin_pass(server):
    host = server.removeprefix("http://")
    for headers in ({}, {"Origin": server}, {"Origin": server.upper()},
                    {"Origin": f"http://{host}/"}):
        status, _, payload = _request(server, "POST", "/v1/audio/speech", {
            "Host": host, "Content-Type": "application/json", **headers}, SPEECH)
        assert status == 200 and b"RIFF" in payload[:16], (headers, payload[:200])


@pytest.mark.parametrize(("kind", "said"), [
    (None, b"no Content-Type"), ("text/plain", b"text/plain"),
    ("text/plain; charset=utf-8", b"text/plain"),
    ("application/x-www-form-urlencoded", b"x-www-form-urlencoded"),
    ("multipart/form-data; boundary=x", b"multipart"), ("application/jsonx", b"jsonx")])
def test_speech_takes_json_only(server, kind, said):
    """What a cross-site form sends without a preflight (text/plain, a form, no type) is
    refused before the body is parsed."""
    headers = {"Host": server.removeprefix("http://"), **({"Content-Type": kind} if kind
                                                          else {})}
    status, _, payload = _request(server, "POST", "/v1/audio/speech", headers, SPEECH)
    assert (status, _code(payload)) == (415, "unsupported_media_type")
    assert said in payload and b"application/json" in payload


@pytest.mark.parametrize("kind", [None, "text/plain", "application/json",
                                  "application/x-www-form-urlencoded"])
def test_the_voice_upload_takes_multipart_only(server, kind):
    headers = {"Host": server.removeprefix("http://"), **({"Content-Type": kind} if kind
                                                          else {})}
    status, _, payload = _request(server, "POST", "/v1/audio/voices", headers,
                                  b"name=x&model=toy")
    assert (status, _code(payload)) == (415, "unsupported_media_type")


def test_named_hosts_and_origins_are_taken_when_allowed(toy_dir, tmp_path):
    config = ServeConfig(models={"toy": str(toy_dir)}, voices_dir=tmp_path,
                         allowed_hosts=["tts.example.com"],
                         allowed_origins=["https://app.example.com"])
    with serve_in_thread(config) as url:
        proxied = {"Host": "tts.example.com", "Content-Type": "application/json"}
        for origin in ({}, {"Origin": "https://tts.example.com"},  # the page via TLS proxy
                       {"Origin": "https://app.example.com"}):
            status, _, payload = _request(url, "POST", "/v1/audio/speech",
                                          {**proxied, **origin}, SPEECH)
            assert status == 200, (origin, payload[:200])
        status, _, payload = _request(url, "POST", "/v1/audio/speech", {
            **proxied, "Origin": "https://other.example.com"}, SPEECH)
        assert (status, _code(payload)) == (403, "origin_not_allowed")
        assert _request(url, "GET", "/v1/models", {"Host": "other.example.com"})[0] == 403


def test_a_server_on_every_interface_answers_its_addresses_but_not_names():
    policy = BrowserPolicy("0.0.0.0")
    assert policy.host_allowed("192.168.1.20:8000") and policy.host_allowed("[fe80::1]")
    assert not policy.host_allowed("evil.example") and not policy.host_allowed(None)
    loopback = BrowserPolicy("127.0.0.1")
    assert not loopback.host_allowed("192.168.1.20") and loopback.host_allowed("127.0.0.1")
    assert BrowserPolicy("127.0.0.1", ["*"]).host_allowed("anything.example")
    assert BrowserPolicy("127.0.0.1", (), ["*"]).origin_allowed("https://x.example", "h")


@pytest.mark.parametrize(("field", "value"), [
    ("allowed_hosts", ["http://tts.example.com"]), ("allowed_hosts", [""]),
    ("allowed_hosts", ["a/b"]), ("allowed_origins", ["tts.example.com"]),
    ("allowed_origins", ["https://x.example/path"]), ("allowed_origins", ["ftp://x"]),
    ("max_voices", 0), ("max_voices_bytes", 0)])
def test_bad_browser_and_voice_settings_are_refused_at_start(field, value):
    with pytest.raises(InvalidRequest) as caught:
        ServeConfig(models={"m": "m"}, **{field: value})
    assert caught.value.field.startswith(field.rstrip("s").removesuffix("_byte"))


# ---------------------------------------------------------------------------- metrics


def test_metric_labels_are_route_templates_whatever_the_paths(server):
    port = int(server.rsplit(":", 1)[1])
    with httpx.Client(base_url=server, timeout=60) as client:
        for index in range(200):  # an <img> tag each, on any page
            client.get(f"/v1/{'x' * 2000}{index}")
            client.delete(f"/v1/audio/voices/nobody{index}")
    text = httpx.get(f"{server}/metrics").text
    lines = [line for line in text.splitlines() if line.startswith("mizuoto_requests_total")]
    endpoints = {line.split('endpoint="')[1].split('"')[0] for line in lines}
    assert endpoints <= {"/v1/audio/speech", "/v1/audio/voices", "/v1/audio/voices/{name}",
                         "/v1/models", "unmatched"}, endpoints
    assert len(text) < 20_000 and "nobody" not in text and port
    assert 'endpoint="unmatched",status="404"} 200' in text
    assert 'endpoint="/v1/audio/voices/{name}",status="404"} 200' in text


# ---------------------------------------------------------------------------- voice caps


def test_stored_voices_are_capped_by_count_and_by_size(server, toy_dir, tmp_path):
    names = ["cap1", "cap2"]  # the server keeps 2
    try:
        for name in names:
            assert _upload(server, name).status_code == 201
        refused = _upload(server, "cap3")
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "too_many_voices" and "--max-voices" in error["message"]
        assert refused.headers["x-should-retry"] == "false"
        assert httpx.delete(f"{server}/v1/audio/voices/cap1").status_code == 200
        assert _upload(server, "cap3").status_code == 201  # room again
        names.append("cap3")
    finally:
        for name in names:
            httpx.delete(f"{server}/v1/audio/voices/{name}")
    config = ServeConfig(models={"toy": str(toy_dir)}, voices_dir=tmp_path,
                         max_voices_bytes=100)
    with serve_in_thread(config) as url:  # a toy voice is 16 bytes of tensors, its file more
        assert _upload(url, "first").status_code == 201
        refused = _upload(url, "second")
        assert refused.status_code == 409 and \
            refused.json()["error"]["code"] == "voices_too_large"
        assert "--max-voices-size" in refused.json()["error"]["message"]
        assert [p.name for p in tmp_path.glob("*.safetensors")] == ["first.safetensors"]


# ---------------------------------------------------------------------------- stalled streams


def test_a_job_holds_at_most_max_buffered_items_for_its_client():
    import asyncio
    import threading

    from mizuoto.serve.worker import MAX_BUFFERED, Job

    def until(condition) -> bool:
        for _ in range(1000):
            if condition():
                return True
            threading.Event().wait(0.01)
        return False

    async def scenario():
        job = Job(lambda engine, job: None, asyncio.get_running_loop())
        emitted = []

        def produce():  # the worker's thread, generating faster than its client reads
            for index in range(MAX_BUFFERED + 5):
                job.emit(index)
                emitted.append(index)

        thread = threading.Thread(target=produce)
        thread.start()
        assert await asyncio.to_thread(until, lambda: len(emitted) == MAX_BUFFERED)
        await asyncio.sleep(0.2)
        assert len(emitted) == MAX_BUFFERED  # it waits for the client
        assert await job.get() == 0
        assert await asyncio.to_thread(until, lambda: len(emitted) == MAX_BUFFERED + 1)
        job.cancel()  # a cancelled job never waits
        await asyncio.to_thread(thread.join, 10)
        assert not thread.is_alive() and len(emitted) == MAX_BUFFERED + 5

    asyncio.run(scenario())


def _stalled_client(url: str, body: bytes) -> socket.socket:
    """A connection that sends ``body`` to the speech route and never reads a byte."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window
    sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                 b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def test_a_stream_its_client_never_reads_is_ended_and_frees_the_model(toy_dir, tmp_path,
                                                                     monkeypatch):
    import logging

    import mizuoto.serve.gate as gate

    monkeypatch.setattr(gate, "STREAM_WRITE_SECONDS", 0.5)
    errors = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = errors.append
    handler.addFilter(gate._QuietStalls())
    loggers = [logging.getLogger(name) for name in ("mizuoto", "uvicorn.error")]
    # 600 s of pcm (29 MB): far more than the sockets' buffers and the job's hold
    long = json.dumps({"model": "toy", "input": "ab " * 200, "voice": "default",
                       "response_format": "pcm", "mizuoto": {
                           "params": {"char_seconds": 1.0, "max_seconds": 600}}}).encode()
    config = ServeConfig(models={"toy": str(toy_dir)}, voices_dir=tmp_path, queue_size=2)
    with serve_in_thread(config) as url:
        for logger in loggers:
            logger.addHandler(handler)
        stalled = [_stalled_client(url, long) for _ in range(2)]
        try:
            # one worker runs the model: this answer comes only once both stalls ended
            after = httpx.post(f"{url}/v1/audio/speech", content=SPEECH, timeout=120,
                               headers={"Content-Type": "application/json"})
            assert after.status_code == 200 and after.content[:4] == b"RIFF"
            metrics = httpx.get(f"{url}/metrics").text
            assert 'mizuoto_cancelled_total{model="toy"} 2' in metrics, metrics
            assert 'mizuoto_queue_depth{model="toy"} 0' in metrics
        finally:
            for sock in stalled:
                sock.close()
            for logger in loggers:
                logger.removeHandler(handler)
    assert not errors, [record.getMessage() for record in errors]


# ---------------------------------------------------------------------------- 413 to a sender


def _send_all_then_read(url: str, head: bytes, body_chunks) -> tuple[bytes, Exception | None]:
    """What most clients do: send the whole body, then read the answer."""
    failed = None
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30) as s:
        try:
            s.sendall(head)
            for chunk in body_chunks:
                s.sendall(chunk)
        except OSError as exc:  # a reset or a broken pipe: the server closed early
            failed = exc
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except OSError as exc:
            failed = failed or exc
    return answer, failed


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_client_still_sending_a_too_large_body_reads_its_413(server, framing):
    size, piece = 12 << 20, 64 << 10  # over the 10 MB upload limit, under the drain bound
    head = (b"POST /v1/audio/voices HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: multipart/form-data; boundary=x\r\n")
    part = (b'--x\r\nContent-Disposition: form-data; name="audio"; filename="a.wav"\r\n'
            b"Content-Type: audio/wav\r\n\r\n")  # one clip, too long: read to the limit
    pieces = [part, *(b"x" * piece for _ in range(size // piece))]
    if framing == "length":
        head += b"Content-Length: %d\r\n\r\n" % sum(map(len, pieces))
        chunks = pieces
    else:
        head += b"Transfer-Encoding: chunked\r\n\r\n"
        chunks = [*(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces), b"0\r\n\r\n"]
    answer, failed = _send_all_then_read(server, head, chunks)
    assert failed is None, failed
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    top, _, payload = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in top.lower()
    assert json.loads(payload)["error"]["code"] == "request_too_large"


def test_past_the_drain_bound_the_connection_closes(server, monkeypatch):
    import mizuoto.serve.gate as gate

    monkeypatch.setattr(gate, "DRAIN_BYTES", 1 << 20)
    head = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            b"application/json\r\nContent-Length: %d\r\n\r\n" % (256 << 20))
    sent = 0

    def chunks():
        nonlocal sent
        for _ in range(4096):
            sent += 64 << 10
            yield b" " * (64 << 10)

    _, failed = _send_all_then_read(server, head, chunks())
    assert failed is not None and sent < (1 << 20) + (24 << 20), sent  # + socket buffers


def test_a_full_disk_is_a_507_not_a_500():
    import errno

    from mizuoto.serve.errors import from_mizuoto

    for number in (errno.ENOSPC, errno.EDQUOT):
        error = from_mizuoto(OSError(number, "No space left on device"))
        assert (error.status, error.code) == (507, "insufficient_storage")
    assert from_mizuoto(OSError(errno.EIO, "I/O error")).status == 500


@pytest.mark.parametrize(("args", "named"), [
    (["--allowed-origin", "app.example.com"], "--allowed-origin"),
    (["--allowed-host", "https://x.example"], "--allowed-host"),
    (["--max-voices", "0"], "--max-voices"), (["--max-voices-size", "lots"], "--max-voices-size"),
    (["--max-voices-size", "0"], "--max-voices-size")])
def test_the_cli_names_a_bad_browser_or_voice_option(toy_dir, args, named):
    from click.testing import CliRunner

    from mizuoto.cli import cli

    result = CliRunner().invoke(cli, ["serve", "-m", str(toy_dir), *args], obj={})
    assert result.exit_code == 2, result.output
    assert f"Error: {named}:" in result.output and "Traceback" not in result.output
