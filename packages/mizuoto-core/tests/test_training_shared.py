"""The pieces both engines' trainers share through mizuoto.training: checkpoint folders, the
DataLoader's draw order, initialisation draws, frozen weights, validation, audio samples,
manifests beside each other, pinned run settings, state files."""

from __future__ import annotations

import pytest
import torch

from mizuoto.errors import InvalidRequest
from mizuoto.training import RunDirectory, TrainingRunner
from mizuoto.training.checkpoint_folder import (
    find_checkpoint_folder,
    load_checkpoint_folder,
    save_checkpoint_folder,
)
from mizuoto.training.frozen_weights import frozen_linears, frozen_linears_to
from mizuoto.training.init_draws import conv, linear, replay
from mizuoto.training.loader_order import EpochSampler, SampleBatches, shuffled
from mizuoto.training.manifest import find_manifests
from mizuoto.training.state import load_state_file, save_state_file
from mizuoto.training.validation import is_due, mean_losses, validation_batches


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[0].requires_grad_(False)
    return model


def test_a_checkpoint_folder_restores_the_trainable_weights_runner_and_own_state(tmp_path):
    model, runner = _model(), TrainingRunner()
    runner.optimize(model, learning_rate=0.1, schedule="constant", warmup=0, total=4)
    runner.update(lambda: torch.ones(2, 3), lambda x: {"loss": model(x).square().mean()})
    folder = tmp_path / "checkpoints" / "latest"
    save_checkpoint_folder(folder, 1, model=model, runner=runner, own={"position": 5})
    assert find_checkpoint_folder(folder) == folder
    assert find_checkpoint_folder(tmp_path / "none") is None
    trained = model[1].weight.detach().clone()
    other, other_runner = _model(), TrainingRunner()
    other_runner.optimize(other, learning_rate=0.1, schedule="constant", warmup=0, total=4)
    assert not torch.equal(other[1].weight, trained)
    step, own = load_checkpoint_folder(folder, model=other, runner=other_runner)
    assert (step, own) == (1, {"position": 5})
    assert torch.equal(other[1].weight, trained)
    assert other_runner.scheduler.state_dict() == runner.scheduler.state_dict()


def test_epoch_sampler_resumes_mid_pass_with_the_same_order():
    def batches(sampler, count):
        return [sampler.next_batch() for _ in range(count)]

    first = EpochSampler(5, 2, torch.Generator().manual_seed(3))
    head = batches(first, 3)  # the third batch starts a new pass (drop_last)
    state, generator_state = first.state(), first.generator.get_state()
    tail = batches(first, 3)
    resumed = EpochSampler(5, 2, torch.Generator().manual_seed(99))
    resumed.restore(state)
    resumed.generator.set_state(generator_state)
    assert batches(resumed, 3) == tail
    assert len({i for b in head[:2] for i in b}) == 4  # one pass: no row twice
    with pytest.raises(ValueError, match="fewer than one batch"):
        EpochSampler(1, 2, torch.Generator())


def test_shuffled_draws_a_loader_seed_then_the_sampler_seed():
    generator = torch.Generator().manual_seed(7)
    order = shuffled(6, generator)
    again = torch.Generator().manual_seed(7)
    torch.empty((), dtype=torch.int64).random_(generator=again)  # the loader's base seed
    seed = int(torch.empty((), dtype=torch.int64).random_(generator=again).item())
    assert order == torch.randperm(6, generator=torch.Generator().manual_seed(seed)).tolist()
    assert sorted(order) == list(range(6))


def test_sample_batches_keep_the_short_last_batch():
    batches = SampleBatches(5, 2, seed=666)
    assert len(batches) == 3
    assert [len(b) for b in batches.epoch()] == [2, 2, 1]


def test_replayed_init_draws_leave_the_generator_where_building_does():
    torch.manual_seed(11)
    torch.nn.Linear(3, 4)
    torch.nn.Conv1d(2, 6, 5, groups=2)
    torch.nn.Embedding(7, 3)
    built = torch.rand(3)
    generator = torch.Generator().manual_seed(11)
    drawn = replay(generator, [*linear(3, 4), *conv(2, 6, 5, groups=2), ("normal", 21)])
    assert drawn == 12 + 4 + 30 + 6 + 21
    assert torch.equal(torch.rand(3, generator=generator), built)


def test_frozen_linears_skip_trained_and_tied_layers():
    model = _model()
    assert frozen_linears(model) == [model[0]]
    assert frozen_linears_to(model, torch.bfloat16) == 1
    assert model[0].weight.dtype == torch.bfloat16 and model[1].weight.dtype == torch.float32


def test_validation_means_weight_the_total():
    outputs = [{"loss/a": torch.tensor(1.0), "loss/b": torch.tensor(2.0)},
               {"loss/a": torch.tensor(3.0), "loss/b": torch.tensor(4.0)}]
    means = mean_losses(outputs, {"loss/b": 0.5})
    assert means == {"val/loss/total": 3.5, "val/loss/a": 2.0, "val/loss/b": 3.0}
    assert [is_due(s, 3, 5) for s in range(5)] == [True, False, False, True, True]
    rows = validation_batches(5, 2, torch.Generator().manual_seed(0), max_batches=2)
    assert [len(b) for b in rows] == [2, 2]


def test_find_manifests_pairs_train_and_validation(tmp_path):
    (tmp_path / "train.jsonl").write_text("", encoding="utf-8")
    assert find_manifests(tmp_path) == (tmp_path / "train.jsonl", None)
    (tmp_path / "val.jsonl").write_text("", encoding="utf-8")
    assert find_manifests(tmp_path) == (tmp_path / "train.jsonl", tmp_path / "val.jsonl")
    (tmp_path / "more.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(InvalidRequest) as raised:
        find_manifests(tmp_path, field="params.val_manifest")
    assert raised.value.field == "params.val_manifest"


def test_pinned_settings_refuse_a_resume_with_others(tmp_path):
    run_dir = RunDirectory(tmp_path)
    run_dir.pin_settings({"steps": 3})
    run_dir.pin_settings({"steps": 3})  # the same: accepted
    with pytest.raises(InvalidRequest) as raised:
        run_dir.pin_settings({"steps": 4})
    assert raised.value.field == "output_dir"


def test_state_files_round_trip(tmp_path):
    save_state_file(tmp_path / "last.pt", {"update": 3, "w": torch.arange(3)})
    state = load_state_file(tmp_path / "last.pt")
    assert state["update"] == 3 and torch.equal(state["w"], torch.arange(3))
