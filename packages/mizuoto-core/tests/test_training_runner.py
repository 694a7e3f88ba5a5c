"""`TrainingRunner`: the update every trainer shares (accumulation, clipping, the optimiser and
its named schedule, EMA, memory levels, checkpoint state, recipe quirks), checked against the
same arithmetic written out by hand, with `torch.equal`."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from mizuoto.errors import InvalidRequest
from mizuoto.training import RecipeQuirks, TrainingRunner, build_schedule
from mizuoto.training.memory import checkpoint_activations
from mizuoto.training.schedules import SCHEDULES, check_warmup


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _batches(count: int, seed: int = 1) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 4, generator=generator) for _ in range(count)]


def _loss(model):
    return lambda batch: {"loss": model(batch).pow(2).mean()}


def _runner(model, **kwargs) -> TrainingRunner:
    schedule = kwargs.pop("schedule", "linear")
    runner = TrainingRunner(**kwargs)
    runner.optimize(model, learning_rate=1e-2, schedule=schedule, warmup=2, total=10)
    return runner


def _by_hand(model, batches, accumulation, max_norm):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = build_schedule("linear", optimizer, warmup=2, total=10)
    for batch in batches:
        (model(batch).pow(2).mean() / accumulation).backward()
    norm = (torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) if max_norm > 0 else
            torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
    optimizer.step()
    scheduler.step()
    return norm


@pytest.mark.parametrize("max_norm", [0.0, 0.05])
def test_an_update_divides_the_loss_and_clips_as_written_by_hand(max_norm):
    batches = _batches(3)
    ours, theirs = _model(), _model()
    runner = _runner(ours, grad_accumulation=3, max_grad_norm=max_norm)
    feed = iter(batches)
    values = runner.update(lambda: next(feed), _loss(ours))
    norm = _by_hand(theirs, batches, 3, max_norm)
    assert values["grad_norm"] == float(norm)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)
    assert all(p.grad is None for p in ours.parameters())  # zeroed for the next update
    if max_norm == 0:  # clipping off: the norm is reported, the gradients left alone
        assert values["grad_norm"] > 0.05


def test_micro_batches_are_drawn_when_their_turn_comes():
    model, order = _model(), []
    runner = _runner(model, grad_accumulation=2)

    def draw():
        order.append("draw")
        return _batches(1)[0]

    def loss(batch):
        order.append("loss")
        return _loss(model)(batch)

    runner.update(draw, loss)
    assert order == ["draw", "loss", "draw", "loss"]


def test_logged_lr_is_the_updates_own_unless_the_recipe_logs_the_next():
    model = _model()
    used = _runner(model).update(lambda: _batches(1)[0], _loss(model))["lr"]
    model = _model()
    runner = _runner(model, quirks=RecipeQuirks(logs_next_update_lr=True))
    following = runner.update(lambda: _batches(1)[0], _loss(model))["lr"]
    assert used == pytest.approx(1e-10) and following == pytest.approx(5e-3)


def test_named_schedules_have_their_shapes():
    def rates(name):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        scheduler = build_schedule(name, optimizer, warmup=2, total=6)
        out = []
        for _ in range(6):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return out

    assert rates("linear") == pytest.approx([1e-8, 0.5, 1.0, 0.75, 0.5, 0.25], abs=1e-7)
    cosine = [0.5 * (1 + math.cos(math.pi * (s - 2) / 4)) for s in range(2, 6)]
    assert rates("cosine") == pytest.approx([0.0, 0.5, *cosine])
    assert rates("constant") == pytest.approx([0.0, 0.5, 1.0, 1.0, 1.0, 1.0])
    assert rates("inverse_sqrt") == pytest.approx([0.0, 0.5, *(math.sqrt(2 / s)
                                                             for s in range(2, 6))])
    assert {"linear", "cosine", "constant"} <= set(SCHEDULES)
    with pytest.raises(InvalidRequest) as raised:
        build_schedule("sawtooth", torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1),
                       warmup=1, total=2)
    assert raised.value.field == "params.lr_schedule" and "cosine" in str(raised.value)


def test_a_linear_warmup_spanning_the_whole_run_is_refused_by_name():
    with pytest.raises(InvalidRequest) as caught:
        check_warmup("linear", 10, 10)
    assert caught.value.field == "params.warmup_updates"
    check_warmup("linear", 9, 10)
    check_warmup("cosine", 10, 10)  # its decay is a function of the update: none is fine


def test_a_step_trainer_refuses_an_unknown_schedule_before_any_work():
    from mizuoto.contracts.trainer import TrainingConfig
    from mizuoto.training import StepTrainer

    class Toy(StepTrainer):
        engine, methods = "toy", frozenset({"full"})
        prepare = start = write_export = None

    config = TrainingConfig("full", "m", "d", "o", params={"lr_schedule": "sawtooth"})
    with pytest.raises(InvalidRequest, match="sawtooth"):
        Toy().check(config)


def test_resuming_from_the_state_reaches_the_same_bytes(tmp_path):
    batches = _batches(4)

    def run(model, runner, start, stop):
        for index in range(start, stop):
            runner.update(lambda index=index: batches[index], _loss(model))

    straight = _model()
    runner = _runner(straight, schedule="cosine", max_grad_norm=1.0)
    runner.keep_ema(straight)
    run(straight, runner, 0, 4)

    first = _model()
    runner = _runner(first, schedule="cosine", max_grad_norm=1.0)
    runner.keep_ema(first)
    run(first, runner, 0, 2)
    torch.save({"model": first.state_dict(), **runner.state_dict()}, tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    resumed = _model(seed=5)
    runner = _runner(resumed, schedule="cosine", max_grad_norm=1.0)
    runner.keep_ema(resumed)
    resumed.load_state_dict(state["model"])
    runner.load_state_dict(state)
    run(resumed, runner, 2, 4)
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
    assert runner.ema.step.item() == 4
    assert runner.scheduler.last_epoch == 4


def test_rng_state_carries_torch_and_the_trainers_generators():
    import random

    runner, draws, generator = TrainingRunner(), random.Random(3), torch.Generator()
    state = runner.rng_state(python_rng=draws, sampler=generator)
    expected = (torch.rand(2), draws.random(), torch.rand(1, generator=generator))
    runner.set_rng_state(state, python_rng=draws, sampler=generator)
    assert torch.equal(torch.rand(2), expected[0]) and draws.random() == expected[1]
    assert torch.equal(torch.rand(1, generator=generator), expected[2])


def test_a_skipped_fp16_update_leaves_the_schedule_unless_the_recipe_steps_it():
    def last_epoch(quirks):
        model = _model()
        runner = _runner(model, mixed_precision="fp16", quirks=quirks)
        runner.update(lambda: _batches(1)[0],
                      lambda batch: {"loss": model(batch).float().sum() * float("inf")})
        return runner.scheduler.last_epoch

    assert last_epoch(RecipeQuirks()) == 0
    assert last_epoch(RecipeQuirks(schedule_steps_on_skipped_update=True)) == 1


def test_clip_at_when_off_clips_at_that_norm():
    model = _model()
    runner = _runner(model, quirks=RecipeQuirks(clip_at_when_off=1e-3))
    runner.update(lambda: _batches(1)[0], _loss(model))
    theirs = _model()
    _by_hand(theirs, _batches(1), 1, 1e-3)
    for a, b in zip(model.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)


def test_memory_levels_keep_the_bytes():
    batches = _batches(2)
    results = []
    for memory in ("default", "low", "lowest"):
        model = _model()
        runner = _runner(model, memory=memory)
        blocks = runner.checkpoint_activations([model[0], model[2]])
        assert blocks == (0 if memory == "default" else 2)
        runner.keep_ema(model)
        assert runner.ema.ema_model[0].weight.device.type == "cpu"
        feed = iter(batches)
        runner.update(lambda feed=feed: next(feed), _loss(model), micro_batches_count=2)
        results.append([p.detach().clone() for p in model.parameters()])
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other, strict=True))


def test_checkpointing_with_a_private_generator_replays_its_draws():
    generator = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(4, 4)

    class Noisy(torch.nn.Module):
        def forward(self, x):
            return layer(x) * torch.rand(x.shape, generator=generator)

    x = torch.randn(2, 4, requires_grad=True)
    plain = Noisy()(x).sum()
    plain.backward()
    expected, after = x.grad.clone(), generator.get_state()
    x.grad = None
    generator.manual_seed(0)
    block = Noisy()
    checkpoint_activations([block], generator)
    block(x).sum().backward()
    assert torch.equal(x.grad, expected) and torch.equal(generator.get_state(), after)


def test_one_process_is_not_wrapped():
    model = _model()
    runner = TrainingRunner()
    assert runner.wrap(model) is model and runner.no_sync is None


def test_the_old_precision_path_still_imports_with_a_deprecation():
    from mizuoto.contracts.api import PluginAPIDeprecation
    from mizuoto.training import precision

    with pytest.warns(PluginAPIDeprecation, match="mizuoto.training.precision"):
        from mizuoto.runtime.precision import scaled_step
    assert scaled_step is precision.scaled_step
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import mizuoto.runtime.precision as old
        with pytest.raises(AttributeError):
            old.nothing_here  # noqa: B018


def test_step_trainer_runner_takes_the_runs_settings_over_the_trainers_defaults():
    from mizuoto.contracts.trainer import TrainingConfig
    from mizuoto.training import ProcessWorld, StepTrainer

    class Toy(StepTrainer):
        engine, methods = "toy", frozenset({"full"})
        prepare = start = write_export = None

    class Run:
        config = TrainingConfig("full", "m", "d", "o", steps=7, learning_rate=0.5,
                                memory="low", params={"grad_accum_steps": 3,
                                                      "lr_schedule": "cosine"})

    runner = Toy().runner(Run(), ProcessWorld(), max_grad_norm=2.0, schedule="linear",
                          warmup_updates=4)
    assert (runner.grad_accumulation, runner.max_grad_norm, runner.memory) == (3, 2.0, "low")
    assert runner.schedule_defaults == {"learning_rate": 0.5, "total": 7, "schedule": "cosine",
                                        "warmup": 4}
    runner.optimize(_model())
    assert runner.scheduler.lr_lambdas[0].total == 7
    assert runner.optimizer.param_groups[0]["initial_lr"] == 0.5


def test_step_trainer_runner_takes_a_precision_resolved_at_prepare_as_given():
    """A mode ``prepare`` resolved (and recorded in the run) is not chosen again: fp16 on the
    CPU, which `device_and_precision` refuses there, is what the runner runs."""
    import attrs

    from mizuoto.contracts.trainer import TrainingConfig
    from mizuoto.errors import InvalidRequest
    from mizuoto.training import ProcessWorld, StepTrainer

    class Toy(StepTrainer):
        engine, methods = "toy", frozenset({"full"})
        prepare = start = write_export = None

    class Run:
        config = TrainingConfig("full", "m", "d", "o", mixed_precision="bf16",
                                compute={"device": "cpu"})

    runner = Toy().runner(Run(), ProcessWorld(), mixed_precision="fp16")
    assert (runner.device.type, runner.precision.mode) == ("cpu", "fp16")
    assert Toy().runner(Run(), ProcessWorld()).precision.mode == "bf16"  # resolved here
    Run.config = attrs.evolve(Run.config, mixed_precision="fp16")
    with pytest.raises(InvalidRequest, match="fp16"):
        Toy().runner(Run(), ProcessWorld())
