"""Batch synthesis with F5-TTS (tiny random model): this process, local worker processes and a
local Ray instance write the same files, byte for byte; bad lines are recorded, not fatal."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import soundfile

import mizuoto
from mizuoto.batch import BatchJob, ModelLoader, run_batch
from mizuoto_f5tts.fixtures import write_random_model_dir

OPTIONS = mizuoto.Options.from_mapping({"compute.device": "cpu", "compute.cpu_threads": 1})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_random_model_dir(tmp_path_factory.mktemp("f5") / "v1", "v1_base", size="tiny")


@pytest.fixture(scope="module")
def batch_input(tmp_path_factory):
    folder = tmp_path_factory.mktemp("input")
    t = np.arange(16000) / 16000
    soundfile.write(folder / "ref.wav", (0.2 * np.sin(2 * np.pi * 150 * t)).astype(np.float32),
                    16000)
    rows = [{"id": "one", "text": "The first line.", "seed": 1},
            {"id": "two", "text": "The second line.", "seed": 2, "reference": "ref.wav",
             "reference_text": "A reference."},
            {"id": "lost", "text": "Where is it?", "seed": 3, "reference": "gone.wav",
             "reference_text": "Gone."},
            {"id": "three", "text": "The third line.", "seed": 3, "params": {"speed": 0.9}},
            {"id": "fast", "text": "Too fast.", "params": {"speed": 99}},
            {"id": "four", "text": "The fourth line.", "seed": 4}]
    path = folder / "lines.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _outputs(folder):
    records = [json.loads(raw) for raw in (folder / "manifest.jsonl").read_text().splitlines()]
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix == ".wav"}
    statuses = [(r["id"], r["status"], r.get("error", {}).get("field")) for r in records]
    return statuses, files


@pytest.fixture(scope="module")
def local_run(model_dir, batch_input, tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    engine = mizuoto.load(model_dir, options=OPTIONS)
    summary = run_batch(BatchJob(batch_input, out, defaults={"steps": 2}), engine=engine)
    return summary, _outputs(out)


def test_local_batch_writes_good_lines_and_records_bad_ones(local_run):
    summary, (statuses, files) = local_run
    assert (summary.ok, summary.failed) == (4, 2)
    assert statuses == [("one", "ok", None), ("two", "ok", None),
                        ("lost", "error", "reference.audio"), ("three", "ok", None),
                        ("fast", "error", "params.speed"), ("four", "ok", None)]
    assert set(files) == {"one.wav", "two.wav", "three.wav", "four.wav"}


def test_worker_processes_write_the_same_files(model_dir, batch_input, local_run, tmp_path):
    loader = ModelLoader(str(model_dir), options=OPTIONS, workers=2)
    summary = run_batch(BatchJob(batch_input, tmp_path, defaults={"steps": 2}), load=loader,
                        workers=2)
    assert (summary.ok, summary.failed) == (4, 2)
    assert _outputs(tmp_path) == local_run[1]


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs mizuoto-core[ray]")
def test_ray_writes_the_same_files_as_the_local_run(model_dir, batch_input, local_run, tmp_path):
    import ray

    from mizuoto.batch.ray import RaySettings, ray_records

    loader = ModelLoader(str(model_dir), options=OPTIONS, workers=2)
    records = ray_records(loader, RaySettings(actors=2, num_cpus=0.5))
    try:
        summary = run_batch(BatchJob(batch_input, tmp_path, defaults={"steps": 2}),
                            records=records)
    finally:
        ray.shutdown()
    assert (summary.ok, summary.failed) == (4, 2)
    assert _outputs(tmp_path) == local_run[1]
