"""Files a trainer writes beside its checkpoints and exports: a numbered folder's torch files
(`write_step_files`) and a base model's files carried into an export (`copy_model_files`)."""

from __future__ import annotations

import json
import os
import stat

import torch

from mizuoto.runtime.atomic import copy_model_files, file_mode
from mizuoto.training import TrainingRunner
from mizuoto.training.checkpoint_folder import write_step_files


def test_step_files_are_torchs_own(tmp_path):
    model = torch.nn.Linear(3, 2)
    runner = TrainingRunner()
    runner.optimize(model, learning_rate=0.1, schedule="cosine", warmup=1, total=4)
    runner.update(lambda: torch.ones(1, 3), lambda x: {"loss": model(x).sum()})
    write_step_files(tmp_path, 7, runner)
    assert json.loads((tmp_path / "training_state.json").read_text()) == {"step": 7}
    optimizer = torch.load(tmp_path / "optimizer.pth", weights_only=True)
    assert optimizer["state"][0]["step"] == 1
    assert torch.equal(optimizer["state"][0]["exp_avg"],
                       runner.optimizer.state_dict()["state"][0]["exp_avg"])
    scheduler = torch.load(tmp_path / "scheduler.pth", weights_only=True)
    assert scheduler["last_epoch"] == 1


def test_model_files_are_linked_or_copied_with_the_umask_mode(tmp_path):
    base, export, copied = tmp_path / "base", tmp_path / "export", tmp_path / "copied"
    for folder in (base, export, copied):
        folder.mkdir()
    (base / "config.json").write_text("{}")
    (base / "weights.bin").write_bytes(b"12345")
    os.chmod(base / "weights.bin", 0o600)
    names = ["config.json", "weights.bin", "absent.json"]
    assert copy_model_files(base, export, names, hard_link=True) == names[:2]
    assert os.path.samefile(base / "weights.bin", export / "weights.bin")
    assert copy_model_files(base, copied, names) == names[:2]
    assert (copied / "weights.bin").read_bytes() == b"12345"
    assert not os.path.samefile(base / "weights.bin", copied / "weights.bin")
    assert stat.S_IMODE((copied / "weights.bin").stat().st_mode) == file_mode()


def test_a_folder_checkpoint_is_found_only_when_complete(tmp_path):
    from pathlib import Path

    from mizuoto.training import StepTrainer

    class Folders(StepTrainer):
        engine, methods = "toy", frozenset({"full"})
        prepare = start = write_export = None
        checkpoint = Path("checkpoints") / "latest"
        checkpoint_folders = True

    folder = tmp_path / "checkpoints" / "latest"
    folder.mkdir(parents=True)
    assert Folders().find_checkpoint(tmp_path) is None  # no step file: a save cut short
    (folder / "training_state.json").write_text('{"step": 2}')
    assert Folders().find_checkpoint(tmp_path) == folder
