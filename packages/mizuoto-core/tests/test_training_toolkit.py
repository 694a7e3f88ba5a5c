"""The training toolkit (mizuoto.training): rotation, metrics (JSONL and TensorBoard), progress,
the run directory's identity, the step loop's cadence and interruption, the recipe from the
command line."""

from __future__ import annotations

import json
import os
import signal

import pytest

from mizuoto.errors import InvalidRequest
from mizuoto.training import (
    Cadence,
    MetricsLog,
    ProcessWorld,
    RunDirectory,
    RunIdentity,
    StepLoop,
    StepProgress,
    data_fingerprint,
    micro_batches,
    numbered,
    process_world,
    rotate,
    warn_long_warmup,
)
from mizuoto.training.recipe import parse_params, read_config_file, split_settings


def test_rotation_keeps_the_newest_by_number_not_by_name(tmp_path):
    for step in (9, 10, 100, 2):
        (tmp_path / f"step_{step}").mkdir()
        (tmp_path / f"model_{step}.pt").write_bytes(b"x")
    (tmp_path / "model_last.pt").write_bytes(b"x")  # not numbered: never rotated
    assert [n for n, _ in numbered(tmp_path, "step_")] == [2, 9, 10, 100]
    removed = rotate(tmp_path, "model_", ".pt", keep=2)
    assert sorted(p.name for p in removed) == ["model_2.pt", "model_9.pt"]
    assert sorted(p.name for p in tmp_path.glob("model_*")) == [
        "model_10.pt", "model_100.pt", "model_last.pt"]
    assert rotate(tmp_path, "step_", keep=-1) == []
    rotate(tmp_path, "step_", keep=0)
    assert not list(tmp_path.glob("step_*"))


def test_metrics_jsonl_and_tensorboard_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLog(tmp_path, tensorboard=True)
    for step in range(3):
        log.log(step, {"loss": 1.0 / (step + 1), "lr": 1e-4})
    log.audio("samples/step_2", [0.0, 0.5, -0.5, 0.0] * 100, 2, sample_rate=16000)
    log.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": s, "loss": 1.0 / (s + 1), "lr": 1e-4} for s in range(3)]
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"audio": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [0, 1, 2]
    assert events.Scalars("loss")[2].value == pytest.approx(1 / 3)
    assert [e.step for e in events.Audio("samples/step_2")] == [2]

    # a resumed run drops the lines from its first step on, and logs them again
    resumed = MetricsLog(tmp_path, tensorboard=False, resume_from=1)
    assert [row["step"] for row in resumed.rows] == [0]
    resumed.log(1, {"loss": 0.25})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] \
        == [0, 1]


def test_metrics_without_tensorboard_write_jsonl_only(tmp_path):
    log = MetricsLog(tmp_path, tensorboard=False)
    log.log(0, {"loss": 2.0})
    log.audio("x", [0.0], 0, 16000)  # nothing to do, no error
    log.close()
    assert not (tmp_path / "tensorboard").exists()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 0, "loss": 2.0}\n'


def test_progress_shows_loss_rate_and_eta():
    now = [100.0]
    seen = []
    progress = StepProgress(seen.append, total=10, start=4, clock=lambda: now[0])
    now[0] += 4.0  # two updates in 4 s: 2 s each, 4 left
    progress(6, {"loss": 0.123456, "lr": 1e-5})
    assert seen[-1].stage == "train" and (seen[-1].done, seen[-1].total) == (6, 10)
    assert seen[-1].detail == "loss 0.1235 · 2.00 s/step · ETA 0:00:08"
    now[0] += 0.2  # fast: steps per second
    progress(10, {"loss": 0.1})
    assert "steps/s" in seen[-1].detail and seen[-1].detail.endswith("ETA 0:00:00")


def _identity(base="aa" * 32, data="bb" * 32, model="base", dataset="data.csv"):
    return RunIdentity("demo", "full", model, base, dataset, data)


def test_a_resume_with_another_base_or_data_is_refused_naming_both(tmp_path):
    run = RunDirectory(tmp_path / "run")
    run.claim(_identity(), resumable=False)
    run.claim(_identity(), resumable=True)  # the same run resumes
    with pytest.raises(InvalidRequest) as caught:
        run.claim(_identity(base="cc" * 32, model="other"), resumable=True)
    assert "base model base" in str(caught.value) and "-> other" in str(caught.value)
    with pytest.raises(InvalidRequest, match=r"data set data.csv \(rows bbbb.*-> new.csv"):
        run.claim(_identity(data="dd" * 32, dataset="new.csv"), resumable=True)
    with pytest.raises(InvalidRequest) as both:
        run.claim(_identity(base="cc" * 32, data="dd" * 32), resumable=True)
    assert "base model" in str(both.value) and "data set" in str(both.value)
    # nothing to resume: the directory is the new run's
    run.claim(_identity(base="cc" * 32), resumable=False)
    assert run.recorded_identity().base_fingerprint == "cc" * 32


