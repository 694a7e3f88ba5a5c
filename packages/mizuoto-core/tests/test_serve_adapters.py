"""``mizuoto serve --lora-dir`` in one process: several adapters on one loaded base model, one
applied per request, on the example plugin's toy and a tiny F5-TTS (fixture adapters, written
from each engine's declared targets)."""

from __future__ import annotations

import io
import json
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("mizuoto_example")
pytest.importorskip("mizuoto_f5tts")

import soundfile as sf  # noqa: E402

import mizuoto  # noqa: E402
from mizuoto import SynthesisRequest  # noqa: E402
from mizuoto.adapters import write_random_adapter  # noqa: E402
from mizuoto.audio_encoding import to_int16  # noqa: E402
from mizuoto.errors import InvalidRequest  # noqa: E402
from mizuoto.options import ComputeOptions, Options  # noqa: E402
from mizuoto.serve import ServeConfig, serve_in_thread  # noqa: E402

CPU = Options(compute=ComputeOptions(device="cpu", cpu_threads=1))
TEXT = "Hello there, how are you?"
# each engine's fixture model, and what a request sets (the toy's char_seconds, F5's steps)
ENGINES = {"toy": {"params": {"char_seconds": 0.02}}, "f5": {"steps": 2}}


def _write_model(engine: str, directory, seed: int = 0) -> None:
    if engine == "toy":
        from mizuoto_example.engine import write_tiny_model

        write_tiny_model(directory, seed=seed)
    else:
        from mizuoto_f5tts.fixtures import write_random_model_dir

        write_random_model_dir(directory, "v1_base", size="tiny", seed=seed)


@pytest.fixture(scope="module", params=sorted(ENGINES))
def served(request, tmp_path_factory):
    """A base model and two adapters for it under ``loras/`` (``a``, ``b``)."""
    root = tmp_path_factory.mktemp(request.param)
    _write_model(request.param, root / "base")
    base = mizuoto.load(root / "base", options=CPU)
    for name, seed in (("a", 1), ("b", 2)):
        write_random_adapter(base, root / "loras" / name, seed)
    return request.param, root


def _speak(url: str, model: str, extension: dict) -> np.ndarray:
    response = httpx.post(f"{url}/v1/audio/speech", timeout=120, json={
        "model": model, "input": TEXT, "voice": "default", "response_format": "wav",
        "mizuoto": {"seed": 7, "stream": False, **extension}})
    assert response.status_code == 200, response.text
    return sf.read(io.BytesIO(response.content), dtype="int16")[0]


def _alone(directory, extension: dict) -> np.ndarray:
    """The audio of ``directory`` (a model, or an adapter export: its base with it applied)
    loaded on its own."""
    engine = mizuoto.load(directory, options=CPU)
    request = SynthesisRequest(TEXT, seed=7, steps=extension.get("steps"),
                               params=extension.get("params", {}))
    return to_int16(engine.synthesize(request).audio.samples.numpy())


def test_adapters_and_base_served_at_once_each_as_if_alone(served, tmp_path):
    engine, root = served
    extension = ENGINES[engine]
    expected = {"base": _alone(root / "base", extension),
                "a": _alone(root / "loras" / "a", extension),
                "b": _alone(root / "loras" / "b", extension)}
    assert not np.array_equal(expected["a"], expected["b"])  # the adapters do change it
    config = ServeConfig(models={"base": str(root / "base")}, lora_dirs=[str(root / "loras")],
                         options=CPU, voices_dir=tmp_path / "voices")
    with serve_in_thread(config) as url:
        listing = httpx.get(f"{url}/v1/models").json()["data"]
        assert [(m["id"], m["parent"]) for m in listing] == [
            ("base", None), ("a", "base"), ("b", "base")]
        # interleaved, at once: each request runs with exactly its adapter, all its chunks
        order = ["a", "b", "base", "b", "a", "base", "a", "b"]
        with ThreadPoolExecutor(len(order)) as pool:
            answers = list(pool.map(lambda name: _speak(url, name, extension), order))
        for name in ("a", "base"):  # each model's voices, read with its adapter applied
            voices = httpx.get(f"{url}/v1/audio/voices", params={"model": name}, timeout=60)
            assert voices.status_code == 200 and voices.json()["voices"][0]["id"] == "default"
    for name, audio in zip(order, answers, strict=True):
        assert np.array_equal(audio, expected[name]), name


