"""Core pieces an engine declares instead of writing: an adapter file format of its own (file
names, where the settings and the base model sit in the config, the tensors' key names), a
data set's usable rows and clips, a list of names from a known set, a path param, the
sampler for this process."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mizuoto.adapter_files import AdapterFormat
from mizuoto.adapters import read_adapter_files, write_adapter_files
from mizuoto.errors import CheckpointMismatch, InvalidRequest, ModelFilesMissing
from mizuoto.training.loader_order import DistributedEpochSampler, EpochSampler, epoch_sampler
from mizuoto.training.manifest import RejectedRow, usable_audio, usable_rows
from mizuoto.training.world import ProcessWorld
from mizuoto.validation.ranges import check_names

OWN = AdapterFormat(weights_file="w.safetensors", config_file="c.json", key_prefix="",
                    key_suffix="", base_model_key="base", settings_key="lora",
                    config_required=False)


def _settings(table):
    if table is None:
        return "defaults"
    if table.get("r", 1) < 1:
        raise ValueError("lora.r must be at least 1")
    return dict(table)


def test_a_declared_format_round_trips_its_files_keys_and_settings(tmp_path):
    tensors = {"layer.lora_A": torch.ones(2, 3), "layer.lora_B": torch.zeros(3, 2)}
    write_adapter_files(tmp_path, tensors, {"base": "m", "lora": {"r": 2}}, OWN)
    from safetensors.torch import load_file

    assert sorted(load_file(str(tmp_path / "w.safetensors"))) == sorted(tensors)  # as declared
    assert json.loads((tmp_path / "c.json").read_text()) == {"base": "m", "lora": {"r": 2}}
    settings, info, read = read_adapter_files(tmp_path, OWN, _settings)
    assert settings == {"r": 2} and info["base"] == "m"
    assert all(torch.equal(read[k], v) for k, v in tensors.items())
    # the weights file alone: no config is the reader's defaults, where the format allows it
    (tmp_path / "c.json").unlink()
    assert read_adapter_files(tmp_path / "w.safetensors", OWN, _settings)[0] == "defaults"


def test_a_declared_format_names_the_bad_file(tmp_path):
    with pytest.raises(ModelFilesMissing, match="w.safetensors"):
        read_adapter_files(tmp_path, OWN, _settings)
    write_adapter_files(tmp_path, {"x.lora_A": torch.ones(1)}, {"lora": {"r": 0}}, OWN)
    with pytest.raises(CheckpointMismatch, match="lora.r must be at least 1"):
        read_adapter_files(tmp_path, OWN, _settings)
    (tmp_path / "c.json").write_text('{"lora": [1]}')
    with pytest.raises(CheckpointMismatch, match="lora must be an object"):
        read_adapter_files(tmp_path, OWN, _settings)
    peft_keys = AdapterFormat(weights_file="w.safetensors", config_file="c.json",
                              config_required=False)
    (tmp_path / "c.json").unlink()
    with pytest.raises(CheckpointMismatch, match="base_model.model.<module>.lora_A.weight"):
        read_adapter_files(tmp_path, peft_keys, _settings)


def test_usable_rows_log_rejections_and_refuse_too_few(tmp_path, caplog):
    rejected = [RejectedRow(3, "silent")]
    with caplog.at_level("WARNING"):
        assert usable_rows([1, 2], rejected, tmp_path / "m.jsonl", field="dataset",
                           batch_size=2) == [1, 2]
    assert "line 3 skipped: silent" in caplog.text
    with pytest.raises(InvalidRequest, match="fewer than one batch of 3; skipped: silent") as e:
        usable_rows([1, 2], rejected, tmp_path / "m.jsonl", field="dataset", batch_size=3)
    assert e.value.field == "dataset"
    with pytest.raises(InvalidRequest, match="no usable rows") as e:
        usable_rows([], [], tmp_path / "v.jsonl", field="params.val_manifest")
    assert e.value.field == "params.val_manifest"


def test_usable_audio_says_why_a_clip_is_unusable(tmp_path):
    import soundfile as sf

    sf.write(str(tmp_path / "quiet.wav"), np.zeros(160), 16000)
    assert usable_audio(tmp_path / "quiet.wav", 16000, "ref_audio: ").startswith(
        "ref_audio: silent")
    assert "unreadable audio" in usable_audio(tmp_path / "none.wav", 16000)
    sf.write(str(tmp_path / "tone.wav"), np.full(160, 0.5), 16000)
    assert usable_audio(tmp_path / "tone.wav", 16000).shape == (160,)


@pytest.mark.parametrize(("value", "message"), [
    ([], "non-empty list"), ("q", "non-empty list"), (["q", "z"], r"unknown names \['z'\]"),
    (["q", "q"], r"lists \['q'\] twice")])
def test_check_names_names_the_field_and_the_known(value, message):
    with pytest.raises(InvalidRequest, match=message) as caught:
        check_names("params.targets", value, ("q", "k"))
    assert caught.value.field == "params.targets"


def test_check_names_returns_a_tuple():
    assert check_names("f", ["k", "q"], ("q", "k")) == ("k", "q")


def test_epoch_sampler_is_the_distributed_one_under_torchrun():
    generator = torch.Generator().manual_seed(0)
    assert type(epoch_sampler(8, 2, generator, ProcessWorld())) is EpochSampler
    sampler = epoch_sampler(8, 2, generator, ProcessWorld(rank=1, size=2, local_rank=1))
    assert isinstance(sampler, DistributedEpochSampler) and sampler.rank == 1
