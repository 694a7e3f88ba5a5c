"""F5's training params: declared once (`F5TrainingParams`, a `TrainerParams` subclass), each
checked by name before any data or weights are read."""

import attrs
import pytest

from mizuoto import TrainingConfig
from mizuoto.contracts.trainer import TrainerParams
from mizuoto.errors import InvalidRequest
from mizuoto_f5tts.training import F5Trainer
from mizuoto_f5tts.training.params import F5TrainingParams


def test_the_trainer_declares_its_params_class_over_the_shared_one():
    assert F5Trainer.params_class is F5TrainingParams
    shared = {f.name for f in attrs.fields(TrainerParams)}
    own = {f.name for f in attrs.fields(F5TrainingParams)} - shared
    assert shared < {f.name for f in attrs.fields(F5TrainingParams)}
    assert own == {"epochs", "batch_size_type", "batch_frames", "max_samples", "shuffle_seed",
                   "variant", "shard_batches", "extend_vocab", "vocab_file", "finetune",
                   # core's LoRAParams, for --method lora
                   "lora_r", "lora_alpha", "lora_dropout", "lora_targets"}


def test_defaults_are_upstream_finetune_cli_s():
    params = F5TrainingParams.parse({}, trainer="F5-TTS")
    assert (params.batch_size_type, params.batch_frames, params.max_samples,
            params.shuffle_seed, params.finetune, params.shard_batches,
            params.extend_vocab) == ("frame", 3200, 64, 666, True, True, False)


@pytest.mark.parametrize(("key", "value"), [
    ("epochs", 0), ("epochs", 1.5), ("epochs", True), ("batch_size_type", "clips"),
    ("batch_frames", 0), ("batch_frames", "3200"), ("max_samples", -1),
    ("shuffle_seed", -1), ("shuffle_seed", 2**64), ("variant", "v2_base"),
    ("shard_batches", "yes"), ("extend_vocab", "yes"), ("extend_vocab", [1, 2]),
    ("vocab_file", 3), ("finetune", 1), ("warmup_updates", -1), ("num_warmup_updates", -1),
    ("grad_accumulation", 0), ("samples", "true"), ("vocab_file", "no-such-vocab.txt"),
])
def test_a_bad_value_is_named_under_the_key_it_was_given(key, value):
    with pytest.raises(InvalidRequest) as caught:
        F5TrainingParams.parse({key: value}, trainer="F5-TTS")
    assert caught.value.field == f"params.{key}"


def test_upstream_names_map_onto_the_shared_settings_and_unknown_keys_list_the_known():
    params = F5TrainingParams.parse({"num_warmup_updates": 7, "log_samples": True},
                                    trainer="F5-TTS")
    assert (params.warmup_updates, params.samples) == (7, True)
    with pytest.raises(InvalidRequest, match="unknown F5-TTS training settings: warmup") as c:
        F5TrainingParams.parse({"warmup": 7}, trainer="F5-TTS")
    assert "batch_frames" in c.value.fix and "warmup_updates" in c.value.fix


def test_a_config_file_s_logger_is_checked_by_the_shared_setting():
    """finetune_cli's --logger: none passes through (the default); wandb is refused by name."""
    translated = F5Trainer().upstream_recipe({"logger": "wandb", "exp_name": "F5TTS_Base"})
    assert translated == {"logger": "wandb", "variant": "base"}
    with pytest.raises(InvalidRequest) as caught:
        F5TrainingParams.parse({"logger": translated["logger"]}, trainer="F5-TTS")
    assert caught.value.field == "params.logger"
    assert F5TrainingParams.parse(F5Trainer().upstream_recipe({"logger": None}),
                                  trainer="F5-TTS").logger is None


def test_prepare_refuses_a_bad_param_before_it_reads_the_model_or_the_data(tmp_path):
    config = TrainingConfig(method="full", model=str(tmp_path / "no-model"),
                            dataset=tmp_path / "no-data.csv", output_dir=tmp_path / "run",
                            params={"batch_frames": -5})
    with pytest.raises(InvalidRequest) as caught:
        F5Trainer().prepare(config)
    assert caught.value.field == "params.batch_frames"
    assert not (tmp_path / "run").exists()
