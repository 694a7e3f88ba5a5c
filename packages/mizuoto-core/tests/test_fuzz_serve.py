"""Property test: ``POST /v1/audio/speech`` with arbitrary bodies (a live server on a tiny random
F5-TTS model). Every answer is audio or an OpenAI-shaped error below 500: never a crash."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("mizuoto_f5tts")

from mizuoto.serve import ServeConfig, serve_in_thread  # noqa: E402
from mizuoto_contract.strategies import HOSTILE_NUMBERS, TEXT, mostly  # noqa: E402

# Each example may run the model: a quarter of the profile's examples (ci: 10, fuzz: 200).
SERVER_RUNS = settings(max_examples=max(5, settings.default.max_examples // 4))

# JSON that Python's parser reads: NaN and Infinity included, as json.loads accepts them.
NUMBERS = st.one_of(HOSTILE_NUMBERS, st.floats(), st.integers(), st.none())
# steps is always sent (F5's default 32 on a long text takes a minute on a loaded CPU).
EXTENSION = st.fixed_dictionaries({"steps": mostly(st.integers(1, 2), NUMBERS)}, optional={
    "seed": mostly(st.integers(0, 2**32 - 1), NUMBERS),
    "guidance": mostly(st.floats(0, 10), NUMBERS),
    "params": mostly(st.fixed_dictionaries({}, optional={"speed": st.floats(0.1, 10)}),
                     st.dictionaries(st.sampled_from(["speed", "fix_duration", "nope"]),
                                     NUMBERS, max_size=2)),
    "stream": st.booleans(),
})
BODY = st.fixed_dictionaries(
    {"model": mostly(st.just("f5"), st.text(max_size=8)),
     "input": mostly(TEXT, st.one_of(st.just(""), NUMBERS)),
     "voice": mostly(st.just("default"), st.one_of(st.text(max_size=12), NUMBERS,
                                                    st.fixed_dictionaries({"id": st.text()})))},
    optional={"response_format": st.sampled_from(["wav", "flac", "pcm", "mp3", "opus", "aac",
                                                  "x"]),
              "speed": mostly(st.floats(0.25, 4), NUMBERS),
              "stream_format": st.sampled_from(["audio", "sse", "x"]),
              "instructions": st.one_of(st.none(), TEXT),
              "mizuoto": mostly(EXTENSION, NUMBERS)})
BODY = st.tuples(BODY, EXTENSION).map(lambda pair: {"mizuoto": pair[1], **pair[0]})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from mizuoto_f5tts.fixtures import write_random_model_dir

    root = tmp_path_factory.mktemp("fuzz-serve")
    write_random_model_dir(root / "f5", "v1_base", size="tiny")
    config = ServeConfig(models={"f5": str(root / "f5")}, voices_dir=root / "voices",
                         queue_size=4)
    with serve_in_thread(config) as url:
        yield url


@SERVER_RUNS
@given(body=st.one_of(BODY, st.just("{not json"), st.binary(max_size=20)))
def test_speech_bodies_give_audio_or_an_error_below_500(server, body):
    content = body if isinstance(body, (str, bytes)) else json.dumps(body, allow_nan=True)
    response = httpx.post(f"{server}/v1/audio/speech", content=content, timeout=120,
                          headers={"content-type": "application/json"})
    assert response.status_code < 500, response.text[:500]
    if response.status_code == 200:
        assert response.content, "an empty audio response"
    else:
        assert "error" in response.json(), response.text[:500]


# --- the raw HTTP layer: framing, nesting, uploads with hostile headers -------------------------

# Each example is one request that never reaches the model (or a clip the engine reads only),
# but some send megabytes: a quarter of the profile's examples (ci: 10, fuzz: 200).
RAW_RUNS = settings(max_examples=max(10, settings.default.max_examples // 4))

PATHS = st.sampled_from(["/v1/audio/speech", "/v1/audio/voices", "/v1/models", "/health",
                         "/metrics", "/v1/audio/voices/x", "/nowhere", "//v1/audio/speech",
                         "/v1/audio/speech/", "/v1/audio/speech?x=1", "/%2e%2e/etc"])
CONTENT_TYPES = st.one_of(
    st.sampled_from(["application/json", "application/json; charset=utf-16", "text/plain",
                     "multipart/form-data", "multipart/form-data; boundary=",
                     "multipart/form-data; boundary=\"" + "b" * 2000 + "\"",
                     "application/x-www-form-urlencoded", "application/json; charset=nope",
                     "audio/flac"]),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=80))


def _escaped(key: str, value: str, twice: bool) -> bytes:
    """A speech body with ``value`` (JSON text) as input and ``key`` as a param's name, and
    ``mizuoto`` given twice."""
    again = ', "mizuoto": {}' if twice else ""
    return (f'{{"model": "f5", "input": {value}, "voice": "default", '
            f'"mizuoto": {{"params": {{{key}: 1}}}}{again}}}').encode()


def _nested(depth: int, opener: str) -> bytes:
    closer = {"[": "]", '{"a":': "}"}[opener]
    inner = opener * depth + "1" + closer * depth
    return ('{"model": "f5", "input": "x", "voice": "default", "mizuoto": {"params": '
            '{"nest": ' + inner + "}}}").encode()


BODIES = st.one_of(
    st.binary(max_size=2000),
    st.builds(_nested, st.integers(1, 200_000), st.sampled_from(["[", '{"a":'])),
    st.builds(lambda n: b"[" * n, st.integers(1, 2_000_000)),
    st.builds(lambda n: b'{"seed": ' + b"9" * n + b"}", st.integers(1, 20_000)),
    st.just(b" " * ((1 << 20) + 1)),  # one byte over the speech limit
    # escapes of lone surrogates and repeated keys, anywhere a client's text goes
    st.builds(_escaped,
              st.sampled_from(['"\\ud800"', '"speed"', '"\\udfff\\ud800"', '"a\\u0000"']),
              st.sampled_from(['"x"', '"\\ud83d"', '"\\udc00 x"']), st.booleans()),
)


def _frames(body: bytes, chunked: bool, splits: list[int]) -> tuple[list[bytes], bytes]:
    """The body as sent, and its framing header."""
    if not chunked:
        return [body], b"Content-Length: %d\r\n" % len(body)
    cuts = sorted({min(s, len(body)) for s in splits} | {0, len(body)})
    pieces = [body[a:b] for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
    chunks = [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces]
    return [*chunks, b"0\r\n\r\n"], b"Transfer-Encoding: chunked\r\n"


def _send(url: str, method: str, path: str, headers: list[tuple[str, str]], body: bytes,
          chunked: bool, splits: list[int], host_header: str | None = None) -> bytes:
    import socket

    host, port = url.removeprefix("http://").split(":")
    frames, framing = _frames(body, chunked, splits)
    named = host if host_header is None else host_header
    head = f"{method} {path} HTTP/1.1\r\nHost: {named}\r\nConnection: close\r\n".encode()
    head += b"".join(f"{k}: {v}\r\n".encode() for k, v in headers) + framing + b"\r\n"
    answer = b""
    with socket.create_connection((host, int(port)), timeout=120) as sock:
        try:
            sock.sendall(head)
            for frame in frames:
                sock.sendall(frame)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered early (413) and closed: read what it said
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    return answer


def _check_answer(answer: bytes, url: str) -> None:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    status = int(answer.split(b" ", 2)[1])
    assert status < 500, answer[:500]
    head, _, body = answer.partition(b"\r\n\r\n")
    if status >= 400 and b"application/json" in head.lower():
        assert b'"error"' in body or b'"detail"' in body, answer[:500]
    assert httpx.get(f"{url}/health", timeout=30).status_code == 200  # still serving


@RAW_RUNS
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
       path=PATHS, content_type=CONTENT_TYPES, body=BODIES, chunked=st.booleans(),
       splits=st.lists(st.integers(0, 1 << 21), max_size=8))
def test_raw_requests_never_crash_the_server(server, method, path, content_type, body,
                                             chunked, splits):
    answer = _send(server, method, path, [("Content-Type", content_type)], body, chunked,
                   splits)
    _check_answer(answer, server)


def _wav_header(rate: int, channels: int, bits: int, data_size: int, payload: bytes) -> bytes:
    import struct

    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", 1, channels, rate, (rate * block) & 0xFFFFFFFF, block & 0xFFFF,
                      bits)
    return (b"RIFF" + struct.pack("<I", (36 + data_size) & 0xFFFFFFFF) + b"WAVEfmt "
            + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", data_size) + payload)


def _flac_header(rate: int, channels: int, bits: int, frames: int) -> bytes:
    """A FLAC stream with only its STREAMINFO block: the header's claims, no audio."""
    info = (4096 << 64) | (4096 << 48)  # block sizes (frame sizes 0: unknown)
    info = (info << 20 | rate) << 3 | (channels - 1)
    info = ((info << 5 | (bits - 1)) << 36) | frames
    streaminfo = info.to_bytes(18, "big") + bytes(16)  # + an MD5 of zeros
    return b"fLaC" + bytes([0x80, 0, 0, 34]) + streaminfo


