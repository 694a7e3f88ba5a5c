"""``mizuoto serve --max-batch`` for an engine that declares the step interface: the docs'
example plugin (the toy) batches in the server with no code of its own for it. A live
server on 127.0.0.1; concurrent streams step together in the core's scheduler, each
response is byte for byte the request alone, and /metrics shows the steps."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("mizuoto_example")

import mizuoto  # noqa: E402
from mizuoto.contracts.scheduler import scheduler_for  # noqa: E402
from mizuoto.serve import ServeConfig, serve_in_thread  # noqa: E402

STREAMS = 4
TEXT = "The toy hums this line word by word, one word per step. " * 3


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'{name}{{model="toy"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"{name} is missing from /metrics")


def test_the_example_plugin_batches_in_the_server(tmp_path, monkeypatch):
    from mizuoto_example.engine import ToyEngine, write_tiny_model

    write_tiny_model(tmp_path / "toy")
    step_rows = ToyEngine.step_rows
    all_open = threading.Event()

    def first_with_every_stream(self, rows):  # the first step waits for all four streams
        if not all_open.is_set():
            for _ in range(3000):
                if scheduler_for(self).open_rows >= STREAMS:
                    break
                all_open.wait(0.01)
            all_open.set()
        return step_rows(self, rows)

    monkeypatch.setattr(ToyEngine, "step_rows", first_with_every_stream)
    config = ServeConfig(models={"toy": str(tmp_path / "toy")}, voices_dir=tmp_path / "v",
                         queue_size=8, max_batch=STREAMS)
    bodies: dict[int, httpx.Response] = {}
    with serve_in_thread(config) as url:
        def fetch(seed: int) -> None:
            bodies[seed] = httpx.post(f"{url}/v1/audio/speech", timeout=120, json={
                "model": "toy", "input": TEXT, "voice": "default", "response_format": "pcm",
                "mizuoto": {"seed": seed}})

        threads = [threading.Thread(target=fetch, args=(seed,)) for seed in range(STREAMS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        metrics = httpx.get(f"{url}/metrics").text
    words = len(TEXT.split())
    assert _metric(metrics, "mizuoto_batch_rows_total") == STREAMS * words
    assert _metric(metrics, "mizuoto_batch_steps_total") < STREAMS * words  # steps shared
    alone = mizuoto.load(tmp_path / "toy", engine="toy")
    for seed, response in sorted(bodies.items()):
        assert response.status_code == 200, response.text
        assert response.content == _pcm(alone, seed), seed


def _pcm(engine, seed: int) -> bytes:
    """The bytes the server sends for the request alone (pcm: 24 kHz 16-bit)."""
    from mizuoto.audio_encoding import StreamEncoder

    encoder = StreamEncoder("pcm", engine.info.sample_rate, streaming=True)
    chunks = engine.stream(mizuoto.SynthesisRequest(TEXT, seed=seed))
    return b"".join(encoder.feed(c.audio.numpy()) for c in chunks) + encoder.close()


def test_a_disconnected_clients_stream_stops_within_one_step(tmp_path, monkeypatch):
    """A client that hangs up mid-stream: the server cancels its job (Starlette notices the
    disconnect) and the scheduler steps its row at most once more (the step being taken when
    the job was cancelled); the row is closed and the model holds none."""
    from mizuoto.serve.jobs import Job
    from mizuoto_example.engine import ToyEngine, write_tiny_model

    write_tiny_model(tmp_path / "toy")
    steps: list[int] = []
    cancelled_at: list[int] = []
    closed: list[object] = []
    engines: list[object] = []
    step_rows, close_row, cancel = ToyEngine.step_rows, ToyEngine.close_row, Job.cancel

    def counted(self, rows):
        steps.append(len(rows))
        return step_rows(self, rows)

    def closing(self, row):
        close_row(self, row)
        engines.append(self)
        closed.append(row)

    def recorded(self):
        cancelled_at.append(len(steps))
        cancel(self)

    monkeypatch.setattr(ToyEngine, "step_rows", counted)
    monkeypatch.setattr(ToyEngine, "close_row", closing)
    monkeypatch.setattr(Job, "cancel", recorded)
    config = ServeConfig(models={"toy": str(tmp_path / "toy")}, voices_dir=tmp_path / "v",
                         queue_size=8)
    words = 2000  # 4000 characters, 8 minutes of humming
    with serve_in_thread(config) as url:
        with httpx.stream("POST", f"{url}/v1/audio/speech", timeout=120, json={
                "model": "toy", "input": "a " * words, "voice": "default",
                "response_format": "pcm",
                "mizuoto": {"stream": True, "params": {"max_seconds": 600}}}) as response:
            assert response.status_code == 200, response.read()[:300]
            next(response.iter_bytes())
        # the client is gone: its row is closed once the server notices
        for _ in range(6000):
            if closed:
                break
            threading.Event().wait(0.01)
        assert closed, "the row of the abandoned stream was never closed"
        assert scheduler_for(engines[0]).open_rows == 0
    assert cancelled_at, "the server never cancelled the abandoned job"
    assert len(steps) <= cancelled_at[0] + 1, (
        f"{len(steps) - cancelled_at[0]} steps after the job was cancelled")
    assert len(steps) < words  # it did not run to its end
