"""`EpochPosition`, `RunnerSession` with a position and a recipe, `StepTrainer`'s one choice
of device and precision and its seeded random scope, `sampling`, `torch_threads`."""

from __future__ import annotations

import random

import pytest
import torch

from mizuoto.contracts.trainer import TrainingConfig
from mizuoto.errors import InvalidRequest
from mizuoto.runtime.threads import torch_threads
from mizuoto.training import (
    EpochPosition,
    ProcessWorld,
    RecipeQuirks,
    RunnerSession,
    StepTrainer,
    TrainingRunner,
)
from mizuoto.training.audio_samples import sampling
from mizuoto.training.state import load_state_file


def _orders(epochs_seen):
    def new_order(epoch):
        epochs_seen.append(epoch)
        return [[epoch * 10 + i] for i in range(5)]
    return new_order


def test_an_epoch_ends_an_update_and_restarts_the_accumulation_count():
    """5 batches, accumulation 2: updates of 2, 2 and 1 (the epoch's end), then again."""
    seen = []
    position = EpochPosition(5, epochs=2, new_order=_orders(seen), grad_accumulation=2)
    assert position.schedule_updates == position.total_updates == 6
    counts, batches = [], []
    for _ in range(6):
        count = position.micro_batches()
        counts.append(count)
        batches += [position.next_batch() for _ in range(count)]
        position.update += 1
    assert counts == [2, 2, 1, 2, 2, 1]
    assert batches == [[0], [1], [2], [3], [4], [10], [11], [12], [13], [14]]
    assert seen == [0, 1] and position.epoch == 2


def test_max_updates_cut_the_run_not_the_schedule():
    position = EpochPosition(5, epochs=2, new_order=_orders([]), max_updates=4)
    assert (position.schedule_updates, position.total_updates) == (10, 4)


def test_sharded_ranks_take_every_nth_batch_wrapping_around():
    world = ProcessWorld(size=2, rank=1, local_rank=1)
    position = EpochPosition(5, epochs=1, new_order=_orders([]), world=world)
    assert position.batches_per_epoch == 3
    assert [position.next_batch() for _ in range(3)] == [[1], [3], [0]]
    unsharded = EpochPosition(5, epochs=1, new_order=_orders([]), world=world, shard=False)
    assert unsharded.batches_per_epoch == 5 and not unsharded.shard


def test_a_position_resumes_mid_epoch_with_the_same_order():
    seen = []
    first = EpochPosition(5, epochs=2, new_order=_orders(seen))
    [first.next_batch() for _ in range(3)]
    resumed = EpochPosition(5, epochs=2, new_order=_orders(seen))
    resumed.load_state_dict(first.state_dict())
    assert resumed.next_batch() == first.next_batch() == [3]
    assert seen == [0]  # the order was not drawn again


def _session(seed, recipe=None, epochs=2, batch_log=None):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 1)
    # the loop logs after the schedule's step: the last micro-batch's rate is the next update's
    runner = TrainingRunner(grad_accumulation=2, quirks=RecipeQuirks(logs_next_update_lr=True))
    runner.optimize(model, learning_rate=0.1, schedule="linear", warmup=1, total=6)
    data = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    draws = random.Random(3)
    position = EpochPosition(5, epochs=epochs, grad_accumulation=2,
                             new_order=lambda epoch: [[i] for i in range(5)])

    def loss(batch):
        noise = draws.random()  # a trainer's own generator, saved with the checkpoint
        return {"loss": (model(data[batch]) - noise).pow(2).mean()}

    return RunnerSession(runner, model, total=position.total_updates,
                         next_batch=position.next_batch, loss=loss,
                         generators={"draws": draws}, position=position,
                         recipe=recipe or {"epochs": epochs}, batch_log=batch_log)


def test_a_runner_session_with_a_position_resumes_to_the_same_bytes(tmp_path):
    straight = _session(0)
    for _ in range(6):
        straight.update()
    stopped = _session(0)
    for _ in range(3):
        stopped.update()
    stopped.save(tmp_path / "last.pt", 3)
    state = load_state_file(tmp_path / "last.pt")
    assert state["update"] == 3 and state["position"]["update"] == 3
    assert state["settings"] == {"epochs": 2} and len(state["rng"]) == 1
    resumed = _session(5)
    assert resumed.load(tmp_path / "last.pt") == 3
    for _ in range(3):
        resumed.update()
    assert torch.equal(resumed.model.weight, straight.model.weight)
    assert resumed.position.state_dict() == straight.position.state_dict()


