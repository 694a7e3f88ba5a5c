"""The trainer contract, run against every registered trainer (``register_trainers``).

Each trainer fine-tunes the first contract fixture of its engine (``register_contract_fixtures``)
on a small synthetic data set: a JSONL manifest (``{"audio": path, "text": ...}``, paths relative
to the manifest) of voiced clips. Every method the trainer declares is tested:

- prepare -> train a few steps -> export -> the engine loads the export and speaks;
- a run killed with SIGKILL (a real one, in a subprocess) resumes from its last checkpoint and
  exports the same weight files, byte for byte, as a run that was never interrupted;
- for a trainer that declares ``graceful_stop``: a run sent SIGTERM stops at the next update
  boundary, saves its checkpoint there and returns ``interrupted="SIGTERM"``; resumed, it
  exports the weights of an uninterrupted run (a trainer without it is not tested for this);
- bad rows (a missing audio file, an empty text) are skipped with a warning naming the row,
  and the run trains on the rest;
- two learning rates give different exported weights (a trainer that ignores
  ``TrainingConfig.learning_rate`` is caught);
- batch size 4 and ``params.grad_accumulation=2`` each give other exported weights than batch
  size 1 without accumulation, or are refused by name.

A failed weight comparison names the first differing tensor (shape, first index, max |diff|).

``--mizuoto-engine NAME`` selects trainers as it selects engines. Where no plugin registers a
trainer at all, this module collects nothing.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import numpy as np
import pytest

from mizuoto_contract.models import CONTRACT_OPTIONS
from mizuoto_contract.reference import REFERENCE_TEXT, voiced_signal

SAMPLE_RATE = 24000
TEXTS = ("Hello there.", "A calm and quiet day.", "Where is the train?",
         "Speak softly, please.", "It rains in the morning.", "Good night.")
STEPS = 3


def _any_trainer() -> bool:
    from mizuoto.registry import trainers

    return bool(trainers())


__test__ = _any_trainer()  # no trainer installed: nothing to collect here (not a skip)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # trainer_case: every trainer; stopping_trainer_case: those that declare graceful_stop
    for argname in ("trainer_case", "stopping_trainer_case"):
        if argname in metafunc.fixturenames:
            _parametrize(metafunc, argname, graceful_only=argname == "stopping_trainer_case")


def _parametrize(metafunc: pytest.Metafunc, argname: str, graceful_only: bool) -> None:
    from mizuoto.registry import contract_fixtures, trainers

    wanted = set(metafunc.config.getoption("mizuoto_engine", default=[]) or [])
    fixtures = contract_fixtures()
    params, ids = [], []
    for (engine, name), trainer in sorted(trainers().items()):
        if wanted and engine not in wanted:
            continue
        if graceful_only and not getattr(trainer, "graceful_stop", False):
            continue
        own = [fixtures[key] for key in sorted(fixtures) if fixtures[key].engine == engine]
        for method in sorted(trainer.methods):
            params.append((trainer, own[0] if own else None, method))
            ids.append(f"{engine}-{name}-{method}")
    if not params:  # no trainer for the selected engines: deselected, not skipped
        from mizuoto_contract.plugin import deselect

        deselect(metafunc)
        metafunc.parametrize(argname, [None])
        return
    metafunc.parametrize(argname, params, ids=ids)


@pytest.fixture
def case(trainer_case, tmp_path_factory):
    return _case(trainer_case, tmp_path_factory)


@pytest.fixture
def stopping_case(stopping_trainer_case, tmp_path_factory):
    return _case(stopping_trainer_case, tmp_path_factory)


def _case(trainer_case, tmp_path_factory):
    trainer_cls, fixture, method = trainer_case
    assert fixture is not None, (f"trainer {trainer_cls.__name__} of engine {trainer_cls.engine} "
                                 "has no contract fixture to fine-tune: register one")
    root = tmp_path_factory.mktemp(f"{fixture.engine}-train")
    model_dir = root / "model"
    model_dir.mkdir()
    fixture.make(model_dir)
    return trainer_cls, fixture, method, model_dir, write_dataset(root / "data")


def write_dataset(directory: Path, extra_rows: list[dict] | None = None) -> Path:
    """Six voiced clips (0.6-1.4 s at 24 kHz) and ``train.jsonl``; returns the manifest."""
    from mizuoto.nn.dsp.audio_io import write_audio

    (directory / "wavs").mkdir(parents=True, exist_ok=True)
    rows = []
    for index, text in enumerate(TEXTS):
        seconds = 0.6 + 0.8 * index / (len(TEXTS) - 1)
        name = f"wavs/clip_{index}.wav"
        signal = np.roll(voiced_signal(SAMPLE_RATE, seconds), 97 * index)
        write_audio(directory / name, signal, SAMPLE_RATE, subtype="PCM_16")
        rows.append({"audio": name, "text": text})
    rows.extend(extra_rows or [])
    manifest = directory / "train.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return manifest


def _config(method, model_dir, manifest, output, steps=STEPS, save_every=1,
            learning_rate=1e-4):
    from mizuoto import TrainingConfig

    return TrainingConfig(method=method, model=str(model_dir), dataset=manifest,
                          output_dir=output, steps=steps, learning_rate=learning_rate, seed=3,
                          save_every=save_every)


def _weight_files(directory: Path) -> dict[str, bytes]:
    suffixes = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.suffix in suffixes}


def test_prepare_train_export_and_speak(case, tmp_path):
    from mizuoto import Capability, Reference, SynthesisRequest, TrainingResult
    from mizuoto.nn.dsp.audio_io import write_audio
    from mizuoto.registry import get_engine

    trainer_cls, fixture, method, model_dir, manifest = case
    trainer = trainer_cls()
    config = _config(method, model_dir, manifest, tmp_path / "run")
    trainer.check(config)
    run = trainer.prepare(config)
    seen = []
    result = trainer.train(run, progress=seen.append)
    assert isinstance(result, TrainingResult)
    assert result.steps_done == STEPS and result.resumed_from is None, (
        f"a fresh run of {STEPS} updates reports steps_done={result.steps_done}, resumed_from="
        f"{result.resumed_from}. Likely cause: TrainingResult built from another count, or a "
        f"checkpoint found where none was; count the updates done in this output_dir")
    reported = [p.done for p in seen if p.stage == "train"]
    assert reported and reported[-1] == STEPS, (
        f"the train progress reports reached {reported[-1:] or 'nothing'}, not {STEPS}. Likely "
        f"cause: progress not reported per update; report(progress, 'train', done, total)")
    assert all(np.isfinite(v) for v in result.metrics.values()), (
        f"TrainingResult.metrics holds non-finite values: {dict(result.metrics)}. Likely "
        f"cause: a loss that diverged or a metric divided by zero")
    exported = trainer.export(run, tmp_path / "export")
    assert exported.is_dir() and _weight_files(exported), (
        f"export() gave {exported}, with no weight files (.safetensors, .pt, ...). Likely "
        f"cause: the export writes elsewhere; write the model directory at the destination")

    engine = get_engine(fixture.engine).load(exported, options=CONTRACT_OPTIONS)
    fields = {"seed": 1, "steps": fixture.steps, "params": fixture.request_params}
    if Capability.CLONE in engine.info.capabilities:
        rate = engine.info.sample_rate
        reference = write_audio(tmp_path / "ref.wav", voiced_signal(rate), rate,
                                subtype="PCM_16")
        fields["reference"] = Reference(reference, text=REFERENCE_TEXT)
    audio = engine.synthesize(SynthesisRequest("Hello.", **fields)).audio
    samples = np.asarray(audio.samples)
    assert samples.size > 0 and np.isfinite(samples).all(), (
        "the exported model speaks empty or non-finite audio. Likely cause: the export holds "
        "untrained or broken weights (a missing tensor left at its initial value)")


_SIGNALLED = """
import json, os, signal, sys
from mizuoto import TrainingConfig
from mizuoto.registry import trainers
engine, name, method, model, data, output, kill_at, signal_name, save_every = sys.argv[1:10]
trainer = trainers()[(engine, name)]()
config = TrainingConfig(method=method, model=model, dataset=data, output_dir=output,
                        steps={steps}, learning_rate=1e-4, seed=3, save_every=int(save_every))
