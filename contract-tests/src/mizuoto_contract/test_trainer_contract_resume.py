"""The trainer contract, interrupted runs: a run killed with SIGKILL (at the first update and
later, and in the middle of a checkpoint save) resumes from its last checkpoint and exports the
same weight files, byte for byte, as a run never interrupted, or is refused by name; a trainer
that declares ``graceful_stop`` stops at an update boundary on SIGTERM, saves and resumes
identically. Cases and fixtures as in `test_trainer_contract` (`mizuoto_contract.trainer_cases`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# the cases (every registered trainer and method, and the model + data set each check starts
# from) and the collection switch, read by pytest as this module's own
from mizuoto_contract.trainer_cases import (  # noqa: F401
    STEPS,
    __test__,
    _config,
    _weight_files,
    case,
    pytest_generate_tests,
    stopping_case,
)
from mizuoto_contract.versions import require

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
    run's weights, or the resume is refused with a MizuotoError naming the checkpoint. A run
    that saves no weight file the suite can interrupt fails (API 1.1)."""
    from mizuoto.errors import MizuotoError

    trainer_cls, _, method, model_dir, manifest = case
    script = textwrap.dedent(_KILLED_IN_SAVE).format(steps=STEPS)
    killed = subprocess.run(
        [sys.executable, "-c", script, trainer_cls.engine, trainer_cls.__name__, method,
         str(model_dir), str(manifest), str(tmp_path / "killed")],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, timeout=600)
    # a plugin written for API 1.0 is warned (PluginAPIDeprecation), never skipped
    require(killed.returncode != 0, (
        "the run finished: it saved no weight file the suite could interrupt, so a kill "
        "during its checkpoint save went unchecked. Likely cause: the checkpoint is written "
        "another way than os.replace, os.rename, torch.save or safetensors' save_file; write "
        "it with torch.save or save_file under mizuoto.plugin.atomic_path"), since="1.1")
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

