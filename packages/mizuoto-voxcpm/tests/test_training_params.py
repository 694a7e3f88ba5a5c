"""VoxCPM's training params: declared once (`VoxCPMTrainingParams`, a `TrainerParams`
subclass), each checked by name before the model or the manifest is read; None is the
generation's recipe."""

import attrs
import pytest

from mizuoto import TrainingConfig
from mizuoto.contracts.trainer import TrainerParams
from mizuoto.errors import InvalidRequest
from mizuoto_voxcpm.training import VoxCPMTrainer
from mizuoto_voxcpm.training.params import VoxCPMTrainingParams
from mizuoto_voxcpm.training.recipe import RECIPES, build_recipe


def _config(tmp_path, method="full", **params):
    return TrainingConfig(method=method, model=str(tmp_path / "no-model"),
                          dataset=tmp_path / "no-data.jsonl", output_dir=tmp_path / "run",
                          steps=10, params=params)


def test_the_trainer_declares_its_params_class_over_the_shared_one():
    assert VoxCPMTrainer.params_class is VoxCPMTrainingParams
    shared = {f.name for f in attrs.fields(TrainerParams)}
    assert shared < {f.name for f in attrs.fields(VoxCPMTrainingParams)}


@pytest.mark.parametrize("generation", sorted(RECIPES))
def test_unset_params_take_the_generation_s_recipe(tmp_path, generation):
    recipe = build_recipe(_config(tmp_path), generation)
    base = RECIPES[generation]
    assert (recipe.weight_decay, recipe.warmup_steps, recipe.max_batch_tokens,
            recipe.grad_accum_steps, recipe.max_grad_norm, recipe.max_steps) == (
        base["weight_decay"], base["warmup_steps"], base["max_batch_tokens"],
        base["grad_accum_steps"], base["max_grad_norm"], 10)
    lora = build_recipe(_config(tmp_path, "lora"), generation).lora
    assert (lora.r, lora.alpha, lora.dropout) == (base["lora_r"], base["lora_alpha"], 0.0)


def test_upstream_names_and_whole_floats_are_read():
    params = VoxCPMTrainingParams.parse({"warmup_steps": 3, "grad_accum_steps": 2,
                                         "max_batch_tokens": 4096.0}, trainer="VoxCPM")
    assert (params.warmup_updates, params.grad_accumulation, params.max_batch_tokens) == (
        3, 2, 4096.0)


@pytest.mark.parametrize(("key", "value"), [
    ("weight_decay", -0.1), ("weight_decay", "0.01"), ("max_steps", 2.5), ("max_steps", True),
    ("max_batch_tokens", -1), ("lambda_diff", -1), ("lambda_stop", [1]),
    ("val_manifest", 3), ("valid_interval", 0), ("sample_rate", 0), ("preview", "no"),
    ("lora_r", 0), ("lora_alpha", 1.5), ("lora_dropout", 1.0), ("lora_dropout", True),
    ("lora_enable_lm", 1), ("warmup_steps", -1), ("grad_accum_steps", 0),
])
def test_a_bad_value_is_named_under_the_key_it_was_given(key, value):
    with pytest.raises(InvalidRequest) as caught:
        VoxCPMTrainingParams.parse({key: value}, trainer="VoxCPM")
    assert caught.value.field == f"params.{key}"


def test_unknown_keys_list_the_known_and_lora_settings_need_lora(tmp_path):
    with pytest.raises(InvalidRequest, match="unknown VoxCPM training settings: lr") as caught:
        VoxCPMTrainingParams.parse({"lr": 1}, trainer="VoxCPM")
    assert "lora_r" in caught.value.fix and "warmup_updates" in caught.value.fix
    with pytest.raises(InvalidRequest, match="lora_r.*method 'lora' only"):
        build_recipe(_config(tmp_path, lora_r=4), "voxcpm2")


def test_prepare_refuses_a_bad_param_before_it_reads_the_model(tmp_path):
    with pytest.raises(InvalidRequest) as caught:
        VoxCPMTrainer().prepare(_config(tmp_path, max_batch_tokens=-5))
    assert caught.value.field == "params.max_batch_tokens"
    assert not (tmp_path / "run").exists()