def progress(p):
    if p.stage == "train" and p.done == int(kill_at):
        os.kill(os.getpid(), getattr(signal, signal_name))
result = trainer.train(trainer.prepare(config), progress=progress)
print(json.dumps({{"interrupted": result.interrupted, "steps_done": result.steps_done}}))
"""


def _signalled_run(trainer_cls, method, model_dir, manifest, output, kill_at, signal_name,
                   save_every):
    """A training run in a subprocess that sends itself ``signal_name`` from its
    ``kill_at``-th ``train`` progress report."""
    script = textwrap.dedent(_SIGNALLED).format(steps=STEPS)
    return subprocess.run(
        [sys.executable, "-c", script, trainer_cls.engine, trainer_cls.__name__, method,
         str(model_dir), str(manifest), str(output), str(kill_at), signal_name,
         str(save_every)],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, timeout=600)


@pytest.mark.parametrize("kill_at", [1, 2], ids=["first-update", "second-update"])
def test_resume_after_sigkill_exports_the_same_weights(case, tmp_path, kill_at):
    """Killed at its first (a schedule restarted on resume shows there, before the rate saved
    with the optimizer hides it) or second update's progress report, the run resumes from
    its last checkpoint and exports an uninterrupted run's weights."""
    trainer_cls, _, method, model_dir, manifest = case
    killed = _signalled_run(trainer_cls, method, model_dir, manifest, tmp_path / "killed",
                            kill_at, "SIGKILL", save_every=1)
    assert killed.returncode == -9, killed.stderr.decode(errors="replace")[-3000:]
    resumed = _resume_and_compare(trainer_cls, method, model_dir, manifest, tmp_path,
                                  "killed", save_every=1)
    assert resumed.resumed_from in (kill_at - 1 or None, kill_at), (
        f"killed after update {kill_at} (checkpoints every update), the run resumed from "
        f"{resumed.resumed_from}. Likely cause: the checkpoint is saved after the progress "
        f"report, or not found on resume; save it before reporting the update")


