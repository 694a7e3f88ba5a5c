"""Downloaded config.json files that would cost gigabytes or end in a traceback: refused by
name while parsing, before any module is built."""

from __future__ import annotations

import copy
import json

import pytest

from mizuoto_voxcpm import config as config_module
from mizuoto_voxcpm.config import ConfigError, VoxCPMConfig, parameter_bytes
from mizuoto_voxcpm.fixtures import realsize_config, tiny_config


def _config(**lm):
    raw = copy.deepcopy(tiny_config("voxcpm2", vocab_size=500))
    raw["lm_config"].update(lm)
    return raw


@pytest.mark.parametrize("field,value", [
    ("num_hidden_layers", 100_000), ("num_hidden_layers", -3), ("num_hidden_layers", 0),
    ("num_attention_heads", 0), ("num_key_value_heads", -1), ("vocab_size", 10**9),
    ("hidden_size", 0), ("intermediate_size", -5), ("max_position_embeddings", 10**12)])
def test_lm_fields_out_of_range_are_named(field, value):
    with pytest.raises(ConfigError) as info:
        VoxCPMConfig.from_dict(_config(**{field: value}))
    assert info.value.field == f"lm_config.{field}"


@pytest.mark.parametrize("section,field,value", [
    ("encoder_config", "num_layers", 0), ("dit_config", "num_heads", 0),
    ("dit_config", "hidden_dim", 10**7)])
def test_local_stacks_out_of_range_are_named(section, field, value):
    raw = _config()
    raw[section][field] = value
    with pytest.raises(ConfigError, match=section):
        VoxCPMConfig.from_dict(raw)


@pytest.mark.parametrize("field,value", [("max_length", 10**12), ("patch_size", 0),
                                         ("feat_dim", 10**6)])
def test_top_level_out_of_range_is_named(field, value):
    raw = _config()
    raw[field] = value
    with pytest.raises(ConfigError) as info:
        VoxCPMConfig.from_dict(raw)
    assert info.value.field == field


def test_hidden_size_not_divisible_by_heads_is_named():
    raw = _config()
    raw["lm_config"].pop("kv_channels", None)
    raw["lm_config"]["hidden_size"] = raw["lm_config"]["num_attention_heads"] * 8 + 1
    with pytest.raises(ConfigError, match="divisible"):
        VoxCPMConfig.from_dict(raw)


def test_weights_larger_than_memory_are_refused_by_name(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps(_config()))
    needed = parameter_bytes(VoxCPMConfig.from_dict(_config()))
    monkeypatch.setattr(config_module, "_available_memory", lambda *_: needed - 1)
    with pytest.raises(ConfigError, match="GiB of memory is available"):
        VoxCPMConfig.from_model_dir(tmp_path)
    monkeypatch.setattr(config_module, "_available_memory", lambda *_: needed)
    assert VoxCPMConfig.from_model_dir(tmp_path).lm.vocab_size == 500


def test_real_size_configs_pass_and_estimate_their_size():
    for generation in ("voxcpm-0.5b", "voxcpm2"):
        config = VoxCPMConfig.from_dict(realsize_config(generation))
        assert 10**8 < parameter_bytes(config) < 2 * 10**10


@pytest.mark.parametrize("lora_config", [
    {"r": 1e9}, {"r": "8"}, {"r": 2.5}, {"r": True}, {"alpha": -1}, {"alpha": "16"},
    {"dropout": 5.0}, {"dropout": -0.1}, {"dropout": float("nan")}])
def test_hostile_lora_configs_are_named_before_layers_are_built(tmp_path, lora_config):
    from safetensors.torch import save_file

    from mizuoto.errors import CheckpointMismatch
    from mizuoto_voxcpm.lora import CONFIG_FILE, WEIGHTS_FILE, read_lora_dir

    save_file({}, str(tmp_path / WEIGHTS_FILE))
    (tmp_path / CONFIG_FILE).write_text(json.dumps({"lora_config": lora_config}))
    field = next(iter(lora_config))
    with pytest.raises(CheckpointMismatch, match=f"lora_config.{field}"):
        read_lora_dir(tmp_path, is_v2=True)


@pytest.mark.parametrize("text", ["[1, 2, 3]", '"r"', "[" * 50_000 + "]" * 50_000])
def test_lora_config_that_is_no_object_is_named(tmp_path, text):
    from safetensors.torch import save_file

    from mizuoto.errors import CheckpointMismatch
    from mizuoto_voxcpm.lora import CONFIG_FILE, WEIGHTS_FILE, read_lora_dir

    save_file({}, str(tmp_path / WEIGHTS_FILE))
    (tmp_path / CONFIG_FILE).write_text(text)
    with pytest.raises(CheckpointMismatch, match=CONFIG_FILE):
        read_lora_dir(tmp_path, is_v2=True)


@pytest.mark.parametrize("section,field,factor", [("lm_config", "intermediate_size", 2),
                                                  ("lm_config", "num_hidden_layers", 3)])