def test_an_adapter_whose_base_is_not_served_is_refused_by_name(served, tmp_path):
    _, root = served
    config = ServeConfig(models={"other": str(root / "loras" / "a")},
                         lora_dirs=[str(root / "loras")], options=CPU)
    with pytest.raises(InvalidRequest, match="lora_dirs.*is an adapter for .*not served"):
        with serve_in_thread(config):
            pass
    clash = ServeConfig(models={"a": str(root / "base")}, lora_dirs=[str(root / "loras")])
    with pytest.raises(InvalidRequest, match="both named 'a'"):
        with serve_in_thread(clash):
            pass


def test_an_adapter_of_another_base_or_shape_fails_its_models_load_naming_it(served, tmp_path):
    engine, root = served
    loras = tmp_path / "loras"
    # trained on another model, but naming this one as its base
    _write_model(engine, tmp_path / "other", seed=3)
    write_random_adapter(mizuoto.load(tmp_path / "other", options=CPU), loras / "foreign", 1)
    config_file = loras / "foreign" / "adapter_config.json"
    info = json.loads(config_file.read_text())
    info["base_model_name_or_path"] = str(root / "base")
    config_file.write_text(json.dumps(info))
    config = ServeConfig(models={"base": str(root / "base")}, lora_dirs=[str(loras)],
                         options=CPU, voices_dir=tmp_path / "voices")
    with serve_in_thread(config) as url:
        health = httpx.get(f"{url}/health")
        assert health.status_code == 503 and health.json()["models"]["base"] == "failed"
        answer = httpx.post(f"{url}/v1/audio/speech", json={
            "model": "foreign", "input": TEXT, "voice": "default"})
        assert answer.status_code == 503
        assert "adapter 'foreign'" in answer.text
        assert "trained on another base model" in answer.text
    # of another shape (rank 3 tensors under a config saying rank 2)
    shutil.rmtree(loras)
    write_random_adapter(mizuoto.load(root / "base", options=CPU), loras / "shapes", 1, r=3)
    config_file = loras / "shapes" / "adapter_config.json"
    config_file.write_text(config_file.read_text().replace('"r": 3', '"r": 2'))
    config = ServeConfig(models={"base": str(root / "base")}, lora_dirs=[str(loras)],
                         options=CPU, voices_dir=tmp_path / "voices")
    with serve_in_thread(config) as url:
        answer = httpx.post(f"{url}/v1/audio/speech", json={
            "model": "shapes", "input": TEXT, "voice": "default"})
        assert answer.status_code == 503 and "adapter 'shapes'" in answer.text


def test_jobs_on_lanes_run_together_only_with_one_adapter():
    """``--max-batch``: jobs of one adapter share the lanes; a job of another waits until they
    have ended, and runs with its own applied from its start to its end."""
    import asyncio
    import threading
    import time

    from mizuoto.adapters import AdapterHost
    from mizuoto.contracts.features import SupportsBatching
    from mizuoto.serve.jobs import DONE, Job
    from mizuoto.serve.worker import ModelWorker

    class Batching(SupportsBatching, AdapterHost):
        max_batch, batch_stats = 4, None
        active_adapter, adapters = None, {"a": None, "b": None}
        lora_root = base_fingerprint = None

        @classmethod
        def batch_options(cls, section, max_batch):
            return dict(section)

        def set_adapter(self, name):
            assert running == 0, "an adapter swapped under running jobs"
            self.active_adapter = name

    engine, running, seen, guard = Batching(), 0, [], threading.Lock()

    def run(engine, job):
        nonlocal running
        with guard:
            running += 1
        start = engine.active_adapter
        time.sleep(0.05)
        seen.append((job.adapter, start, engine.active_adapter))
        with guard:
            running -= 1

    async def main():
        loop = asyncio.get_running_loop()
        worker = ModelWorker("m", "m", load=lambda: engine, queue_size=16)
        worker.start()
        jobs = [Job(run, loop, adapter=a) for a in ["a", "a", "b", "b", None, "a", "b"]]
        for job in jobs:
            worker.submit(job)
        for job in jobs:
            while await job.get() is not DONE:
                pass
        worker.stop(5)

    asyncio.run(main())
    assert len(seen) == 7 and all(a == start == end for a, start, end in seen), seen