# A run that kills itself (SIGKILL) in the middle of its first checkpoint save after update 1:
# a weight file written in place is cut to half its bytes first; one written to a temporary
# name dies before the rename. Patched before anything imports the savers.
_KILLED_IN_SAVE = """
import json, os, signal, sys
from pathlib import Path
import torch, safetensors.torch
SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")
armed = []
def die():
    os.kill(os.getpid(), signal.SIGKILL)
def weights(path):
    return Path(path).suffix in SUFFIXES or Path(path).is_dir()
def moving(real):
    def move(src, dst, *args, **kwargs):
        if armed and weights(dst) and weights(src):
            die()
        return real(src, dst, *args, **kwargs)
    return move
def writing(real):
    def write(obj, path, *args, **kwargs):
        real(obj, path, *args, **kwargs)
        if armed and isinstance(path, (str, os.PathLike)) and weights(path):
            data = Path(path).read_bytes()
            Path(path).write_bytes(data[:len(data) // 2])
            die()
    return write
os.replace, os.rename = moving(os.replace), moving(os.rename)
torch.save = writing(torch.save)
safetensors.torch.save_file = writing(safetensors.torch.save_file)
from mizuoto import TrainingConfig
from mizuoto.registry import trainers
engine, name, method, model, data, output = sys.argv[1:7]
trainer = trainers()[(engine, name)]()
config = TrainingConfig(method=method, model=model, dataset=data, output_dir=output,
                        steps={steps}, learning_rate=1e-4, seed=3, save_every=1)
def progress(p):
    if p.stage == "train" and p.done == 1:
        armed.append(True)
trainer.train(trainer.prepare(config), progress=progress)
"""


def test_resume_after_sigkill_during_a_checkpoint_save_or_a_named_refusal(case, tmp_path):
    """A run killed in the middle of saving its checkpoint after update 2 (a weight file half
    written in place, or a temporary one never renamed) resumes and exports an uninterrupted
    run's weights, or the resume is refused with a MizuotoError naming the checkpoint."""
    from mizuoto.errors import MizuotoError

    trainer_cls, _, method, model_dir, manifest = case
    script = textwrap.dedent(_KILLED_IN_SAVE).format(steps=STEPS)
    killed = subprocess.run(
        [sys.executable, "-c", script, trainer_cls.engine, trainer_cls.__name__, method,
         str(model_dir), str(manifest), str(tmp_path / "killed")],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, timeout=600)
    if killed.returncode == 0:
        pytest.skip("the run saved no weight file the suite could interrupt (not through "
                    "os.replace, os.rename, torch.save or safetensors' save_file)")
    assert killed.returncode == -9, killed.stderr.decode(errors="replace")[-3000:]
    try:
        _resume_and_compare(trainer_cls, method, model_dir, manifest, tmp_path, "killed",
                            save_every=1)
    except MizuotoError:
        return  # refused by name
    except Exception as exc:
        pytest.fail(f"resuming a run killed while saving its checkpoint raised "
                    f"{type(exc).__name__}: {exc}. Likely cause: the checkpoint is written in "
                    f"place, so a kill leaves it torn; write it to a temporary name and rename "
                    f"it (mizuoto.plugin.atomic_path), or refuse a torn one with a "
                    f"MizuotoError naming it", pytrace=False)


