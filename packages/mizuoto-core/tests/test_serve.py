"""``mizuoto serve`` against the official ``openai`` client: a live server on 127.0.0.1 (a free
port, in a thread) with tiny random-init F5-TTS and VoxCPM2 models, offline.

Every audio response is compared with the engine run in this process on the same request:
16-bit formats must hold exactly the engine's samples, quantized (``to_int16``).
"""

from __future__ import annotations

import base64
import io
import json
import time

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("mizuoto_f5tts")
pytest.importorskip("mizuoto_voxcpm")

import soundfile as sf  # noqa: E402

import mizuoto  # noqa: E402
from mizuoto import Audio, Reference, SynthesisRequest  # noqa: E402
from mizuoto.audio_encoding import to_int16  # noqa: E402
from mizuoto.serve import ServeConfig, serve_in_thread  # noqa: E402

TEXT = "Hello from the server."
F5 = {"steps": 2}  # a tiny F5 model at two sampling steps: a fraction of a second
VOX = {"steps": 2, "params": {"max_len": 3}}  # three patches of VoxCPM2


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from mizuoto_f5tts.fixtures import write_random_model_dir
    from mizuoto_voxcpm.fixtures import write_random_model

    root = tmp_path_factory.mktemp("serve-models")
    write_random_model_dir(root / "f5", "v1_base", size="tiny")
    write_random_model(root / "vox", "voxcpm2", dtype="float32")
    return root


@pytest.fixture(scope="module")
def engines(model_dirs):
    """The same models, loaded here: what the server's answers are compared with."""
    return {"f5": mizuoto.load(model_dirs / "f5"), "vox": mizuoto.load(model_dirs / "vox")}


@pytest.fixture(scope="module")
def server(model_dirs, tmp_path_factory):
    config = ServeConfig(models={"f5": str(model_dirs / "f5"), "vox": str(model_dirs / "vox")},
                         voices_dir=tmp_path_factory.mktemp("voices"), queue_size=4)
    with serve_in_thread(config) as url:
        yield url


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def _expected(engine, extension, *, stream, text=TEXT, **fields) -> torch.Tensor:
    request = SynthesisRequest(text, seed=extension["seed"], steps=extension.get("steps"),
                               params=extension.get("params", {}), **fields)
    if stream:
        return torch.cat([c.audio.samples for c in engine.stream(request)])
    return engine.synthesize(request).audio.samples


def _int16(data: bytes) -> np.ndarray:
    samples, _ = sf.read(io.BytesIO(data), dtype="int16")
    return samples


@pytest.mark.parametrize("response_format", ["wav", "flac", "pcm", "mp3", "opus", "aac"])
def test_every_format_holds_the_engines_audio(client, engines, response_format):
    extension = {**F5, "seed": 11, "stream": False}
    response = client.audio.speech.create(model="f5", input=TEXT, voice="default",
                                          response_format=response_format,
                                          extra_body={"mizuoto": extension})
    expected = _expected(engines["f5"], extension, stream=False).numpy()
    data = response.content
    assert response.response.headers["x-mizuoto-seed"] == "11"
    # not streamed: a whole file, its length known
    assert int(response.response.headers["content-length"]) == len(data)
    if response_format == "pcm":
        assert np.array_equal(np.frombuffer(data, "<i2"), to_int16(expected))
    elif response_format in ("wav", "flac"):
        assert np.array_equal(_int16(data), to_int16(expected))
    elif response_format == "aac":  # ADTS: libsndfile cannot read it, FFmpeg (PyAV) can
        import av

        with av.open(io.BytesIO(data)) as container:
            assert container.streams.audio[0].rate == 24000
            frames = sum(frame.samples for frame in container.decode(audio=0))
        assert abs(frames - expected.size) <= 2400  # encoder priming and the last frame
    else:  # lossy: a decodable file of the right rate and length
        info = sf.info(io.BytesIO(data))
        assert info.samplerate == 24000
        assert abs(info.frames - expected.size) <= 2400


def test_chunked_stream_is_the_concatenated_engine_stream(client, engines):
    extension = {**VOX, "seed": 5}
    with client.audio.speech.with_streaming_response.create(
            model="vox", input=TEXT, voice="default", response_format="wav",
            extra_body={"mizuoto": extension}) as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        data = b"".join(response.iter_bytes())
    expected = _expected(engines["vox"], extension, stream=True).numpy()
    assert np.array_equal(_int16(data), to_int16(expected))


