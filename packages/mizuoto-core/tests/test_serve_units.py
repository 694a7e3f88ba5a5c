"""The server's parts without a model: encoders, the worker's queue, voice names, errors,
metrics and model naming."""

from __future__ import annotations

import asyncio
import io
import threading

import numpy as np
import pytest

pytest.importorskip("fastapi")

import soundfile as sf

from mizuoto import errors
from mizuoto.audio_encoders import _mp3_frame_length
from mizuoto.audio_encoding import StreamEncoder, encode, output_rate, to_int16
from mizuoto.serve.app import model_names
from mizuoto.serve.errors import APIError, from_mizuoto
from mizuoto.serve.metrics import Metrics
from mizuoto.serve.voices import VoiceStore, check_name
from mizuoto.serve.worker import DONE, Job, ModelWorker

NOISE = (np.random.default_rng(0).standard_normal(48000) * 0.3).astype(np.float32)


def _streamed(response_format: str, rate: int) -> list[bytes]:
    encoder = StreamEncoder(response_format, rate)
    pieces = [encoder.feed(NOISE[i:i + 4800]) for i in range(0, NOISE.size, 4800)]
    return [*pieces, encoder.close()]


@pytest.mark.parametrize("response_format", ["wav", "flac"])
def test_lossless_files_hold_the_quantized_samples(response_format):
    samples, rate = sf.read(io.BytesIO(encode(NOISE, 24000, response_format)), dtype="int16")
    assert rate == 24000 and np.array_equal(samples, to_int16(NOISE))


def test_to_int16_clips_and_rounds():
    assert to_int16(np.array([-2.0, -1.0, 0.0, 0.5, 1.0, 3.0], np.float32)).tolist() == \
        [-32767, -32767, 0, 16384, 32767, 32767]


def test_streamed_wav_and_pcm_arrive_chunk_by_chunk():
    wav = _streamed("wav", 24000)
    assert all(wav[:-1]) and wav[0][:4] == b"RIFF"
    samples, _ = sf.read(io.BytesIO(b"".join(wav)), dtype="int16")
    assert np.array_equal(samples, to_int16(NOISE))
    assert b"".join(_streamed("pcm", 24000)) == encode(NOISE, 24000, "pcm")


def test_streamed_flac_comes_whole_at_the_end():
    pieces = _streamed("flac", 24000)
    assert not any(pieces[:-1]) and pieces[-1] == encode(NOISE, 24000, "flac")


def test_streamed_mp3_is_the_file_without_its_info_frame():
    whole, streamed = encode(NOISE, 24000, "mp3"), b"".join(_streamed("mp3", 24000))
    assert whole[_mp3_frame_length(whole[:4]):] == streamed


def test_pcm_is_24_khz_and_opus_gets_a_rate_it_accepts():
    assert output_rate("pcm", 48000) == 24000
    assert output_rate("opus", 44100) == 48000 and output_rate("opus", 24000) == 24000
    assert len(encode(NOISE, 48000, "pcm")) == NOISE.size  # half the samples, two bytes each
    assert sf.info(io.BytesIO(encode(NOISE, 44100, "opus"))).samplerate == 48000


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".hidden", "", "x" * 65, "a b", "é"])
def test_voice_names_cannot_leave_the_directory(tmp_path, name):
    with pytest.raises(APIError) as caught:
        VoiceStore(tmp_path).path(name)
    assert caught.value.status == 400


def test_voice_store_lists_only_voice_files(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "broken.safetensors").write_bytes(b"not a voice")
    assert VoiceStore(tmp_path).list() == []
    assert check_name("Reader_2-b") == "Reader_2-b"


@pytest.mark.parametrize("exc, status, param, code", [
    (errors.InvalidRequest("text", "is empty"), 400, "input", "invalid_value"),
    (errors.InvalidRequest("params.speed", "too fast"), 400, "mizuoto.params.speed",
     "invalid_value"),
    (errors.VoiceMismatch("other model"), 400, "voice", "voice_mismatch"),
    (errors.UnsupportedCapability("no streaming"), 400, None, "unsupported"),
    (errors.ModelNotFound("nope"), 404, "model", "model_not_found"),
    (errors.ModelFilesMissing("/m", ["vocab.txt"]), 503, None, "model_unavailable"),
    (errors.NonFiniteAudio("vocoder", 1, 0, 10), 500, None, "generation_failed"),
    (RuntimeError("boom"), 500, None, "internal_error"),
])
def test_mizuoto_errors_map_to_statuses(exc, status, param, code):
    error = from_mizuoto(exc, param_prefix="mizuoto.")
    assert (error.status, error.param, error.code) == (status, param, code)
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}