def test_a_stop_signal_saves_the_checkpoint_and_resumes_identically(stopping_case, tmp_path):
    """SIGTERM at the first progress report, with no periodic save before the end: the run
    returns (no exception) with ``interrupted="SIGTERM"`` at an update before the last, its
    checkpoint saved there; resumed, it exports the weights of an uninterrupted run."""
    trainer_cls, _, method, model_dir, manifest = stopping_case
    stopped = _signalled_run(trainer_cls, method, model_dir, manifest, tmp_path / "stopped", 1,
                             "SIGTERM", save_every=STEPS)
    assert stopped.returncode == 0, (
        f"{trainer_cls.__name__} declares graceful_stop but SIGTERM ended the process "
        f"({stopped.returncode}): " + stopped.stderr.decode(errors="replace")[-3000:])
    result = json.loads(stopped.stdout.decode().strip().splitlines()[-1])
    assert result["interrupted"] == "SIGTERM", f"TrainingResult.interrupted is {result}"
    assert 1 <= result["steps_done"] < STEPS, (
        f"a stop requested at update 1 of {STEPS} must end the run at the next update "
        f"boundary; it ended at {result['steps_done']}")
    resumed = _resume_and_compare(trainer_cls, method, model_dir, manifest, tmp_path,
                                  "stopped", save_every=STEPS)
    assert resumed.resumed_from == result["steps_done"], (
        "the resumed run did not start from the checkpoint saved at the stop")


def _resume_and_compare(trainer_cls, method, model_dir, manifest, tmp_path, name, save_every):
    """Train again on ``tmp_path / name`` to the end, and an uninterrupted run; their exported
    weight files must be the same bytes. Returns the resumed run's result."""
    trainer = trainer_cls()
    run = trainer.prepare(_config(method, model_dir, manifest, tmp_path / name,
                                  save_every=save_every))
    resumed = trainer.train(run)
    assert resumed.steps_done == STEPS and resumed.interrupted is None, (
        f"the resumed run ended at {resumed.steps_done} of {STEPS} (interrupted "
        f"{resumed.interrupted!r}). Likely cause: the resume counts the updates from 0, or "
        f"stops at the checkpoint's count; continue to config.steps")
    resumed_weights = _weight_files(trainer.export(run, tmp_path / "resumed-export"))

    straight_run = trainer.prepare(_config(method, model_dir, manifest, tmp_path / "straight",
                                           save_every=save_every))
    straight = trainer.train(straight_run)
    assert straight.steps_done == STEPS
    straight_weights = _weight_files(trainer.export(straight_run, tmp_path / "straight-export"))
    assert resumed_weights.keys() == straight_weights.keys(), (
        f"the resumed export holds {sorted(resumed_weights)}, an uninterrupted run's "
        f"{sorted(straight_weights)}")
    for file, data in straight_weights.items():
        assert resumed_weights[file] == data, (
            f"{file} differs after the resumed run: "
            f"{_tensor_difference(resumed_weights[file], data)}. Likely cause: state that the "
            f"checkpoint does not hold (optimizer moments, the LR schedule's position, an RNG "
            f"or data-order state) or a save after the progress report; or, when no tensor "
            f"differs, bytes that are not weights (a timestamp, a path) in the file")
    return resumed


def _tensors(data: bytes) -> dict:
    """The tensors of a weight file's bytes (safetensors, else a torch pickle)."""
    import io

    import torch

    try:
        from safetensors.torch import load

        return dict(load(data))
    except Exception:  # not safetensors: a torch pickle (.pt, .bin, .ckpt)
        loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        flat: dict = {}

        def walk(prefix, value):
            if isinstance(value, torch.Tensor):
                flat[prefix] = value
            elif isinstance(value, dict):
                for key, item in value.items():
                    walk(f"{prefix}.{key}" if prefix else str(key), item)

        walk("", loaded)
        return flat


