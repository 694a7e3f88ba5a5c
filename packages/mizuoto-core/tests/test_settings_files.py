"""Hostile settings files (recipes, options, mizuoto-defaults.json): refused by name, cheaply."""

import json

import pytest

from mizuoto.contracts.model_defaults import read_model_defaults
from mizuoto.errors import CheckpointMismatch, InvalidOption, InvalidRequest
from mizuoto.options import Options
from mizuoto.settings_files import SettingsFileError, name_some, parse_settings
from mizuoto.training.recipe import read_config_file

ALIAS_BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)]
    + ["learning_rate: *i"])


def _nested(kind: str, depth: int) -> str:
    if kind == "json":
        return '{"params": ' + "[" * depth + "]" * depth + "}"
    if kind == "toml":
        return "x = " + "[" * depth + "]" * depth
    return "x: " + "[" * depth + "]" * depth


@pytest.mark.parametrize("kind", ["json", "toml", "yaml"])
@pytest.mark.parametrize("depth", [40, 20_000])
def test_deep_nesting_is_refused_by_name(kind, depth):
    with pytest.raises(SettingsFileError, match="nests deeper than"):
        parse_settings(_nested(kind, depth), kind, "f")


def test_alias_bomb_is_refused_before_it_expands():
    with pytest.raises(SettingsFileError, match="aliases"):
        parse_settings(ALIAS_BOMB, "yaml", "bomb.yaml")


def test_few_aliases_that_expand_widely_are_refused_by_size():
    text = "a: &a [" + ", ".join(["0"] * 1000) + "]\nb: &b [" + ", ".join(["*a"] * 60) + "]\n"
    text += "c: [" + ", ".join(["*b"] * 3) + "]\n"
    with pytest.raises(SettingsFileError, match="more than"):
        parse_settings(text, "yaml", "f.yaml")


@pytest.mark.parametrize("kind,text", [("yaml", "seed: " + "9" * 10_000),
                                       ("toml", "seed = " + "9" * 10_000),
                                       ("json", '{"seed": ' + "9" * 10_000 + "}"),
                                       ("toml", "seed = 99999999999999999999")])
def test_huge_integers_are_refused(kind, text):
    with pytest.raises(SettingsFileError):
        parse_settings(text, kind, "f")


def test_plain_files_pass_unchanged():
    assert parse_settings("a = 1\n[b]\nc = [1, 2.5, 'x']\n", "toml", "f") == {
        "a": 1, "b": {"c": [1, 2.5, "x"]}}
    assert parse_settings("a: &x 3\nb: *x\n", "yaml", "f") == {"a": 3, "b": 3}


def test_name_some_stays_short():
    text = name_some(f"k{i}" for i in range(300_000))
    assert text.endswith("and 299,992 more") and len(text) < 200
    assert name_some(["b", "a"]) == "a, b"


def test_recipe_file_errors_are_named_requests(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    with pytest.raises(InvalidRequest) as info:
        read_config_file(bomb)
    assert info.value.field == "--config" and info.value.exit_code == 2
    deep = tmp_path / "deep.toml"
    deep.write_text(_nested("toml", 20_000))
    with pytest.raises(InvalidRequest, match="nests deeper"):
        read_config_file(deep)
    many = tmp_path / "many.toml"
    many.write_text("".join(f"k{i} = 1\n" for i in range(100_001)))
    with pytest.raises(InvalidRequest, match="more than 100,000 values"):
        read_config_file(many)


def test_options_file_and_model_defaults_are_named(tmp_path):
    options = tmp_path / "options.toml"
    options.write_text(_nested("toml", 20_000))
    with pytest.raises(InvalidOption, match="nests deeper"):
        Options.from_toml(options)
    (tmp_path / "mizuoto-defaults.json").write_text(_nested("json", 100_000))
    with pytest.raises(CheckpointMismatch, match="nests deeper") as info:
        read_model_defaults(tmp_path)
    assert info.value.exit_code == 3
    (tmp_path / "mizuoto-defaults.json").write_text(json.dumps({"params": {"speed": 1.0}}))
    assert read_model_defaults(tmp_path) == {"speed": 1.0}


# --- one JSON reader for every file from outside (mizuoto.json_files) ----------------------


@pytest.mark.parametrize("text, problem", [
    ("[" * 12_345 + "]" * 12_345, "nests deeper than"),
    ('{"a": ' + "{\"b\": " * 33 + "0" + "}" * 34, "nests deeper than"),
    ('{"n": -' + "7" * 2_345 + "}", "digits"),
    ('{"n": 1' + "0" * 40 + "}", "41 digits"),
    ('{"model": 1, "model": 2}', "given twice"),
    ("[[1, 2]]", "holds an array where an object belongs"),
    ("3.5", "holds a number where an object belongs"),
    ("null", "holds null where an object belongs"),
    ("plain words", "is not valid JSON"),
])
def test_json_from_outside_is_refused_by_name(text, problem):
    from mizuoto.json_files import JSONFileError, parse_json

    with pytest.raises(JSONFileError, match=problem) as raised:
        parse_json(text, "weights.json")
    assert str(raised.value).startswith("weights.json")


def test_json_from_outside_skips_a_bom_and_may_keep_the_last_duplicate():
    from mizuoto.json_files import parse_json

    assert parse_json(b"\xef\xbb\xbf{\"k\": [1]}", "f") == {"k": [1]}
    assert parse_json("\ufeff{\"k\": 2}", "f") == {"k": 2}
    assert parse_json('{"k": 1, "k": 3}', "f", allow_duplicate_keys=True) == {"k": 3}
    assert parse_json('["any"]', "f", expect=None) == ["any"]


@pytest.mark.parametrize("path", ["/dev/urandom", "/proc/self/environ", "/sys/kernel",
                                  "/dev/full"])
def test_json_files_that_are_no_regular_file_are_refused_before_reading(path):
    from mizuoto.json_files import JSONFileError, read_json

    with pytest.raises((JSONFileError, PermissionError), match="not a regular file|denied"):
        read_json(path)


def test_a_json_file_over_the_size_limit_is_refused(tmp_path):
    from mizuoto.json_files import JSONFileError, read_json

    big = tmp_path / "big.json"
    big.write_text('{"pad": "' + "x" * 5000 + '"}')
    with pytest.raises(JSONFileError, match="larger than 4,096 bytes"):
        read_json(big, max_bytes=4096)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    import os

    from mizuoto.json_files import JSONFileError, read_json

    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)  # no writer: opening it to read would wait for one
    with pytest.raises(JSONFileError, match="not a regular file"):
        read_json(fifo)


def test_json_settings_files_refuse_duplicate_keys_and_skip_a_bom():
    with pytest.raises(SettingsFileError, match="'steps' is given twice"):
        parse_settings('{"steps": 8, "steps": 80}', "json", "recipe.json")
    assert parse_settings('\ufeff{"steps": 8}', "json", "recipe.json") == {"steps": 8}


def test_a_yaml_key_given_twice_is_refused_but_a_merge_may_override():
    with pytest.raises(SettingsFileError, match="'learning_rate' is given twice"):
        parse_settings("learning_rate: 1e-4\nsteps: 3\nlearning_rate: 1e-2\n", "yaml", "r.yaml")
    merged = parse_settings("base: &b {steps: 3, lr: 1}\nrun:\n  <<: *b\n  steps: 9\n",
                            "yaml", "r.yaml")
    assert merged["run"] == {"steps": 9, "lr": 1}