def test_whole_response_is_engine_synthesize(client, engines):
    extension = {**VOX, "seed": 5, "stream": False}
    response = client.audio.speech.create(model="vox", input=TEXT, voice={"id": "default"},
                                          response_format="flac",
                                          extra_body={"mizuoto": extension})
    expected = _expected(engines["vox"], extension, stream=False).numpy()
    assert np.array_equal(_int16(response.content), to_int16(expected))


def test_streamed_mp3_and_opus_decode_to_the_streams_length(client, engines):
    extension = {**VOX, "seed": 3}
    expected = _expected(engines["vox"], extension, stream=True)
    for response_format in ("mp3", "opus"):
        with client.audio.speech.with_streaming_response.create(
                model="vox", input=TEXT, voice="default", response_format=response_format,
                extra_body={"mizuoto": extension}) as response:
            data = b"".join(response.iter_bytes())
        info = sf.info(io.BytesIO(data))
        assert info.samplerate == 48000
        assert abs(info.frames - expected.numel()) <= 2400


def test_sse_events_carry_the_stream(client, engines):
    extension = {**VOX, "seed": 9}
    with client.audio.speech.with_streaming_response.create(
            model="vox", input=TEXT, voice="default", response_format="pcm",
            stream_format="sse", extra_body={"mizuoto": extension}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines()
                  if line.startswith("data: ")]
    assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"}
    assert events[-1]["type"] == "speech.audio.done"
    assert set(events[-1]["usage"]) == {"input_tokens", "output_tokens", "total_tokens"}
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    plain = client.audio.speech.create(model="vox", input=TEXT, voice="default",
                                       response_format="pcm",
                                       extra_body={"mizuoto": extension}).content
    assert pcm == plain
    # pcm is 24 kHz: VoxCPM2's 48 kHz stream, resampled
    expected = _expected(engines["vox"], extension, stream=True)
    assert len(pcm) // 2 == expected.numel() // 2


def test_speed_is_the_engines_speed_or_refused(client, engines):
    extension = {**F5, "seed": 2}
    response = client.audio.speech.create(model="f5", input=TEXT, voice="default", speed=2.0,
                                          response_format="wav",
                                          extra_body={"mizuoto": extension})
    expected = _expected(engines["f5"], {**extension, "params": {"speed": 2.0}}, stream=False)
    assert np.array_equal(_int16(response.content), to_int16(expected.numpy()))
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(model="vox", input=TEXT, voice="default", speed=2.0,
                                   extra_body={"mizuoto": VOX})
    assert caught.value.body["param"] == "speed"
    assert caught.value.body["code"] == "unsupported_value"


def test_instructions_design_the_voice_or_are_ignored_with_a_warning(client, engines):
    extension = {**F5, "seed": 4}
    response = client.audio.speech.create(model="f5", input=TEXT, voice="default",
                                          instructions="a calm voice", response_format="wav",
                                          extra_body={"mizuoto": extension})
    assert "instructions ignored" in response.response.headers["x-mizuoto-warning"]
    expected = _expected(engines["f5"], extension, stream=False)
    assert np.array_equal(_int16(response.content), to_int16(expected.numpy()))
    extension = {**VOX, "seed": 4}
    response = client.audio.speech.create(model="vox", input=TEXT, voice="default",
                                          instructions="a calm voice", response_format="wav",
                                          extra_body={"mizuoto": extension})
    assert "x-mizuoto-warning" not in response.response.headers
    expected = _expected(engines["vox"], extension, stream=True, instruction="a calm voice")
    assert np.array_equal(_int16(response.content), to_int16(expected.numpy()))


def test_characters_the_model_drops_are_named_in_the_warning_header(client):
    # the tiny F5 vocabulary lacks the Arabic alif: the engine says so in applied.warnings,
    # and a whole (not streamed) response carries it in its header, escaped to ASCII
    response = client.audio.speech.create(model="f5", input="Say \u0645\u0631\u062d\u0628\u0627 now.",
                                          voice="default", response_format="wav",
                                          extra_body={"mizuoto": {**F5, "seed": 4}})
    header = response.response.headers["x-mizuoto-warning"]
    assert "not in the model's vocabulary" in header and "\\u0627" in header