def _tensor_difference(resumed: bytes, straight: bytes) -> str:
    """The first tensor that differs between two weight files' bytes, in words."""
    from mizuoto_contract.compare import first_differing_tensor

    try:
        differs = first_differing_tensor(_tensors(resumed), _tensors(straight))
    except Exception as exc:  # unreadable: say so rather than hide the byte difference
        return f"the files differ and could not be read as tensors ({exc!r})"
    return (f"first differing tensor {differs}" if differs is not None
            else "every tensor is equal, the other bytes differ")


def test_the_learning_rate_changes_the_export(case, tmp_path):
    """Two runs that differ only in ``learning_rate`` must export different weights."""
    trainer_cls, _, method, model_dir, manifest = case
    trainer = trainer_cls()
    exported = []
    rates = (1e-4, 1e-2)
    for rate in rates:
        run = trainer.prepare(_config(method, model_dir, manifest, tmp_path / f"run-{rate}",
                                      learning_rate=rate))
        trainer.train(run)
        exported.append(_weight_files(trainer.export(run, tmp_path / f"export-{rate}")))
    assert exported[0] != exported[1], (
        f"learning rates {rates[0]:g} and {rates[1]:g} exported the same weights. Likely "
        f"cause: the trainer ignores TrainingConfig.learning_rate (an optimizer built with a "
        f"fixed lr), or exports the base weights rather than the trained ones")


# (what changes, its name in a refusal, the TrainingConfig fields of the changed run)
_BATCHING = (("batch size 1 and 4", "batch_size", {"batch_size": 4}),
             ("gradient accumulation 1 and 2", "grad_accumulation",
              {"params": {"grad_accumulation": 2}}))


def test_batch_size_and_accumulation_change_the_export_or_are_refused(case, tmp_path):
    """A run with batch size 4, and one with ``params.grad_accumulation=2``, each export other
    weights than one with batch size 1 and no accumulation; or the trainer refuses the setting
    with ``InvalidRequest`` naming it (before training)."""
    from mizuoto.errors import InvalidRequest

    trainer_cls, _, method, model_dir, manifest = case
    trainer = trainer_cls()

    def export(name, **fields):
        # the learning rate test's larger rate: a small one's updates (within a warm-up) can
        # vanish in bfloat16 weights, exporting the base weights whatever the batch
        config = attrs.evolve(_config(method, model_dir, manifest, tmp_path / name,
                                      learning_rate=1e-2), **fields)
        run = trainer.prepare(config)
        trainer.train(run)
        return _weight_files(trainer.export(run, tmp_path / f"{name}-export"))

    plain = export("plain")
    for what, name, fields in _BATCHING:
        try:
            changed = export(name, **fields)
        except InvalidRequest as exc:  # the field, or the message of an unknown-params refusal
            assert name in exc.field or name in str(exc), (
                f"{what}: the trainer refused the run without naming {name}: {exc}")
            continue
        assert changed != plain, (
            f"{what} exported the same weights. Likely cause: the trainer ignores "
            f"{'TrainingConfig.batch_size' if name == 'batch_size' else 'params.' + name} (a "
            f"fixed batch, one micro-batch per update); use it, or refuse a value it cannot "
            f"do with InvalidRequest naming {name}")


# A run of WARMUP_RUN updates whose first WARMUP updates warm the learning rate up.
WARMUP_RUN, WARMUP = 4, 3


def _reported(output_dir: Path, name: str) -> dict[int, float]:
    """``name`` per update, as the run logged it in ``metrics.jsonl`` (rows keyed ``step`` or
    ``update``)."""
    from mizuoto.training.metrics import METRICS_FILE, read_metrics

    values = {}
    for row in read_metrics(Path(output_dir) / METRICS_FILE):
        step = row.get("step", row.get("update"))
        if step is not None and name in row:
            values[int(step)] = float(row[name])
    return values