def test_model_names_from_directories_ids_and_aliases(tmp_path):
    (tmp_path / "my-model").mkdir()
    names = model_names([str(tmp_path / "my-model"), "f5tts/v1-base"],
                        [f"tts-1={tmp_path / 'my-model'}"])
    assert names == {"my-model": str(tmp_path / "my-model"), "f5tts/v1-base": "f5tts/v1-base",
                     "tts-1": str(tmp_path / "my-model")}
    with pytest.raises(errors.InvalidRequest):
        model_names([], ["no-equals-sign"])
    with pytest.raises(errors.InvalidRequest):
        model_names([], [])


def test_metrics_render_prometheus_text():
    metrics = Metrics()
    metrics.watch_queue("m", lambda: 2)
    metrics.request("m", "/v1/audio/speech", 200)
    metrics.first_audio("m", 0.3)
    metrics.generated("m", 1.0, 4.0)
    text = metrics.render()
    assert 'mizuoto_requests_total{model="m",endpoint="/v1/audio/speech",status="200"} 1' in text
    assert 'mizuoto_queue_depth{model="m"} 2' in text
    assert 'mizuoto_time_to_first_audio_seconds_bucket{model="m",le="0.5"} 1' in text
    assert 'mizuoto_real_time_factor_sum{model="m"} 0.25' in text


def test_a_full_queue_answers_429_and_a_cancelled_job_is_skipped():
    async def scenario():
        loop = asyncio.get_running_loop()
        release = threading.Event()
        ran = []

        def blocking(engine, job):
            release.wait(10)
            ran.append("first")

        def second(engine, job):
            ran.append("second")

        worker = ModelWorker("m", "m", load=lambda: object(), queue_size=1)
        worker.start()
        await asyncio.to_thread(worker.loaded.wait, 60)  # the first torch import: slow
        first = Job(blocking, loop)
        worker.submit(first)
        while worker.depth() != 1 or worker._queue.qsize():  # the first one is running
            await asyncio.sleep(0.01)
        queued = Job(second, loop)
        worker.submit(queued)
        with pytest.raises(APIError) as caught:
            worker.submit(Job(second, loop))
        assert caught.value.status == 429 and caught.value.headers["Retry-After"]
        queued.cancel()
        release.set()
        assert await asyncio.wait_for(first.get(), 10) is DONE
        assert await asyncio.wait_for(queued.get(), 10) is DONE
        worker.stop(5)
        return ran

    assert asyncio.run(scenario()) == ["first"]


def test_a_model_that_fails_to_load_answers_503():
    def fail():
        raise errors.ModelFilesMissing("/m", ["vocab.txt"])

    worker = ModelWorker("m", "/m", load=fail, queue_size=1)
    worker.start()
    worker.loaded.wait(10)
    with pytest.raises(APIError) as caught:
        worker.submit_check()
    assert caught.value.status == 503 and "vocab.txt" in caught.value.message


@pytest.mark.parametrize("exc", [
    errors.ModelFilesMissing("/srv/secret-dir/model-x", ["vocab.txt"]),
    errors.CheckpointMismatch("/srv/secret-dir/model-x/model.safetensors", shapes=["a: (1,)"]),
    errors.InvalidAudio("reference.audio", "/tmp/secret-dir/up.wav is unreadable"),
    errors.NonFiniteAudio("C:\\secret-dir\\vocoder", 1, 0, 10),
])
def test_error_responses_name_files_not_where_the_server_keeps_them(exc):
    """A model that fails to load, or any engine error, tells the client which file, never
    the server's directories (the log keeps the whole message)."""
    message = from_mizuoto(exc).message
    assert "secret-dir" not in message and "/srv" not in message and "/tmp" not in message
    assert any(name in message for name in ("vocab.txt", "model.safetensors", "up.wav",
                                            "vocoder")), message

    def fail():
        raise exc

    worker = ModelWorker("m", "/srv/secret-dir/model-x", load=fail, queue_size=1)
    worker.start()
    worker.loaded.wait(10)
    with pytest.raises(APIError) as caught:
        worker.submit_check()
    assert "secret-dir" not in caught.value.message and "failed to load" in caught.value.message


class _Weights:
    """An engine holding ``megabytes`` of float32 weights."""

    name = "fake"

    def __init__(self, megabytes: float) -> None:
        import torch

        self.model = torch.nn.Linear(1, int(megabytes * (1 << 20) / 4), bias=False)