@pytest.mark.parametrize("fields, error, param, code", [
    ({"model": "nope"}, openai.NotFoundError, "model", "model_not_found"),
    ({"voice": "nobody"}, openai.NotFoundError, "voice", "voice_not_found"),
    ({"voice": {"id": "nobody"}}, openai.NotFoundError, "voice", "voice_not_found"),
    ({"voice": "../../etc/passwd"}, openai.BadRequestError, "voice", "invalid_value"),
    ({"response_format": "ogg"}, openai.BadRequestError, "response_format", "invalid_value"),
    ({"speed": 5.0}, openai.BadRequestError, "speed", "invalid_value"),
    ({"input": "a" * 4097}, openai.BadRequestError, "input", "string_above_max_length"),
    ({"input": "   "}, openai.BadRequestError, "input", "invalid_value"),
    ({"extra_body": {"colour": "blue"}}, openai.BadRequestError, "colour", "unknown_parameter"),
    ({"extra_body": {"mizuoto": {"params": {"bogus": 1}}}}, openai.BadRequestError,
     "mizuoto.params.bogus", "invalid_value"),
    ({"extra_body": {"mizuoto": {"seed": -1}}}, openai.BadRequestError, "mizuoto.seed",
     "invalid_value"),
])
def test_errors_come_in_openais_shape(client, fields, error, param, code):
    request = {"model": "f5", "input": TEXT, "voice": "default", **fields}
    with pytest.raises(error) as caught:
        client.audio.speech.create(**request)
    body = caught.value.body
    assert set(body) == {"message", "type", "param", "code"}
    assert (body["param"], body["code"]) == (param, code)


def _clip_wav() -> bytes:
    from mizuoto_contract.reference import REFERENCE_TEXT, voiced_signal  # noqa: F401

    buffer = io.BytesIO()
    sf.write(buffer, voiced_signal(24000), 24000, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def test_named_voices_are_built_listed_used_and_deleted(client, server, engines):
    from mizuoto_contract.reference import REFERENCE_TEXT

    clip = _clip_wav()
    created = httpx.post(f"{server}/v1/audio/voices",
                         data={"name": "reader", "model": "f5", "text": REFERENCE_TEXT},
                         files={"audio": ("reader.wav", clip, "audio/wav")})
    assert created.status_code == 201, created.text
    again = httpx.post(f"{server}/v1/audio/voices",
                       data={"name": "reader", "model": "f5", "text": REFERENCE_TEXT},
                       files={"audio": ("reader.wav", clip, "audio/wav")})
    assert again.status_code == 409
    bad = httpx.post(f"{server}/v1/audio/voices",
                     data={"name": "../escape", "model": "f5", "text": REFERENCE_TEXT},
                     files={"audio": ("x.wav", clip, "audio/wav")})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "name"
    voices = httpx.get(f"{server}/v1/audio/voices").json()["voices"]
    assert [v["id"] for v in voices] == ["default", "reader"]
    assert [v["id"] for v in httpx.get(f"{server}/v1/audio/voices",
                                       params={"model": "vox"}).json()["voices"]] == ["default"]

    extension = {**F5, "seed": 6}
    response = client.audio.speech.create(model="f5", input=TEXT, voice="reader",
                                          response_format="wav",
                                          extra_body={"mizuoto": extension})
    samples, rate = sf.read(io.BytesIO(clip), dtype="float32")
    voice = engines["f5"].build_voice(Reference(Audio(samples, rate), REFERENCE_TEXT))
    expected = _expected(engines["f5"], extension, stream=False, voice=voice)
    assert np.array_equal(_int16(response.content), to_int16(expected.numpy()))
    with pytest.raises(openai.BadRequestError) as caught:  # built for another model
        client.audio.speech.create(model="vox", input=TEXT, voice="reader",
                                   extra_body={"mizuoto": VOX})
    assert caught.value.body["code"] == "voice_mismatch"

    assert httpx.delete(f"{server}/v1/audio/voices/reader").status_code == 200
    assert httpx.delete(f"{server}/v1/audio/voices/reader").status_code == 404
    with pytest.raises(openai.NotFoundError):
        client.audio.speech.create(model="f5", input=TEXT, voice="reader")


def test_models_health_and_metrics(client, server):
    assert sorted(m.id for m in client.models.list()) == ["f5", "vox"]
    health = httpx.get(f"{server}/health")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "models": {"f5": "ready", "vox": "ready"}}
    client.audio.speech.create(model="f5", input=TEXT, voice="default",
                               extra_body={"mizuoto": F5})
    text = httpx.get(f"{server}/metrics").text
    assert 'mizuoto_requests_total{model="f5",endpoint="/v1/audio/speech",status="200"}' in text
    assert 'mizuoto_queue_depth{model="vox"} 0' in text
    assert 'mizuoto_time_to_first_audio_seconds_count{model="f5"}' in text
    assert 'mizuoto_real_time_factor_count{model="f5"}' in text


