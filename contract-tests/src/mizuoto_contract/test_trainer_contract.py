"""The trainer contract, run against every registered trainer (``register_trainers``).

Each trainer fine-tunes the first contract fixture of its engine (``register_contract_fixtures``)
on a small synthetic data set: a JSONL manifest (``{"audio": path, "text": ...}``, paths relative
to the manifest) of voiced clips. Every method the trainer declares is tested:

- prepare -> train a few steps -> export -> the engine loads the export and speaks;
- interrupted runs (SIGKILL, a kill during a checkpoint save, SIGTERM): in
  `test_trainer_contract_resume`;
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

import logging
import re
from pathlib import Path

import attrs
import numpy as np
import pytest

from mizuoto_contract.models import CONTRACT_OPTIONS
from mizuoto_contract.reference import REFERENCE_TEXT, voiced_signal

# the cases (every registered trainer and method, and the model + data set each check starts
# from) and the collection switch, read by pytest as this module's own
from mizuoto_contract.trainer_cases import (  # noqa: F401
    STEPS,
    TEXTS,
    __test__,
    _config,
    _weight_files,
    case,
    pytest_generate_tests,
    stopping_case,
    write_dataset,
)


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
