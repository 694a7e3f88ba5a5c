"""Optional features are declared in the contract (``mizuoto.contracts.features``): the front
ends ask it, an engine that declares none is refused by name, and a declaration without its
methods is an error at once."""

from __future__ import annotations

import pytest

from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.engine import Engine, ModelInfo
from mizuoto.contracts.features import (
    SupportsBatching,
    SupportsLoRA,
    batching_engine,
    lora_engine,
)
from mizuoto.errors import InvalidRequest


class Plain(Engine):
    name = "plain"
    info = ModelInfo("plain", "plain-1", "v1", 8000, "float32", "cpu",
                     frozenset({Capability.ZERO_SHOT}))
    load = classmethod(lambda cls, model_dir, **kwargs: cls())


class HalfDeclared(Plain, SupportsLoRA):  # says LoRA, implements no set_lora
    lora = None


class Batched(Plain, SupportsBatching):
    max_batch, batch_stats = 4, None
    batch_options = classmethod(lambda cls, section, max_batch: {"rows": max_batch, **section})


def test_an_engine_without_the_feature_is_refused_naming_the_flag():
    with pytest.raises(InvalidRequest, match="--lora.*'plain' does not apply LoRAs"):
        lora_engine(Plain(), "--lora")
    assert batching_engine(Plain()) is None and batching_engine(Plain) is None


def test_a_declared_feature_without_its_methods_cannot_be_made():
    with pytest.raises(TypeError, match="set_lora"):
        HalfDeclared()


def test_a_batching_engine_is_found_by_class_and_instance():
    engine = Batched()
    assert batching_engine(engine) is engine and batching_engine(Batched) is Batched
    assert Batched.batch_options({"rows": 2}, 8) == {"rows": 2}