CLIPS = st.one_of(
    st.builds(_wav_header, st.integers(0, 10**7), st.integers(0, 300),
              st.sampled_from([8, 16, 24, 32]), st.integers(0, 2**32 - 1),
              st.binary(max_size=4000)),
    st.builds(_flac_header, st.integers(1, 655_350), st.integers(1, 8), st.integers(4, 32),
              st.integers(0, 2**36 - 1)),
    st.binary(max_size=4000),
)
FIELD_TEXT = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126,
                                            exclude_characters='"\\'), max_size=40)


@RAW_RUNS
@given(clip=CLIPS, filename=st.one_of(FIELD_TEXT, st.sampled_from(
           ["../../etc/passwd", "a" * 5000, "clip.flac", "x\u202e.wav"])),
       part_type=CONTENT_TYPES, name=st.one_of(st.just("fz"), FIELD_TEXT),
       extra_fields=st.lists(st.sampled_from(["name", "model", "text", "audio", "junk"]),
                             max_size=3),
       chunked=st.booleans(), splits=st.lists(st.integers(0, 9000), max_size=4))
def test_voice_uploads_with_hostile_parts_never_crash_the_server(
        server, clip, filename, part_type, name, extra_fields, chunked, splits):
    boundary = "fuzz-boundary-7"
    parts = [("name", None, None, name.encode()), ("model", None, None, b"f5"),
             ("text", None, None, b"Some words.")]
    parts += [(field, None, None, b"again") for field in extra_fields]
    parts.append(("audio", filename, part_type, clip))
    body = b""
    for field, file, kind, value in parts:
        disposition = f'form-data; name="{field}"'
        if file is not None:
            disposition += f'; filename="{file}"'
        body += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n".encode()
        if kind is not None:
            body += f"Content-Type: {kind}\r\n".encode()
        body += b"\r\n" + value + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    answer = _send(server, "POST", "/v1/audio/voices",
                   [("Content-Type", f"multipart/form-data; boundary={boundary}")], body,
                   chunked, splits)
    _check_answer(answer, server)
    if answer.split(b" ", 2)[1] == b"201":  # a voice was built: leave room for the next
        httpx.delete(f"{server}/v1/audio/voices/{name}", timeout=30)