def _pool_run(pool_kwargs, sizes, order):
    """Run one job per name in ``order`` on workers sharing a pool; the loaded set after each,
    and each worker's load count."""
    from mizuoto.serve.worker import ModelPool

    async def scenario():
        loop = asyncio.get_running_loop()
        pool = ModelPool(**pool_kwargs)
        workers = {name: ModelWorker(name, name, load=lambda mb=mb: _Weights(mb), queue_size=2,
                                     pool=pool, preload=False)
                   for name, mb in sizes.items()}
        for worker in workers.values():
            worker.start()
        loaded = []
        for name in order:
            job = Job(lambda engine, job: None, loop)
            workers[name].submit(job)
            assert await asyncio.wait_for(job.get(), 10) is DONE
            deadline = loop.time() + 10
            while (pool._over() or any(w.depth() or w._engine_lock.locked()
                                       for w in workers.values())) and loop.time() < deadline:
                await asyncio.sleep(0.005)  # every worker idle, the limits hold: settled
            loaded.append(sorted(n for n, w in workers.items() if w.engine is not None))
        for worker in workers.values():
            worker.stop(5)
        return loaded, {name: w.loads for name, w in workers.items()}

    return asyncio.run(scenario())


def test_the_pool_keeps_at_most_max_loaded_models_least_recently_used_out():
    loaded, loads = _pool_run({"max_loaded": 2}, {"a": 0.1, "b": 0.1, "c": 0.1},
                              ["a", "b", "a", "c", "b"])
    assert loaded == [["a"], ["a", "b"], ["a", "b"], ["a", "c"], ["b", "c"]]
    assert loads == {"a": 1, "b": 2, "c": 1}


def test_the_pool_keeps_weights_within_the_memory_budget():
    loaded, _ = _pool_run({"memory_budget": 3 << 20}, {"a": 1, "b": 1, "c": 2},
                          ["a", "b", "c", "a"])
    assert loaded == [["a"], ["a", "b"], ["b", "c"], ["a", "c"]]


def test_memory_budget_sizes():
    from mizuoto.commands.serve import _size

    assert _size("8G") == 8 << 30 and _size("500MB") == 500 << 20 and _size("1024") == 1024
    for bad in ("lots", "0", "-1G", "inf"):
        with pytest.raises(errors.InvalidRequest):
            _size(bad)


def test_aac_streams_in_adts_frames_that_join_into_the_whole_file():
    import io

    import av
    import numpy as np

    from mizuoto.audio_encoding import StreamEncoder, encode

    samples = (0.1 * np.sin(np.arange(48000) / 10)).astype(np.float32)
    whole = encode(samples, 24000, "aac")
    encoder = StreamEncoder("aac", 24000)
    parts = [encoder.feed(samples[:12000]), encoder.feed(samples[12000:]), encoder.close()]
    assert parts[0] and b"".join(parts) == whole  # bytes before the end: streamable
    assert whole[:2] == b"\xff\xf1"  # an ADTS sync word: MPEG-4 AAC, no CRC
    with av.open(io.BytesIO(whole)) as container:
        decoded = sum(frame.samples for frame in container.decode(audio=0))
    assert abs(decoded - samples.size) <= 2048
    assert StreamEncoder("aac", 22000).rate == 48000  # not an AAC rate: resampled


def test_an_aac_stream_holds_only_what_it_has_not_handed_out():
    """A long-form AAC export or an hours-long stream used to keep every byte it had
    handed out (~345 MB for 12 hours): ADTS frames are written once, so they are dropped."""
    import numpy as np

    from mizuoto.audio_encoding import StreamEncoder, encode

    second = (0.1 * np.sin(np.arange(24000) / 10)).astype(np.float32)
    encoder = StreamEncoder("aac", 24000)
    parts, held = [], []
    for _ in range(60):
        parts.append(encoder.feed(second))
        held.append(len(encoder._sink.buffer))
    parts.append(encoder.close())
    assert b"".join(parts) == encode(np.tile(second, 60), 24000, "aac")
    assert max(held) < 4096 < sum(map(len, parts)) / 10  # a few frames, not the file


def test_admission_waits_its_turn_and_refuses_past_the_queue():
    """The pool admits requests: while another model waits for room, a loaded model's new
    requests wait their turn (up to its queue size, then 429) and leave when the client does."""
    from mizuoto.serve.errors import ClientGone
    from mizuoto.serve.pool import ModelPool, pin_for_request

    pool = ModelPool(max_loaded=1)
    a = ModelWorker("a", "a", load=object, queue_size=1, pool=pool, preload=False)
    b = ModelWorker("b", "b", load=object, queue_size=1, pool=pool, preload=False)
    a.engine = object()  # loaded; b's load waits for its room
    pool._waiting.append(b)

    async def main() -> None:
        gone = asyncio.Event()

        async def disconnected() -> bool:
            return gone.is_set()

        waiter = asyncio.ensure_future(pin_for_request(a, disconnected))
        await asyncio.sleep(0.1)
        assert not waiter.done(), "a request pinned a model another load waits to replace"
        with pytest.raises(APIError) as full:
            await pin_for_request(a, disconnected)
        assert full.value.status == 429
        pool._waiting.remove(b)
        (await asyncio.wait_for(waiter, 5)).release()
        pool._waiting.append(b)
        leaving = asyncio.ensure_future(pin_for_request(a, disconnected))
        gone.set()
        with pytest.raises(ClientGone):
            await asyncio.wait_for(leaving, 5)
        assert a.pins == 0

    asyncio.run(main())