def test_the_batch_log_has_every_micro_batch_as_a_loop_logging_each_sees_it(tmp_path):
    """Micro-batches 2, 2, 1: the update count and learning rate before the update, the last
    micro-batch's after it; kept in the checkpoint and written to the log at each save."""
    import json

    session = _session(0, batch_log=tmp_path / "log.jsonl")
    lrs = []
    for _ in range(3):
        lrs.append(session.runner.scheduler.get_last_lr()[0])
        values = session.update()
    assert [r[0] for r in session.records] == [0, 1, 1, 2, 3]
    assert [r[2] for r in session.records] == [lrs[0], lrs[1], lrs[1], lrs[2],
                                              session.runner.scheduler.get_last_lr()[0]]
    assert session.records[-1][1] == values["loss"]
    session.save(tmp_path / "last.pt", 3)
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [tuple(row.values()) for row in rows] == session.records
    assert list(rows[0]) == ["update", "loss", "lr"]
    resumed = _session(0, batch_log=tmp_path / "other.jsonl")
    resumed.load(tmp_path / "last.pt")
    assert resumed.records == session.records
    assert resumed.result_metrics({}) == {"loss": values["loss"], "lr": session.records[-1][2]}


def test_a_resume_with_other_settings_is_refused_before_loading(tmp_path):
    session = _session(0)
    session.update()
    session.save(tmp_path / "last.pt", 1)
    other = _session(0, recipe={"epochs": 3}, epochs=3)
    before = other.model.weight.detach().clone()
    with pytest.raises(InvalidRequest, match="other settings"):
        other.load(tmp_path / "last.pt")
    assert torch.equal(other.model.weight, before)


def test_a_checkpoint_of_an_older_session_is_refused_by_name(tmp_path):
    from mizuoto.training.state import save_state_file

    session = _session(0)
    save_state_file(tmp_path / "last.pt", {"model": session.model.state_dict(),
                                           "torch_rng": torch.get_rng_state()})
    with pytest.raises(InvalidRequest, match="older trainer"):
        session.load(tmp_path / "last.pt")


class _Toy(StepTrainer):
    engine, methods = "toy", frozenset({"full"})
    prepare = start = write_export = None


def _config(**kwargs):
    return TrainingConfig("full", "m", "d", "o", steps=2, **kwargs)


def test_device_and_precision_is_chosen_in_one_place():
    class Upstream(_Toy):
        device_auto = staticmethod(lambda: torch.device("cpu"))
        precision_auto = {"cpu": "bf16"}
        precision_cuda_only = ("bf16", "fp16")
        precision_cuda_only_why = "upstream autocasts on CUDA only"

    device, mode = _Toy().device_and_precision(_config())
    assert device.type in ("cpu", "cuda", "mps") and mode == "no"
    assert _Toy().device_and_precision(_config(mixed_precision="bf16"), "cpu")[1] == "bf16"
    with pytest.raises(InvalidRequest, match="fp16 needs a CUDA device"):
        _Toy().device_and_precision(_config(mixed_precision="fp16"), "cpu")
    with pytest.raises(InvalidRequest, match="upstream autocasts on CUDA only"):
        Upstream().device_and_precision(_config())

    class Run:
        config = _config(mixed_precision="bf16")

    runner = _Toy().runner(Run(), ProcessWorld(), device="cpu")
    assert runner.mixed_precision == "bf16" and runner.device == torch.device("cpu")


def test_a_trainer_seeding_torch_does_it_in_a_forked_generator():
    class Seeding(_Toy):
        seeds_torch = True

    class Run:
        config = _config(seed=11)

    torch.manual_seed(0)
    outside = torch.get_rng_state()
    with Seeding().random_scope(Run()):
        inside = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), outside)
    torch.manual_seed(11)
    assert torch.equal(inside, torch.rand(3))
    with _Toy().random_scope(Run()):
        assert not torch.equal(torch.rand(3), inside)


def test_sampling_draws_none_of_the_runs_numbers_and_restores_the_mode():
    model = torch.nn.Linear(2, 2).train()
    before = torch.get_rng_state()
    with sampling(model) as device:
        torch.rand(4)
        model.eval()
        assert torch.is_inference_mode_enabled() and device == torch.device("cpu")
    assert model.training and torch.equal(torch.get_rng_state(), before)


def test_torch_threads_sets_and_restores_the_count():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