# --- Host and Origin: answered exactly as the browser policy says (issue 33) -----------------

HOST_TEXT = st.text(alphabet="abcdefxyz0123456789.-:[]_@", max_size=40)
HOSTS = st.one_of(HOST_TEXT, st.sampled_from(
    ["127.0.0.1", "localhost", "[::1]:80", "127.0.0.1.evil.example", "localhost:x", "[::1",
     "0.0.0.0", "[::ffff:127.0.0.1]", "2130706433", "127.1", "LocalHost."]))
ORIGINS = st.one_of(st.none(), st.just("null"),
                    st.builds(lambda scheme, host: f"{scheme}://{host}",
                              st.sampled_from(["http", "https", "ftp"]), HOSTS))


@RAW_RUNS
@given(host=HOSTS, origin=ORIGINS, method=st.sampled_from(["GET", "POST", "DELETE"]))
def test_hosts_and_origins_are_refused_exactly_as_the_policy_says(server, host, origin, method):
    from mizuoto.serve.browser import BrowserPolicy

    policy = BrowserPolicy("127.0.0.1")
    path = {"GET": "/v1/models", "POST": "/v1/audio/speech",
            "DELETE": "/v1/audio/voices/nobody"}[method]
    headers = [("Content-Type", "application/json")] + ([("Origin", origin)] if origin else [])
    answer = _send(server, method, path, headers,
                   b'{"model": "nope", "input": "x", "voice": "default"}', False, [],
                   host_header=host)
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    status = int(answer.split(b" ", 2)[1])
    if not policy.host_allowed(host):
        expected = b"host_not_allowed"
    elif method != "GET" and not policy.origin_allowed(origin, host):
        expected = b"origin_not_allowed"
    else:
        expected = None
    if expected is None:
        assert status in (200, 404), answer[:300]
    else:
        assert status == 403 and expected in answer, answer[:300]