def test_data_fingerprint_follows_content_not_place(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for folder in ("a", "b"):
        (tmp_path / folder / "clip.wav").write_bytes(b"RIFF-same-bytes")
    same = data_fingerprint([("hello", tmp_path / "a" / "clip.wav")])
    assert same == data_fingerprint([("hello", tmp_path / "b" / "clip.wav")])
    assert same != data_fingerprint([("hello!", tmp_path / "a" / "clip.wav")])
    (tmp_path / "b" / "clip.wav").write_bytes(b"RIFF-other-bytes")
    assert same != data_fingerprint([("hello", tmp_path / "b" / "clip.wav")])


def _loop(total, *, start=0, cadence=Cadence(2), numbered_log=None, saves=None, **kwargs):
    saves = [] if saves is None else saves
    return StepLoop(start=start, total=total, cadence=cadence, world=ProcessWorld(),
                    save=saves.append,
                    numbered=None if numbered_log is None else numbered_log.append, **kwargs)


def test_step_loop_saves_on_cadence_and_at_the_end(tmp_path):
    saves, copies = [], []
    loop = _loop(5, saves=saves, numbered_log=copies,
                 cadence=Cadence(save_every=2, checkpoint_every=3, keep_checkpoints=-1),
                 metrics=MetricsLog(tmp_path, tensorboard=False))
    outcome = loop.run(lambda: {"loss": 1.0})
    assert (outcome.done, outcome.interrupted) == (5, None)
    assert saves == [2, 4, 5] and copies == [3]
    assert [row["step"] for row in loop.metrics.rows] == [0, 1, 2, 3, 4]
    resumed = _loop(5, start=5, saves=saves)
    assert resumed.run(lambda: pytest.fail("nothing left to train")).done == 5
    assert saves == [2, 4, 5]  # not saved again


def test_step_loop_stops_on_a_signal_after_the_update_and_saves(tmp_path):
    saves = []
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        def update():
            if loop.done == 2:
                os.kill(os.getpid(), signal.SIGTERM)
            return {"loss": 0.5}

        loop = _loop(10, saves=saves, cadence=Cadence(save_every=100))
        outcome = loop.run(update)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (outcome.done, outcome.interrupted) == (3, "SIGTERM")
    assert saves == [3]



def test_samples_due_at_a_stop_are_announced_before_they_are_written(caplog):
    written = []

    def update():
        if loop.done == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return {"loss": 0.5}

    def samples(done):
        assert any("writing the audio samples of update 2" in m for m in caplog.messages)
        written.append(done)

    loop = _loop(10, cadence=Cadence(save_every=100, samples_every=2), samples=samples)
    with caplog.at_level("INFO", logger="mizuoto.training.steps"):
        outcome = loop.run(update)
    assert (outcome.done, outcome.interrupted, written) == (2, "SIGTERM", [2])


def test_a_warmup_outlasting_the_updates_made_is_warned_of_with_steps_and_schedule(caplog):
    with caplog.at_level("WARNING", logger="mizuoto.training.steps"):
        assert not warn_long_warmup("warmup_steps", 4, steps=4, learning_rate=1e-4)
        assert warn_long_warmup("warmup_updates", 20000, steps=20, schedule=100,
                                learning_rate=1e-5)
    assert caplog.messages == ["warmup_updates 20000 exceeds the 20 updates this run makes "
                               "(--steps 20; the schedule spans 100 updates): the learning "
                               "rate rises all run and never reaches 1e-05 (upstream's "
                               "behaviour); to reach it, pass --param warmup_updates=N with "
                               "N at most 20"]

def test_micro_batches_skip_the_all_reduce_but_on_the_last():
    entered = []

    class NoSync:
        def __enter__(self):
            entered.append("skip")

        def __exit__(self, *exc):
            return False

    for index, context in micro_batches(3, NoSync):
        with context:
            entered.append(index)
    assert entered == ["skip", 0, "skip", 1, 2]
    assert [i for i, _ in micro_batches(2)] == [0, 1]


def test_process_world_from_torchrun_environment(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert process_world() == ProcessWorld(1, 0, 0) and process_world().main
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    world = process_world()
    assert (world.size, world.rank, world.local_rank) == (4, 3, 1) and not world.main


def test_params_are_toml_values_and_bad_pairs_are_named():
    assert parse_params(["lora_r=16", "lr_note=fast", "flag=true", 'names=["q", "k"]',
                         "rate=1e-4"]) == {"lora_r": 16, "lr_note": "fast", "flag": True,
                                           "names": ["q", "k"], "rate": 1e-4}
    with pytest.raises(InvalidRequest, match="KEY=VALUE"):
        parse_params(["no_equals_sign"])


def test_config_files_toml_and_yaml(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('steps = 3\nlearning_rate = 1e-4\nmodel = "m"\ngrad_accum_steps = 2\n')
    run, fields, params = split_settings(read_config_file(toml))
    assert run == {"model": "m"} and fields == {"steps": 3, "learning_rate": 1e-4}
    assert params == {"grad_accum_steps": 2}
    yaml_file = tmp_path / "up.yaml"
    yaml_file.write_text("num_iters: 5\nlambdas:\n  loss/diff: 1.0\n")
    assert read_config_file(yaml_file) == {"num_iters": 5, "lambdas": {"loss/diff": 1.0}}
    bad = tmp_path / "bad.toml"
    bad.write_text("steps = = 3")
    with pytest.raises(InvalidRequest, match="not valid TOML"):
        read_config_file(bad)
    latin = tmp_path / "latin.toml"
    latin.write_bytes('note = "caf\xe9"'.encode("latin-1"))
    with pytest.raises(InvalidRequest, match="not UTF-8"):
        read_config_file(latin)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(InvalidRequest, match="table of settings"):
        read_config_file(listed)


def test_training_progress_on_a_terminal_and_in_a_log(caplog):
    """On a terminal the train bar carries the loss and the ETA; in a log file (no terminal)
    one INFO line holds them, throttled, and the last update always."""
    import io
    import logging

    from mizuoto.commands.toolkit import ProgressBars, ProgressLog

    now = [0.0]
    terminal = io.StringIO()
    bars = ProgressBars(terminal)
    progress = StepProgress(bars, total=4, clock=lambda: now[0])
    now[0] = 3.0
    progress(1, {"loss": 0.75})
    assert "loss 0.7500" in terminal.getvalue() and "ETA 0:00:09" in terminal.getvalue()
    bars.close()

    logged = StepProgress(ProgressLog(), total=3, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="mizuoto"):
        for done in (1, 2, 3):
            now[0] += 1.0
            logged(done, {"loss": 0.5})
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("train ")]
    assert lines[0].startswith("train 1/3 (loss 0.5000") and "ETA" in lines[0]
    assert lines[-1].startswith("train 3/3") and len(lines) == 2  # update 2: within 30 s


# -- StepTrainer: the shared run around an engine's session ------------------------------------

class _CountingSession:
    """A session whose state is the sum of the update numbers it made."""

    def __init__(self, total):
        self.total, self.made, self.sum = total, 0, 0

    def update(self):
        self.made += 1
        self.sum += self.made
        return {"loss": float(self.sum)}

    def save(self, path, done):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([done, self.sum]))

    def load(self, path):
        self.made, self.sum = json.loads(path.read_text())
        return self.made


def _counting_trainer():
    from mizuoto.training import StepTrainer, TrainingSession

    class Session(_CountingSession, TrainingSession):
        pass

    class Counting(StepTrainer):
        engine, methods = "counting", frozenset({"full"})

        def prepare(self, config, *, progress=None):
            return type("Run", (), {"config": config})()

        def start(self, run, world):
            return Session(run.config.steps)

        def write_export(self, run, folder):
            (folder / "sum.json").write_text((run.config.output_dir / self.checkpoint).read_text())

    return Counting()


def test_a_step_trainer_resumes_logs_update_numbers_rotates_and_exports(tmp_path):
    from mizuoto import TrainingConfig

    trainer = _counting_trainer()

    def config(steps):
        return TrainingConfig(method="full", model="m", dataset=tmp_path, steps=steps,
                              output_dir=tmp_path / "run", save_every=2,
                              params={"keep_last_n_checkpoints": 2, "checkpoint_every": 1})

    first = trainer.train(trainer.prepare(config(3)))
    assert (first.steps_done, first.resumed_from, first.metrics["loss"]) == (3, None, 6.0)
    resumed = trainer.train(trainer.prepare(config(5)))
    assert (resumed.steps_done, resumed.resumed_from, resumed.metrics["loss"]) == (5, 3, 15.0)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5]  # one run's numbering, from 1
    assert [n for n, _ in numbered(tmp_path / "run" / "checkpoints", "model_", ".pt")] == [4, 5]
    exported = trainer.export(trainer.prepare(config(5)), tmp_path / "export")
    assert json.loads((exported / "sum.json").read_text()) == [5, 15]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no leftovers


def test_metrics_newest_holds_the_last_value_of_every_metric(tmp_path):
    from mizuoto.training import MetricsLog

    log = MetricsLog(tmp_path, tensorboard=False)
    log.log(1, {"loss": 3.0, "val/loss": 9.0})
    log.log(2, {"loss": 2.0})
    log.log(3, {"loss": 1.0, "lr": 0.5})
    assert log.newest() == {"loss": 1.0, "val/loss": 9.0, "lr": 0.5}
    assert MetricsLog(tmp_path / "empty", tensorboard=False).newest() == {}
