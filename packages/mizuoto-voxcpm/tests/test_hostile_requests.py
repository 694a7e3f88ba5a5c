"""A request whose instruction or prompt fills the model's context: the error names the field
that did, not the input (issue 54, 9)."""

from __future__ import annotations

import pytest

from mizuoto import SynthesisRequest
from mizuoto.errors import InvalidRequest
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import write_random_model


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return VoxCPMEngine.load(write_random_model(tmp_path_factory.mktemp("v2") / "m", "voxcpm2",
                                                dtype="float32"))


@pytest.mark.parametrize("instruction", ["🌊" * 3_000, "calm and slow, " * 600])
def test_a_huge_instruction_is_blamed_on_the_instruction(engine, instruction):
    with pytest.raises(InvalidRequest) as raised:
        engine.synthesize(SynthesisRequest("Hello there.", instruction=instruction, steps=1))
    assert raised.value.field == "instruction", raised.value


def test_a_huge_text_sentence_is_still_blamed_on_the_text(engine):
    with pytest.raises(InvalidRequest) as raised:
        engine.synthesize(SynthesisRequest("la" * 2_000, instruction="calm", steps=1))
    assert raised.value.field == "text", raised.value