def _silence_engine():
    """An engine class that says 10 ms of silence at 8 kHz, for the server's unit tests."""
    import torch

    from mizuoto import Audio
    from mizuoto.contracts.capabilities import Capability
    from mizuoto.contracts.engine import Engine, ModelInfo
    from mizuoto.contracts.results import Rendered

    class Silence(Engine):
        name = "silence"
        request_settings = frozenset()
        info = ModelInfo("silence", "s", "v0", 8000, "float32", "cpu",
                         frozenset({Capability.ZERO_SHOT}))
        load = classmethod(lambda cls, model_dir, **kwargs: cls())

        def _synthesize(self, request, params, generator, progress):
            return Rendered(Audio(torch.zeros(80), 8000))

    return Silence


def test_a_speech_request_is_built_and_its_params_parsed_once(tmp_path, monkeypatch):
    from starlette.testclient import TestClient

    from mizuoto.contracts import requests
    from mizuoto.serve import ServeConfig, create_app

    built, parsed = [], []
    post_init = requests.SynthesisRequest.__attrs_post_init__
    monkeypatch.setattr(requests.SynthesisRequest, "__attrs_post_init__",
                        lambda self: (built.append(self.text), post_init(self)))

    class Silence(_silence_engine()):
        def parse_params(self, params):
            parsed.append(dict(params))
            return super().parse_params(params)

    app = create_app(ServeConfig(models={"s": "s"}, voices_dir=tmp_path),
                     loader=lambda name, model: (Silence, True))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        response = client.post("/v1/audio/speech", json={
            "model": "s", "input": "Once.", "voice": "default", "response_format": "pcm"})
        assert response.status_code == 200 and response.content == b"\0\0" * 240  # 24 kHz
        assert (built, parsed) == (["Once."], [{}])
        bad = client.post("/v1/audio/speech", json={
            "model": "s", "input": "Twice?", "voice": "default", "mizuoto": {"params": {"x": 1}}})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "mizuoto.params.x"


@pytest.mark.parametrize("start_loaded", [True, False])
def test_start_loaded_holds_the_start_until_every_model_has_loaded(tmp_path, start_loaded):
    """Ray's ingress starts with start_loaded=True: a request right after the start never meets
    a model still loading (it was answered 503 now and then); the single-process server starts
    at once and says so in /health."""
    from starlette.testclient import TestClient

    from mizuoto.serve import ServeConfig, create_app

    Silence = _silence_engine()
    release = threading.Event()

    def slow_load():
        release.wait(0.6 if start_loaded else 30)
        return Silence()

    app = create_app(ServeConfig(models={"s": "s", "t": "t"}, voices_dir=tmp_path),
                     loader=lambda name, model: (slow_load, True), start_loaded=start_loaded)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        health = client.get("/health")
        if start_loaded:
            assert health.status_code == 200, health.json()
            assert health.json()["models"] == {"s": "ready", "t": "ready"}
        else:
            assert health.status_code == 503
            assert health.json()["models"] == {"s": "loading", "t": "loading"}
        release.set()


def test_a_clients_budget_counts_characters_in_flight_and_gives_them_back():
    from mizuoto.serve.budget import ClientBudget, client_of
    from mizuoto.serve.errors import APIError

    budget = ClientBudget(limit=10_000)
    first = budget.take("address:a", 9_000)
    with pytest.raises(APIError) as refused:
        budget.take("address:a", 1_500)
    assert refused.value.status == 429 and refused.value.code == "client_busy"
    assert refused.value.headers["Retry-After"] == "1"
    other = budget.take("address:b", 9_999)  # another client has its own budget
    first()
    first()  # given back once only
    assert budget.in_flight("address:a") == 0 and budget.in_flight("address:b") == 9_999
    alone = budget.take("address:a", 50_000)  # one request alone always fits
    alone()
    other()
    assert budget.in_flight("address:b") == 0
    key = [(b"Authorization", b"Bearer s3cret")]
    assert client_of(key, "10.0.0.1") == client_of(key, "10.0.0.2") != "address:10.0.0.1"
    assert "s3cret" not in client_of(key, None)
    assert client_of([], "10.0.0.1") == "address:10.0.0.1"