def test_a_config_its_weights_do_not_fit_is_named_before_the_model_is_allocated(
        tmp_path, monkeypatch, section, field, factor):
    """A valid config.json beside weights of another layout: the safetensors header's shapes
    are compared with the config's before the model takes any memory."""
    from mizuoto.errors import CheckpointMismatch
    from mizuoto_voxcpm import model as model_module
    from mizuoto_voxcpm.fixtures import write_random_model

    directory = write_random_model(tmp_path / "m", "voxcpm2")
    raw = json.loads((directory / "config.json").read_text())
    raw[section][field] *= factor
    (directory / "config.json").write_text(json.dumps(raw))

    def allocated(*args, **kwargs):
        raise AssertionError("the model was allocated before its weights were compared")

    monkeypatch.setattr(model_module, "materialize_empty", allocated)
    config = VoxCPMConfig.from_model_dir(directory)
    with pytest.raises(CheckpointMismatch, match="model.safetensors does not match") as info:
        model_module.load_model(directory, config, dtype=config.torch_dtype)
    assert info.value.missing or info.value.shapes


def test_a_release_that_does_not_fit_blames_the_memory_not_the_config(tmp_path, monkeypatch):
    # VoxCPM2 in float32 (about 8.4 GiB) on a machine with less free: the config is a release
    raw = realsize_config("voxcpm2", dtype="float32")
    (tmp_path / "config.json").write_text(json.dumps(raw))
    monkeypatch.setattr(config_module, "_available_memory", lambda *_: 4 << 30)
    with pytest.raises(ConfigError, match="free memory is short.*compute.dtype=bfloat16") as info:
        VoxCPMConfig.from_model_dir(tmp_path)
    assert "not a VoxCPM release" not in str(info.value)
    # a config larger than any release is still called what it is
    raw["lm_config"]["num_hidden_layers"] = 200
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="not a VoxCPM release"):
        VoxCPMConfig.from_model_dir(tmp_path)


# --- config.json and tokenizer.json read as files from the internet -----------------------


@pytest.mark.parametrize("text, problem", [
    ('{"lm_config": ' + "[" * 2_718 + "]" * 2_718 + "}", "nests deeper than"),
    ('{"lm_config": {}, "patch_size": ' + "3" * 1_234 + "}", "digits"),
    ('{"architecture": "voxcpm", "lm_config": {}, "architecture": "voxcpm2"}',
     "'architecture' is given twice"),
    ("[]", "holds an array where an object belongs"),
    ('"voxcpm2"', "holds a string where an object belongs"),
])
def test_hostile_config_json_is_named_by_its_file(tmp_path, text, problem):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ConfigError, match=problem) as raised:
        VoxCPMConfig.from_model_dir(tmp_path)
    assert "config.json" in str(raised.value)


def test_a_config_json_with_a_bom_is_read(tmp_path):
    raw = tiny_config("voxcpm2", vocab_size=500)
    (tmp_path / "config.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(raw).encode())
    assert VoxCPMConfig.from_model_dir(tmp_path).architecture == "voxcpm2"


def test_a_damaged_config_json_is_this_engines_to_name_not_a_missing_package(tmp_path):
    from mizuoto_voxcpm.engine import VoxCPMEngine

    (tmp_path / "config.json").write_text("[]")
    (tmp_path / "audiovae.safetensors").write_bytes(b"")
    assert VoxCPMEngine.recognizes(tmp_path)  # the load names the config, not pip install


@pytest.mark.parametrize("change, problem", [
    (lambda t: t["model"].__setitem__("vocab", {f"t{i}": i for i in range(2_500)}),
     "2,500 entries, more than the model's vocab_size 2,000"),
    (lambda t: t["model"]["vocab"].__setitem__("<far>", 99_999), "the id 99999"),
    (lambda t: t["model"]["vocab"].__setitem__("<neg>", -4), "the id -4"),
    (lambda t: t["model"].__setitem__("vocab", "words"), "must be an object or a list"),
])
def test_a_tokenizer_the_model_cannot_hold_is_refused_before_it_is_built(tmp_path, change,
                                                                          problem):
    from mizuoto.errors import CheckpointMismatch
    from mizuoto_voxcpm.tokenizer import VoxCPMTokenizer
    from mizuoto_voxcpm.tokenizer_fixture import write_test_tokenizer

    write_test_tokenizer(tmp_path)
    path = tmp_path / "tokenizer.json"
    tokenizer = json.loads(path.read_text(encoding="utf-8"))
    change(tokenizer)
    path.write_text(json.dumps(tokenizer), encoding="utf-8")
    with pytest.raises(CheckpointMismatch, match=problem):
        VoxCPMTokenizer.from_model_dir(tmp_path, vocab_size=2_000)


@pytest.mark.parametrize("text, problem", [
    ('{"model": ' + "{\"m\": " * 5_000 + "1" + "}" * 5_001, "nests deeper than"),
    ('{"model": {"vocab": {"a": ' + "8" * 3_000 + "}}}", "digits"),
    ("[]", "holds an array where an object belongs"),
    ("not json at all", "is not valid JSON"),
    ('{"model": {"type": "BPE", "vocab": [], "merges": 7}}', "is not a tokenizer VoxCPM reads"),
])
def test_hostile_tokenizer_json_is_a_named_error(tmp_path, text, problem):
    from mizuoto.errors import CheckpointMismatch
    from mizuoto_voxcpm.tokenizer import VoxCPMTokenizer

    (tmp_path / "tokenizer.json").write_text(text, encoding="utf-8")
    with pytest.raises(CheckpointMismatch, match=problem):
        VoxCPMTokenizer.from_model_dir(tmp_path, vocab_size=1_000)
