"""The F5 trainer's device, mixed precision and memory levels: settings reach the loop, what
this machine cannot do is refused naming the setting, a resume keeps the precision. (Equality
with upstream under bf16 is in parity/test_training_parity.py; CUDA runs are in
benchmarks/gpu/checks.py.)"""

from __future__ import annotations

import attrs
import pytest
import torch

from mizuoto import TrainingConfig
from mizuoto.errors import InvalidOption, InvalidRequest
from mizuoto.training.memory import OptimizerStateOffload
from mizuoto.training.precision import scaled_step
from mizuoto.training.state import load_state_file
from mizuoto.training.synthetic_data import write_synthetic_dataset
from mizuoto.training.trainer import CHECKPOINT
from mizuoto_f5tts.fixtures import write_random_model_dir
from mizuoto_f5tts.training import F5Trainer


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("device")
    return (write_random_model_dir(root / "model", "v1_base", size="tiny"),
            write_synthetic_dataset(root / "data", count=4, seed=3))


def _config(inputs, output, **fields):
    model_dir, metadata = inputs
    return TrainingConfig(method="full", model=str(model_dir), dataset=metadata,
                          output_dir=output, steps=fields.pop("steps", 3), learning_rate=1e-3,
                          seed=5, save_every=10,
                          params={"epochs": 3, "warmup_updates": 1,
                                  "batch_size_type": "sample"}, batch_size=2, **fields)


def test_bf16_autocasts_the_forward_and_a_resume_keeps_it(tmp_path, inputs):
    trainer = F5Trainer()
    runs = {}
    for mode in ("no", "bf16"):
        config = _config(inputs, tmp_path / mode, mixed_precision=mode,
                         compute={"device": "cpu"})
        run = trainer.prepare(config)
        assert run.device == "cpu" and run.settings.mixed_precision == mode
        trainer.train(run)
        runs[mode] = load_state_file(tmp_path / mode / CHECKPOINT)
    plain, mixed = (runs[m]["records"] for m in ("no", "bf16"))
    assert len(plain) == len(mixed) == 3
    assert plain[0][1] != mixed[0][1]  # another loss: the forward ran in bfloat16
    assert runs["bf16"]["scaler"] is None  # bf16 needs no loss scaling
    # resuming the bf16 run without it is refused; with it, it continues
    with pytest.raises(InvalidRequest, match="other settings"):
        trainer.train(trainer.prepare(_config(inputs, tmp_path / "bf16", steps=4)))
    resumed = trainer.train(trainer.prepare(_config(inputs, tmp_path / "bf16", steps=4,
                                                    mixed_precision="bf16")))
    assert resumed.resumed_from == 3 and resumed.steps_done == 4


def test_memory_levels_keep_the_bits_under_bf16(tmp_path, inputs):
    """Recomputed activations run under the autocast state they were first run in."""
    trainer = F5Trainer()
    states = []
    for memory in ("default", "lowest"):
        config = _config(inputs, tmp_path / memory, mixed_precision="bf16", memory=memory)
        trainer.train(trainer.prepare(config))
        states.append(load_state_file(tmp_path / memory / CHECKPOINT))
    assert states[0]["records"] == states[1]["records"]
    for part in ("model", "ema"):
        for key, value in states[0][part].items():
            assert torch.equal(value, states[1][part][key]), (part, key)


