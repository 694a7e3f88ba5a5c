"""The runner's bf16 gradient-scaler quirk (`RecipeQuirks.scales_bf16`) and the model placed
under ``training.memory`` (`TrainingRunner.place_model`: a LoRA run's frozen weights)."""

from __future__ import annotations

import pytest
import torch

from mizuoto.errors import InvalidRequest
from mizuoto.training import ProcessWorld, RecipeQuirks, TrainingRunner


@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled")
def test_scales_bf16_puts_a_scaler_under_bf16_only():
    # built, not run: a CUDA runner on a machine without one
    plain = TrainingRunner(device="cuda:0", mixed_precision="bf16")
    quirk = TrainingRunner(device="cuda:0", mixed_precision="bf16",
                           quirks=RecipeQuirks(scales_bf16=True))
    off = TrainingRunner(device="cpu", quirks=RecipeQuirks(scales_bf16=True))
    assert plain.precision.scaler is None
    assert quirk.precision.scaler is not None
    assert off.precision.scaler is None


def _lora_model():
    from mizuoto.nn.lora import LoRALinear, apply_lora, freeze_all_but_lora

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    apply_lora(model, ["0"], r=2, alpha=4)
    freeze_all_but_lora(model)
    return model, LoRALinear


def test_place_model_keeps_frozen_weights_in_the_autocast_dtype_under_low():
    model, kind = _lora_model()
    placed = TrainingRunner(mixed_precision="bf16", memory="low").place_model(model,
                                                                              kinds=(kind,))
    assert placed.training
    assert placed[0].weight.dtype == placed[1].weight.dtype == torch.bfloat16
    assert placed[0].lora_A.dtype == torch.float32  # what trains stays float32
    model, kind = _lora_model()
    TrainingRunner(mixed_precision="bf16").place_model(model, kinds=(kind,))
    assert model[0].weight.dtype == torch.float32  # memory default: untouched


def test_lowest_streams_in_one_process_only():
    model, kind = _lora_model()
    runner = TrainingRunner(memory="lowest", world=ProcessWorld(size=2, rank=0))
    with pytest.raises(InvalidRequest, match="single process") as caught:
        runner.place_model(model, kinds=(kind,))
    assert caught.value.field == "training.memory"
