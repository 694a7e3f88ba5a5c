"""A model directory's own request defaults (``mizuoto-defaults.json``), and ``mizuoto.load``
with options given as a plain mapping."""

from __future__ import annotations

import json

import pytest
from conftest import FakeEngine

import mizuoto
from mizuoto.contracts.model_defaults import (
    DEFAULTS_FILE,
    read_model_defaults,
    taken_defaults,
    write_model_defaults,
)
from mizuoto.errors import CheckpointMismatch, InvalidOption


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "fake.json").write_text("{}")
    return tmp_path


def test_without_the_file_nothing_changes(model_dir):
    engine = FakeEngine.load(model_dir)
    assert engine.model_defaults == {}
    assert engine.parse_params({}).speed == 1.0
    assert engine.synthesize(mizuoto.SynthesisRequest("Hi.")).applied.model_defaults == {}


def test_the_directory_sets_defaults_and_the_request_wins(model_dir):
    write_model_defaults(model_dir, {"speed": 2.0}, "a demo model")
    saved = json.loads((model_dir / DEFAULTS_FILE).read_text())
    assert saved == {"params": {"speed": 2.0}, "why": "a demo model"}
    engine = FakeEngine.load(model_dir)
    assert dict(engine.model_defaults) == {"speed": 2.0}
    assert engine.parse_params({}).speed == 2.0
    assert engine.parse_params({"speed": 0.5}).speed == 0.5
    # the result names the defaults it took, and only those
    taken = engine.synthesize(mizuoto.SynthesisRequest("Hi.")).applied
    assert dict(taken.model_defaults) == {"speed": 2.0}
    given = engine.synthesize(mizuoto.SynthesisRequest("Hi.", params={"speed": 0.5})).applied
    assert dict(given.model_defaults) == {}


def test_taken_defaults_leave_out_what_the_request_sets():
    defaults = {"max_len": 24, "retry_badcase": False}
    assert taken_defaults(defaults, None) == defaults
    assert taken_defaults(defaults, {"max_len": 100}) == {"retry_badcase": False}
    assert taken_defaults({}, {"max_len": 100}) == {}


@pytest.mark.parametrize("content, message", [
    ("{not json", "cannot read it"),
    (b"\xff\xfe".decode("latin-1"), "cannot read it"),
    ("[1, 2]", 'must hold {"params": {...}}'),
    ('{"params": [1]}', 'must hold {"params": {...}}'),
    ('{"why": "no params"}', 'must hold {"params": {...}}'),
    ('{"params": {"sped": 2.0}}', "mizuoto-defaults.json.sped"),
    ('{"params": {"colour": "red", "speed": 1.0}}', "mizuoto-defaults.json.colour"),
])
def test_a_bad_file_fails_at_load_naming_the_file(model_dir, monkeypatch, content, message):
    (model_dir / DEFAULTS_FILE).write_text(content, encoding="latin-1")
    loaded = []
    monkeypatch.setattr(FakeEngine, "__init__", lambda self, *a: loaded.append(a))
    with pytest.raises(CheckpointMismatch) as raised:
        FakeEngine.load(model_dir)
    assert DEFAULTS_FILE in str(raised.value) and message in str(raised.value)
    assert "fix or delete it" in str(raised.value)
    assert loaded == []  # refused before the engine loads anything


def test_reading_checks_values_with_the_params_class(model_dir):
    import attrs

    @attrs.frozen
    class Strict:
        steps: int = attrs.field(default=1, validator=attrs.validators.instance_of(int))

    write_model_defaults(model_dir, {"steps": "many"}, "wrong type")
    with pytest.raises(CheckpointMismatch, match="steps"):
        read_model_defaults(model_dir, Strict)
    assert dict(read_model_defaults(model_dir)) == {"steps": "many"}  # unchecked without one


@pytest.mark.parametrize("options", [
    {"compute": {"device": "cpu"}},
    {"compute.device": "cpu"},
    {"engines": {"fake": {"level": 3}}, "compute": {"cpu_threads": 1}},
])
def test_load_accepts_a_plain_mapping_of_options(fake_plugin, model_dir, options):
    engine = mizuoto.load(model_dir, engine="fake", options=options)
    assert isinstance(engine.options.level, int)
    if "engines" in options:
        assert engine.options.level == 3


@pytest.mark.parametrize("options, key", [
    ({"compute": {"colour": "red"}}, "compute.colour"),
    ({"compute": {"device": "abacus"}}, "compute.device"),
    ({"gpu": True}, "gpu"),
    (["compute.device=cpu"], "options"),
    ("compute.device=cpu", "options"),
    (42, "options"),
])
def test_load_refuses_bad_options_by_name(fake_plugin, model_dir, options, key):
    with pytest.raises(InvalidOption) as raised:
        mizuoto.load(model_dir, engine="fake", options=options)
    assert raised.value.key == key
