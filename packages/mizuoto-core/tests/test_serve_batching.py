"""``mizuoto serve --max-batch``: a live server on 127.0.0.1 with a tiny random VoxCPM2 model;
concurrent streams of one model run at once and step together, each ends where it ends alone,
and /metrics shows the batches. Options reach only engines that batch."""

from __future__ import annotations

import io
import math
import threading

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("mizuoto_voxcpm")

import soundfile as sf  # noqa: E402

import mizuoto  # noqa: E402
from mizuoto import Options, SynthesisRequest  # noqa: E402
from mizuoto.audio_encoding import to_int16  # noqa: E402
from mizuoto.contracts.request_lock import NoLock  # noqa: E402
from mizuoto.errors import InvalidRequest  # noqa: E402
from mizuoto.serve import ServeConfig, serve_in_thread  # noqa: E402
from mizuoto.serve.batching import Lanes, options_with_max_batch  # noqa: E402
from mizuoto.serve.worker import ModelWorker  # noqa: E402

TEXT = "Hello from the server."
# twelve patches each: long enough that four concurrent streams overlap
VOX = {"steps": 2, "params": {"max_len": 12, "retry_badcase": False}}
STREAMS = 4


@pytest.fixture(scope="module")
def vox_dir(tmp_path_factory):
    from mizuoto_voxcpm.fixtures import write_random_model

    return write_random_model(tmp_path_factory.mktemp("serve-batch") / "vox", "voxcpm2",
                              dtype="float32")


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'{name}{{model="vox"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"{name} is missing from /metrics")


def test_concurrent_streams_step_together(vox_dir, tmp_path):
    config = ServeConfig(models={"vox": str(vox_dir)}, voices_dir=tmp_path, queue_size=8,
                         max_batch=STREAMS)
    seeds = list(range(1, STREAMS + 1))
    bodies: dict[int, bytes] = {}
    with serve_in_thread(config) as url:
        def fetch(seed: int) -> None:
            body = {"model": "vox", "input": TEXT, "voice": "default",
                    "response_format": "wav", "mizuoto": {**VOX, "seed": seed}}
            response = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=300)
            assert response.status_code == 200, response.text
            bodies[seed] = response.content

        threads = [threading.Thread(target=fetch, args=(seed,)) for seed in seeds]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        metrics = httpx.get(f"{url}/metrics").text
    assert sorted(bodies) == seeds
    steps = _metric(metrics, "mizuoto_batch_steps_total")
    rows = _metric(metrics, "mizuoto_batch_rows_total")
    assert rows == STREAMS * 12, "every patch of every stream went through the batcher"
    assert steps < rows, "no step had more than one request"
    assert 1 <= _metric(metrics, "mizuoto_batch_size") <= STREAMS
    assert _metric(metrics, "mizuoto_batch_step_seconds") > 0
    alone = mizuoto.load(vox_dir)
    for seed in seeds:
        request = SynthesisRequest(TEXT, seed=seed, steps=VOX["steps"], params=VOX["params"])
        expected = to_int16(np.concatenate([c.audio.samples.numpy()
                                            for c in alone.stream(request)]))
        got, _ = sf.read(io.BytesIO(bodies[seed]), dtype="int16")
        assert got.shape == expected.shape  # the same patches: no stop moved
        noise = np.sum((got.astype(np.float64) - expected) ** 2)
        if noise:  # batched rows are close to alone, not always bit-identical
            assert 10 * math.log10(np.sum(expected.astype(np.float64) ** 2) / noise) > 40


def test_max_batch_reaches_only_engines_that_batch():
    options = options_with_max_batch(None, 8)
    assert options.engines["voxcpm"]["max_batch"] == 8
    assert options.engines["voxcpm"]["cache_slots"] == 8
    assert "max_batch" not in options.engines.get("f5tts", {})
    mine = Options.from_mapping({"engines.voxcpm.max_batch": 2})
    assert options_with_max_batch(mine, 8).engines["voxcpm"]["max_batch"] == 2  # set wins


@pytest.mark.parametrize("value", [0, 257, 2.0, True])
def test_max_batch_is_checked_by_name(value, tmp_path):
    with pytest.raises(InvalidRequest, match="max_batch"):
        ServeConfig(models={"vox": str(tmp_path)}, max_batch=value)


def test_lanes_bound_the_jobs_running_at_once():
    lanes = Lanes("m", 2)
    release = threading.Event()
    running: list[int] = []
    peak: list[int] = []

    def job() -> None:
        running.append(1)
        peak.append(lanes.active)
        release.wait(10)
        running.pop()

    started = threading.Thread(target=lambda: [lanes.run(job) for _ in range(3)])
    started.start()
    started.join(0.5)
    assert started.is_alive(), "a third job started while two lanes were busy"
    assert lanes.active == 2
    release.set()
    started.join(10)
    assert lanes.wait_idle(10) and lanes.active == 0
    assert max(peak) <= 2


class _Scheduled:
    """An engine as the worker sees it: its scheduling object says how many requests it runs
    at once (capacity None: no bound, they take turns)."""

    name = "scheduled"

    def __init__(self, capacity: int | None) -> None:
        self.scheduling = NoLock(capacity)


class _Serial:
    name = "serial"


@pytest.mark.parametrize(("engine", "lanes"), [
    (_Scheduled(3), 3), (_Scheduled(None), 4), (_Scheduled(1), None), (_Serial(), None)],
    ids=["rows", "turns", "one", "no-scheduling"])
def test_a_worker_runs_as_many_at_once_as_the_engines_scheduling_runs(engine, lanes):
    # the loaded engine's scheduling sizes the lanes (unbounded: as many as the queue holds)
    worker = ModelWorker("m", "m", load=lambda: engine, queue_size=4)
    worker.start()
    assert worker.loaded.wait(10) and worker.state == "ready"
    assert (worker._lanes.size if worker._lanes is not None else None) == lanes
    worker.stop(5)


def test_a_model_is_not_evicted_while_its_engine_is_busy():
    """The worker asks the engine's scheduling whether it is idle: a request running on it
    outside the worker's jobs (a stream still being read) keeps it loaded."""
    engine = _Scheduled(None)
    worker = ModelWorker("m", "m", load=lambda: engine, queue_size=4)
    worker.start()
    assert worker.loaded.wait(10)
    engine.scheduling.count(active=1)
    assert not worker.evict() and worker.engine is engine
    engine.scheduling.count(active=-1)
    assert worker.evict() and worker.state == "unloaded"
    worker.stop(5)