def test_an_adapter_switch_waits_for_a_job_handed_on_but_not_yet_in_the_engine():
    """A job on a lane is counted by the engine's scheduling from the moment the worker hands
    it on, before it reaches the engine: a job of another adapter taken next finds the engine
    busy, and its switch waits until that job has ended (no wait on the lanes)."""
    import asyncio
    import threading

    from mizuoto.adapters import AdapterHost
    from mizuoto.contracts.request_lock import NoLock
    from mizuoto.serve.jobs import DONE, Job
    from mizuoto.serve.worker import ModelWorker

    class Host(AdapterHost):
        active_adapter, adapters = "a", {"a": None, "b": None}
        lora_root = base_fingerprint = None

        def __init__(self):
            self.scheduling = NoLock(capacity=4)  # lanes, as for a stepping engine

        def set_adapter(self, name):
            events.append(("switch", name))
            self.active_adapter = name

    engine, events = Host(), []
    on_lane, go, switch_asked = threading.Event(), threading.Event(), threading.Event()
    idle_when_asked = []
    wait_idle = engine.scheduling.wait_idle

    def spied_wait_idle(timeout):
        idle_when_asked.append(engine.scheduling.idle)
        switch_asked.set()
        return wait_idle(timeout)

    engine.scheduling.wait_idle = spied_wait_idle

    def held_back(engine, job):  # on its lane, not yet in the engine
        on_lane.set()
        assert go.wait(30)
        events.append(("run", job.adapter, engine.active_adapter))

    def run(engine, job):
        events.append(("run", job.adapter, engine.active_adapter))

    async def main():
        loop = asyncio.get_running_loop()
        worker = ModelWorker("m", "m", load=lambda: engine, queue_size=16)
        worker.start()
        first, second = Job(held_back, loop, adapter="a"), Job(run, loop, adapter="b")
        worker.submit(first)
        assert await loop.run_in_executor(None, on_lane.wait, 30)
        worker.submit(second)
        assert await loop.run_in_executor(None, switch_asked.wait, 30)
        go.set()
        for job in (first, second):
            while await job.get() is not DONE:
                pass
        worker.stop(5)

    asyncio.run(main())
    assert idle_when_asked == [False]  # the held-back job counted, though not in the engine
    assert events == [("run", "a", "a"), ("switch", "b"), ("run", "b", "b")]
    assert engine.scheduling.idle and engine.scheduling.reserved == 0


def test_an_export_in_an_engines_own_format_is_served_as_a_model_of_its_own(tmp_path):
    """VoxCPM's exports (its base files and upstream's LoRA files) are whole model folders."""
    pytest.importorskip("mizuoto_voxcpm")
    from mizuoto.serve.adapters import served_adapters

    export = tmp_path / "loras" / "alice"
    export.mkdir(parents=True)
    (export / "lora_weights.safetensors").write_bytes(b"")  # found by the declared file name
    found = served_adapters([tmp_path / "loras"], {"vox": str(tmp_path / "vox")})
    assert dict(found.models) == {"alice": str(export)} and not found.on_base


def test_the_command_names_the_flag_of_an_adapter_whose_base_is_not_served(tmp_path):
    import socket

    from click.testing import CliRunner

    from mizuoto.cli import cli

    _write_model("toy", tmp_path / "base")
    _write_model("toy", tmp_path / "other", seed=1)
    write_random_adapter(mizuoto.load(tmp_path / "base", options=CPU), tmp_path / "loras" / "a", 1)
    with socket.socket() as probe:  # a free port: the server binds it before it looks
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = CliRunner().invoke(cli, ["serve", "-m", str(tmp_path / "other"), "--lora-dir",
                                      str(tmp_path / "loras"), "--port", str(port)])
    assert result.exit_code != 0
    assert "--lora-dir:" in result.output and "which is not served" in result.output