@pytest.mark.since_api("1.1")
def test_the_learning_rate_follows_the_declared_warm_up(case, tmp_path):
    """With ``params.warmup_updates=3`` over 4 updates, the learning rate each update logs
    (``lr`` in the run's ``metrics.jsonl``) starts below ``TrainingConfig.learning_rate``,
    rises over the warm-up and never exceeds it; or the trainer refuses the param by name."""
    from mizuoto.errors import InvalidRequest

    trainer_cls, _, method, model_dir, manifest = case
    trainer = trainer_cls()
    rate = 1e-3
    config = attrs.evolve(_config(method, model_dir, manifest, tmp_path / "run",
                                  steps=WARMUP_RUN, save_every=WARMUP_RUN, learning_rate=rate),
                          params={"warmup_updates": WARMUP})
    try:
        trainer.train(trainer.prepare(config))
    except InvalidRequest as exc:
        assert "warmup_updates" in exc.field or "warmup_updates" in str(exc), (
            f"the trainer refused params.warmup_updates without naming it: {exc}")
        return
    lr = _reported(tmp_path / "run", "lr")
    assert len(lr) >= WARMUP, (
        f"the run's metrics.jsonl logs lr for updates {sorted(lr)} of {WARMUP_RUN}. Likely "
        f"cause: the learning rate is not logged; return {{'lr': ...}} from each update "
        f"(mizuoto.plugin's MetricsLog writes metrics.jsonl), so a schedule can be checked")
    steps = sorted(lr)
    first, warmed = lr[steps[0]], max(lr[step] for step in steps[:WARMUP])
    assert first < rate and first < warmed, (
        f"with params.warmup_updates={WARMUP} the logged learning rate is "
        f"{[lr[s] for s in steps]} (learning_rate {rate:g}). Likely cause: the trainer ignores "
        f"the warm-up (its scheduler is built without warmup_updates, or starts after it); "
        f"raise the rate from near zero to learning_rate over the first warmup_updates")
    assert max(lr.values()) <= rate * (1 + 1e-6), (
        f"the logged learning rate reaches {max(lr.values()):g}, above learning_rate "
        f"{rate:g}. Likely cause: the schedule multiplies the rate (a factor above 1, a "
        f"warm-up that overshoots); end the warm-up at learning_rate")


@pytest.mark.since_api("1.1")
def test_gradient_clipping_changes_the_export_or_is_refused(case, tmp_path):
    """A run with ``params.max_grad_norm=1e-6`` (every update clipped far down) exports other
    weights than one with ``max_grad_norm=0`` (no clipping); or the trainer refuses the param
    by name."""
    from mizuoto.errors import InvalidRequest

    trainer_cls, _, method, model_dir, manifest = case
    trainer = trainer_cls()
    exported = {}
    for norm in (0.0, 1e-6):
        config = attrs.evolve(_config(method, model_dir, manifest, tmp_path / f"run-{norm:g}",
                                      learning_rate=1e-2), params={"max_grad_norm": norm})
        try:
            run = trainer.prepare(config)
            trainer.train(run)
        except InvalidRequest as exc:
            assert "max_grad_norm" in exc.field or "max_grad_norm" in str(exc), (
                f"the trainer refused params.max_grad_norm without naming it: {exc}")
            return
        exported[norm] = _weight_files(trainer.export(run, tmp_path / f"export-{norm:g}"))
    assert exported[0.0] != exported[1e-6], (
        "params.max_grad_norm 0 (no clipping) and 1e-6 exported the same weights. Likely "
        "cause: the trainer ignores max_grad_norm (no clip_grad_norm_ before the optimizer "
        "step, or it clips a copy of the gradients); clip them, or refuse the param")


def test_bad_rows_are_skipped_and_named(case, tmp_path, caplog):
    trainer_cls, _, method, model_dir, _ = case
    bad = [{"audio": "wavs/no_such_file.wav", "text": "Missing."},
           {"audio": "wavs/clip_0.wav", "text": ""}]
    manifest = write_dataset(tmp_path / "data", extra_rows=bad)
    trainer = trainer_cls()
    with caplog.at_level(logging.WARNING):
        run = trainer.prepare(_config(method, model_dir, manifest, tmp_path / "run", steps=1))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    for row in (len(TEXTS) + 1, len(TEXTS) + 2):
        named = re.compile(rf"\b(row|line) {row}\b")
        assert any("skipped" in m and named.search(m) for m in warnings), (
            f"no warning names skipped row {row}: {warnings}")
    assert trainer.train(run).steps_done == 1
