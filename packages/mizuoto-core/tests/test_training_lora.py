"""The ``lora`` method `StepTrainer` gives a trainer that declares ``lora_targets``: the method
and its params, the adapters added with only them training, the export (the adapter alone,
naming its base), on a two-layer model."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from mizuoto import TrainingConfig
from mizuoto.adapters import LoRATargets, read_adapter
from mizuoto.contracts.trainer import TrainerParams
from mizuoto.errors import InvalidRequest
from mizuoto.training import RunnerSession, StepTrainer
from mizuoto.training.lora import LoRAParams, LoRATrainerParams

TARGETS = LoRATargets(default=("q",), allowed=("blocks.*",), module="net")
FINGERPRINT = "f" * 64


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Module()
        self.net.blocks = nn.ModuleList([nn.Module()])
        self.net.blocks[0].q = nn.Linear(4, 4)
        self.net.blocks[0].v = nn.Linear(4, 4)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.linspace(-1, 1, p.numel()).view_as(p))

    def forward(self, x):
        block = self.net.blocks[0]
        return block.v(block.q(x))


class _Trainer(StepTrainer):
    engine, methods = "two-layer", frozenset({"full"})
    lora_targets = TARGETS
    lora_keeps = {"lr_schedule": None}

    def prepare(self, config, *, progress=None):
        self.check(config)
        return type("Run", (), {"config": config})()

    def start(self, run, world):
        model = _Model()
        self.add_lora(run, model)
        runner = self.runner(run, world)
        runner.optimize(model)
        x = torch.linspace(0, 1, 8).view(2, 4)
        return RunnerSession(runner, model, total=run.config.steps, next_batch=lambda: x,
                             loss=lambda batch: {"loss": (model(batch) - 1).pow(2).mean()})

    def write_export(self, run, folder):
        raise AssertionError("a lora run's export is the core's")

    def lora_base_fingerprint(self, run):
        return FINGERPRINT


def _config(tmp_path, method="lora", **params):
    (tmp_path / "base").mkdir(exist_ok=True)
    return TrainingConfig(method=method, model=str(tmp_path / "base"), dataset=tmp_path,
                          output_dir=tmp_path / "run", steps=3, learning_rate=0.1,
                          params=params)


def test_declaring_targets_adds_the_method_and_its_params():
    assert _Trainer.methods == {"full", "lora"}
    assert _Trainer.params_class is LoRATrainerParams
    assert issubclass(LoRATrainerParams, TrainerParams) and issubclass(LoRATrainerParams,
                                                                       LoRAParams)
    with pytest.raises(TypeError, match="LoRAParams"):
        type("Bad", (_Trainer,), {"params_class": type("Own", (TrainerParams,), {})})


@pytest.mark.parametrize(("method", "params", "field"), [
    ("full", {"lora_r": 4}, "params.lora_r"),
    ("lora", {"lora_r": 0}, "params.lora_r"),
    ("lora", {"lora_dropout": 1.0}, "params.lora_dropout"),
    ("lora", {"lora_targets": ["nowhere"]}, "params.lora_targets"),
    ("lora", {"lr_schedule": "cosine"}, "params.lr_schedule"),  # a declared keep
])
def test_lora_params_are_refused_by_name_before_training(tmp_path, method, params, field):
    trainer = _Trainer()
    with pytest.raises(InvalidRequest) as error:
        trainer.train(trainer.prepare(_config(tmp_path, method, **params)))
    assert error.value.field == field
    assert not (tmp_path / "run").exists()


def test_a_lora_run_trains_only_adapters_and_exports_the_adapter_alone(tmp_path):
    trainer = _Trainer()
    run = trainer.prepare(_config(tmp_path, lora_r=2, lora_alpha=4))
    trainer.train(run)
    weights = trainer.trained_weights(run)
    base = _Model().state_dict()
    for key, value in base.items():  # the base weights did not move
        assert torch.equal(weights[key], value), key
    assert not torch.equal(weights["net.blocks.0.q.lora_B"], torch.zeros(4, 2))  # B trained
    exported = trainer.export(run, tmp_path / "adapter")
    assert sorted(p.name for p in exported.iterdir()) == ["adapter_config.json",
                                                         "adapter_model.safetensors"]
    info = json.loads((exported / "adapter_config.json").read_text())
    assert (info["r"], info["lora_alpha"], info["target_modules"]) == (2, 4, ["blocks.0.q"])
    assert info["base_model_name_or_path"] == str((tmp_path / "base").resolve())
    assert info["mizuoto"] == {"engine": "two-layer", "base_model_fingerprint": FINGERPRINT}
    adapter = read_adapter(exported)
    assert sorted(adapter.tensors) == ["blocks.0.q.lora_A", "blocks.0.q.lora_B"]
    assert torch.equal(adapter.tensors["blocks.0.q.lora_B"], weights["net.blocks.0.q.lora_B"])


def test_a_full_run_of_the_same_trainer_adds_no_adapters(tmp_path):
    trainer = _Trainer()
    run = trainer.prepare(_config(tmp_path, "full"))
    model = _Model()
    assert trainer.add_lora(run, model) is None
    assert all("lora_" not in key for key in model.state_dict())
    assert trainer.lora_settings(run.config) is None