# the LR scheduler's own wrapper of the optimiser's step survives the scaler's patch
@pytest.mark.filterwarnings("error:Seems like `optimizer.step\\(\\)` has been overridden")
def test_the_fp16_loss_scaling_path_runs_and_resumes(tmp_path, inputs):
    """fp16 is refused on the CPU (accelerate's rule), but its loop (scaled backward,
    unscale before clipping, the scaler's step and update, the scaler's state in the run
    checkpoint) is plumbing the CPU can run: forced here, with CPU autocast in float16."""
    trainer = F5Trainer()

    def fp16(config):
        run = trainer.prepare(config)
        return attrs.evolve(run, settings=attrs.evolve(run.settings, mixed_precision="fp16"))

    config = _config(inputs, tmp_path / "fp16", steps=2, mixed_precision="bf16")
    assert trainer.train(fp16(config)).steps_done == 2
    state = load_state_file(tmp_path / "fp16" / CHECKPOINT)
    assert state["settings"]["mixed_precision"] == "fp16"
    assert state["scaler"]["scale"] > 0 and state["scaler"]["_growth_tracker"] >= 0
    assert all(torch.isfinite(torch.tensor(r[1])) for r in state["records"])
    resumed = trainer.train(fp16(attrs.evolve(config, steps=3)))
    assert resumed.resumed_from == 2 and resumed.steps_done == 3
    after = load_state_file(tmp_path / "fp16" / CHECKPOINT)
    assert after["scaler"]["_growth_tracker"] in (0, state["scaler"]["_growth_tracker"] + 1)


def test_the_command_line_reaches_the_loop(tmp_path, inputs):
    from click.testing import CliRunner

    from mizuoto.cli import cli

    model_dir, metadata = inputs
    args = ["--quiet", "train", "-e", "f5tts", "-m", str(model_dir), "--data", str(metadata),
            "--output", str(tmp_path / "run"), "--steps", "1", "--learning-rate", "1e-4",
            "--option", "compute.device=cpu", "--mixed-precision", "bf16"]
    result = CliRunner().invoke(cli, args, obj={}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert load_state_file(tmp_path / "run" / CHECKPOINT)["settings"]["mixed_precision"] == "bf16"
    refused = CliRunner().invoke(cli, [*args[:-1], "fp16"], obj={}, catch_exceptions=False)
    assert refused.exit_code == 2 and "training.mixed_precision" in refused.output


def test_what_this_machine_cannot_do_is_refused(tmp_path, inputs):
    trainer = F5Trainer()
    with pytest.raises(InvalidRequest, match="fp16 needs a CUDA device") as caught:
        trainer.prepare(_config(inputs, tmp_path / "a", mixed_precision="fp16",
                                compute={"device": "cpu"}))
    assert caught.value.field == "training.mixed_precision"
    if not torch.cuda.is_available():
        with pytest.raises(InvalidOption, match="compute.device"):
            trainer.prepare(_config(inputs, tmp_path / "b", compute={"device": "cuda"}))
        assert trainer.prepare(_config(inputs, tmp_path / "c")).device == "cpu"  # auto


def test_lowest_moves_adamw_state_off_the_device_between_updates():
    """On a device other than the CPU the moments live on the host between steps (here a
    meta device stands for the GPU: only where the tensors are is checked)."""
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(2, 4)).sum().backward()
    assert scaled_step(optimizer, None)
    assert not OptimizerStateOffload(optimizer, torch.device("cpu")).active
    offload = OptimizerStateOffload(optimizer, torch.device("meta"))
    offload.to_device()
    assert {v.device.type for s in optimizer.state.values() for v in s.values()} == {"meta"}


def test_scaled_step_reports_a_skipped_update():
    """accelerate's rule: the update counts as skipped when the optimiser was not called
    (a non-fused optimiser with inf gradients under a GradScaler)."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    before = model.weight.detach().clone()
    scaler.scale(model(torch.tensor([[float("inf"), 1.0]])).sum()).backward()
    assert not scaled_step(optimizer, scaler)
    assert torch.equal(model.weight, before) and scaler.get_scale() < 65536.0
    optimizer.zero_grad()
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    assert scaled_step(optimizer, scaler) and not torch.equal(model.weight, before)
    assert "step" not in vars(optimizer)  # the class's method again


def test_training_config_compute_field():
    config = TrainingConfig(method="full", model="m", dataset="d", output_dir="o",
                            compute={"device": "cuda:1"})
    assert config.compute.device == "cuda:1" and config.mixed_precision == "auto"
    assert attrs.evolve(config, mixed_precision="bf16").mixed_precision == "bf16"
    with pytest.raises(InvalidRequest, match="training.mixed_precision"):
        attrs.evolve(config, mixed_precision="fp8")
