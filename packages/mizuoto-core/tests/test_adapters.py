"""Core LoRA (`mizuoto.nn.lora`, `mizuoto.adapters`) on a two-layer torch model: target
matching, settings checks, the peft files' round trip, and refusals before any layer changes."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from mizuoto.adapters import (
    PEFT_FORMAT,
    AdapterFormat,
    LoRATargets,
    attach_adapter,
    check_adapter,
    find_adapters,
    read_adapter,
    write_adapter,
)
from mizuoto.errors import CheckpointMismatch, InvalidRequest, ModelFilesMissing
from mizuoto.nn.lora import LoRASettings, lora_layers, matches, remove_lora, target_paths

TARGETS = LoRATargets(default=("q",), allowed=("blocks.*",))


def _model() -> nn.Module:
    torch.manual_seed(0)
    block = nn.ModuleDict({"q": nn.Linear(4, 4), "out": nn.Linear(4, 2)})
    return nn.ModuleDict({"blocks": nn.ModuleList([block]), "head": nn.Linear(2, 2)})


def _adapter(tmp_path, model, name="a", *, fingerprint="base", zero=False):
    tensors = {"blocks.0.q.lora_A": torch.randn(2, 4),
               "blocks.0.q.lora_B": torch.zeros(4, 2) if zero else torch.randn(4, 2)}
    return write_adapter(tmp_path / name, tensors,
                         LoRASettings(r=2, alpha=4, target_modules=["blocks.0.q"]),
                         engine="toy", base_model="base-id", base_fingerprint=fingerprint)


def _forward(model, x):
    return model["head"](model["blocks"][0]["out"](model["blocks"][0]["q"](x)))


def test_targets_match_as_peft_names_them():
    assert matches("blocks.0.attn.to_q", "to_q") and not matches("blocks.0.attn.to_qk", "to_q")
    assert matches("blocks.0.q", "blocks.*") and not matches("head", "blocks.*")
    assert target_paths(_model(), ["q", "head"]) == ["blocks.0.q", "head"]


@pytest.mark.parametrize(("values", "field"), [({"r": 0}, "lora.r"), ({"r": 1.5}, "lora.r"),
                                               ({"alpha": 0}, "lora.alpha"),
                                               ({"dropout": 1.0}, "lora.dropout"),
                                               ({"alpha": float("nan")}, "lora.alpha")])
def test_settings_are_checked_by_name(values, field):
    with pytest.raises(InvalidRequest) as caught:
        LoRASettings(**values)
    assert caught.value.field == field


def test_an_adapter_round_trips_and_a_zero_one_changes_nothing(tmp_path):
    model, x = _model(), torch.randn(3, 4)
    base = _forward(model, x)
    adapter = read_adapter(_adapter(tmp_path, model))
    assert json.loads((tmp_path / "a" / "adapter_config.json").read_text())["peft_type"] == "LORA"
    assert adapter.base_model == "base-id" and adapter.settings.r == 2
    attach_adapter(model, adapter, check_adapter(adapter, model, TARGETS, engine="toy",
                                                 base_fingerprint="base"))
    assert not torch.equal(_forward(model, x), base)
    zero = read_adapter(_adapter(tmp_path, model, "zero", zero=True))
    attach_adapter(model, zero, check_adapter(zero, model, TARGETS, engine="toy",
                                              base_fingerprint="base"))
    assert list(lora_layers(model)) == ["blocks.0.q"]
    assert torch.equal(_forward(model, x), base)
    remove_lora(model)
    assert not lora_layers(model) and torch.equal(_forward(model, x), base)


def test_wrong_adapters_are_refused_before_anything_changes(tmp_path):
    model = _model()
    cases = [(_adapter(tmp_path, model, "other", fingerprint="other"), InvalidRequest,
              "another base model")]
    nan = _adapter(tmp_path, model, "nan")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(nan / PEFT_FORMAT.weights_file))
    tensors["base_model.model.blocks.0.q.lora_B.weight"][0, 0] = float("inf")
    save_file(tensors, str(nan / PEFT_FORMAT.weights_file))
    cases.append((nan, CheckpointMismatch, "NaN or Inf"))
    head = _adapter(tmp_path, model, "head")
    config = json.loads((head / PEFT_FORMAT.config_file).read_text())
    config["target_modules"] = ["head"]
    (head / PEFT_FORMAT.config_file).write_text(json.dumps(config))
    cases.append((head, InvalidRequest, "may not take adapters"))
    rank = _adapter(tmp_path, model, "rank")
    config = json.loads((rank / PEFT_FORMAT.config_file).read_text())
    config["r"] = 3
    (rank / PEFT_FORMAT.config_file).write_text(json.dumps(config))
    cases.append((rank, CheckpointMismatch, "shape mismatches"))
    for path, error, words in cases:
        with pytest.raises(error, match=words):
            check_adapter(read_adapter(path), model, TARGETS, engine="toy",
                          base_fingerprint="base")
        assert not lora_layers(model)
    with pytest.raises(ModelFilesMissing):
        read_adapter(tmp_path)


def test_find_adapters_by_the_declared_formats(tmp_path):
    own = AdapterFormat(weights_file="w.safetensors", config_file="c.json")
    model = _model()
    _adapter(tmp_path / "root", model, "peft")
    (tmp_path / "root" / "theirs").mkdir()
    (tmp_path / "root" / "theirs" / "w.safetensors").write_bytes(b"")
    (tmp_path / "root" / "neither").mkdir()
    found = find_adapters([tmp_path / "root"], [PEFT_FORMAT, own])
    assert sorted(found) == ["peft", "theirs"]
    assert sorted(find_adapters([tmp_path / "root"], [PEFT_FORMAT])) == ["peft"]


def test_several_adapters_known_to_one_model_one_applied_at_a_time(tmp_path):
    """peft's load_adapter / set_adapter / delete_adapter on an AdapterHost: loaded adapters
    are checked and kept, nothing applied; each applied gives what set_lora gives."""
    from types import SimpleNamespace

    from mizuoto.adapters import AdapterHost

    class Host(AdapterHost):
        name, lora_targets = "toy", TARGETS
        info = SimpleNamespace(model="base-id")

        def __init__(self):
            self.model = _model()

        def lora_root(self):
            return self.model

        def base_fingerprint(self):
            return "base"

    host, x = Host(), torch.randn(3, 4)
    base = _forward(host.model, x)
    paths = {name: _adapter(tmp_path, host.model, name) for name in ("a", "b")}
    alone = {}
    for name, path in paths.items():
        host.set_lora(path)
        alone[name] = _forward(host.model, x)
    host.set_lora(None)
    assert not torch.equal(alone["a"], alone["b"])
    for name, path in paths.items():
        host.load_adapter(name, path)
    assert sorted(host.adapters) == ["a", "b"] and host.active_adapter is None
    assert torch.equal(_forward(host.model, x), base)  # loading applies nothing
    for name in ("a", "b", "a"):
        host.set_adapter(name)
        assert host.active_adapter == name and torch.equal(_forward(host.model, x), alone[name])
    with pytest.raises(InvalidRequest, match="no adapter named 'c'"):
        host.set_adapter("c")
    foreign = _adapter(tmp_path, host.model, "foreign", fingerprint="another")
    with pytest.raises(InvalidRequest, match="adapter 'foreign' does not fit"):
        host.load_adapter("foreign", foreign)
    assert "foreign" not in host.adapters and host.active_adapter == "a"
    host.delete_adapter("a")  # applied: removed first
    assert host.active_adapter is None and torch.equal(_forward(host.model, x), base)
    assert sorted(host.adapters) == ["b"]