def _cancelled(server) -> float:
    for line in httpx.get(f"{server}/metrics").text.splitlines():
        if line.startswith('mizuoto_cancelled_total{model="vox"}'):
            return float(line.split()[-1])
    return 0.0


def test_a_client_that_leaves_cancels_its_generation(client, server):
    # 400 patches (about 20 s of work on the tiny model) unless cancelled
    long = {"steps": 2, "seed": 1,
            "params": {"max_len": 400, "retry_badcase_ratio_threshold": 100.0}}
    before = _cancelled(server)
    with client.audio.speech.with_streaming_response.create(
            model="vox", input=TEXT, voice="default", response_format="pcm",
            extra_body={"mizuoto": long}) as response:
        next(response.iter_bytes())
    deadline = time.monotonic() + 10
    while _cancelled(server) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _cancelled(server) == before + 1
    started = time.monotonic()  # the model is free again at once
    client.audio.speech.create(model="vox", input=TEXT, voice="default",
                               extra_body={"mizuoto": VOX})
    assert time.monotonic() - started < 5


def test_api_key_is_required_when_set(model_dirs, tmp_path):
    config = ServeConfig(models={"f5": str(model_dirs / "f5")}, api_key="sesame",
                         voices_dir=tmp_path)
    with serve_in_thread(config) as url:
        wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="guess", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as caught:
            wrong.models.list()
        assert caught.value.body["code"] == "invalid_api_key"
        assert httpx.get(f"{url}/health").status_code == 200
        right = openai.OpenAI(base_url=f"{url}/v1", api_key="sesame", max_retries=0)
        assert [m.id for m in right.models.list()] == ["f5"]


def test_bodies_and_uploads_over_the_limits_are_refused(server):
    big = httpx.post(f"{server}/v1/audio/speech", content=b" " * ((1 << 20) + 1),
                     headers={"Content-Type": "application/json"})
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    buffer = io.BytesIO()
    sf.write(buffer, np.full(8000 * 61, 0.1, np.float32), 8000, format="WAV", subtype="PCM_16")
    long = httpx.post(f"{server}/v1/audio/voices", data={"name": "long", "model": "f5"},
                      files={"audio": ("long.wav", buffer.getvalue(), "audio/wav")})
    assert long.status_code == 413 and long.json()["error"]["code"] == "audio_too_long"


def test_with_one_model_loaded_at_a_time_a_reloaded_model_speaks_the_same(model_dirs, engines,
                                                                          tmp_path):
    config = ServeConfig(models={"f5": str(model_dirs / "f5"), "vox": str(model_dirs / "vox")},
                         voices_dir=tmp_path, max_loaded=1)
    with serve_in_thread(config) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        assert httpx.get(f"{url}/health").json()["models"] == {"f5": "ready",
                                                               "vox": "unloaded"}
        for model, extension in (("f5", F5), ("vox", VOX), ("f5", F5)):
            extension = {**extension, "seed": 8}
            response = client.audio.speech.create(model=model, input=TEXT, voice="default",
                                                  response_format="wav",
                                                  extra_body={"mizuoto": extension})
            expected = _expected(engines[model], extension, stream=model == "vox")
            assert np.array_equal(_int16(response.content), to_int16(expected.numpy()))
        states = httpx.get(f"{url}/health").json()["models"]
        assert states == {"f5": "ready", "vox": "unloaded"}
