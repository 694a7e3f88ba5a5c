"""What the trainer contract's modules share (`test_trainer_contract`,
`test_trainer_contract_resume`): the parametrization over every registered trainer and method,
the fixtures that make a contract fixture's model and a small voiced data set, the run's
configuration and the exported weight files.

A module of the trainer contract takes its cases with one import, which pytest then reads as
the module's own::

    from mizuoto_contract.trainer_cases import (  # noqa: F401 (read by pytest)
        __test__, case, pytest_generate_tests, stopping_case)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mizuoto_contract.reference import voiced_signal

SAMPLE_RATE = 24000
TEXTS = ("Hello there.", "A calm and quiet day.", "Where is the train?",
         "Speak softly, please.", "It rains in the morning.", "Good night.")
STEPS = 3


def _any_trainer() -> bool:
    from mizuoto.registry import trainers

    return bool(trainers())


#: pytest's collection switch of the modules that import it: no trainer installed, nothing to
#: collect (not a skip)
__test__ = _any_trainer()


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

