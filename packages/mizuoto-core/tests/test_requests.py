"""Requests and results: validated on construction, errors naming the field, frozen."""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import pytest
import torch

from mizuoto import (
    Applied,
    Audio,
    EditRequest,
    Reference,
    SynthesisRequest,
    TrainingConfig,
    Voice,
)
from mizuoto.contracts.requests import MAX_SEED
from mizuoto.errors import InvalidAudio, InvalidRequest

VOICE = Voice("fake", "f" * 64, 8000, {"prompt": torch.zeros(2)})


def _field_of(make) -> str:
    with pytest.raises(InvalidRequest) as raised:
        make()
    assert str(raised.value).startswith(raised.value.field + ": ")
    return raised.value.field


@pytest.mark.parametrize("fields, field", [
    ({"text": ""}, "text"),
    ({"text": " \t\n"}, "text"),
    ({"text": 42}, "text"),
    ({"seed": -1}, "seed"),
    ({"seed": MAX_SEED + 1}, "seed"),
    ({"seed": True}, "seed"),
    ({"seed": 1.0}, "seed"),
    ({"steps": 0}, "steps"),
    ({"steps": 2.5}, "steps"),
    ({"guidance": -0.5}, "guidance"),
    ({"guidance": "high"}, "guidance"),
    ({"instruction": "  "}, "instruction"),
    ({"reference": Reference("ref.wav"), "voice": VOICE}, "voice"),
])
def test_synthesis_request_errors_name_the_field(fields, field):
    assert _field_of(lambda: SynthesisRequest(**{"text": "Hello.", **fields})) == field


def test_synthesis_request_accepts_the_limits():
    request = SynthesisRequest("Hello.", seed=MAX_SEED, steps=1, guidance=0)
    assert (request.seed, request.steps, request.guidance) == (MAX_SEED, 1, 0)
    assert SynthesisRequest("Hello.", seed=0).seed == 0


def test_reference_errors_name_the_field():
    assert _field_of(lambda: Reference(3)) == "reference.audio"
    assert _field_of(lambda: Reference("ref.wav", text=3)) == "reference.text"


def test_reference_audio_becomes_a_path_or_stays_audio():
    assert Reference("ref.wav").audio == Path("ref.wav")
    audio = Audio(np.zeros(4), 16000)
    assert Reference(audio).audio is audio


@pytest.mark.parametrize("segments, field", [
    ([], "segments"),
    ([(0.5, 0.5)], "segments"),
    ([(-0.1, 0.5)], "segments"),
    ([(1.0, 2.0), (0.0, 0.5)], "segments"),
    ([(0.0, 1.0), (0.5, 2.0)], "segments"),
])
def test_edit_request_segments(segments, field):
    reference = Reference("ref.wav", text="the words")
    assert _field_of(lambda: EditRequest(reference, "new words", segments)) == field


def test_edit_request_needs_the_reference_transcript():
    for text in (None, "  "):
        assert _field_of(lambda t=text: EditRequest(Reference("r.wav", text=t), "new words",
                                                    [(0, 1)])) == "reference.text"
    request = EditRequest(Reference("r.wav", text="old"), "new", [(0, 1), (1, 2.5)])
    assert request.segments == ((0.0, 1.0), (1.0, 2.5))


def test_requests_and_results_are_frozen():
    request = SynthesisRequest("Hello.", params={"speed": 1.1})
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        request.text = "Goodbye."
    with pytest.raises(TypeError):
        request.params["speed"] = 2.0
    applied = Applied("fake", "m", 1, False, "float32", "cpu", sampler={"steps": 8})
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        applied.seed = 2
    with pytest.raises(TypeError):
        applied.sampler["steps"] = 4


def test_params_are_copied():
    params = {"speed": 1.1}
    request = SynthesisRequest("Hello.", params=params)
    params["speed"] = 2.0
    assert request.params["speed"] == 1.1


def test_audio_is_mono_float32_on_cpu():
    audio = Audio(np.arange(8, dtype=np.int16), 8000)
    assert audio.samples.dtype == torch.float32 and audio.num_samples == 8
    assert audio.duration == 0.001
    with pytest.raises(InvalidAudio, match="must be 1-D"):
        Audio(np.zeros((2, 8)), 8000)  # stereo is a named error, not a bare ValueError
    with pytest.raises(InvalidAudio):
        Audio(np.zeros(8), 0)


@pytest.mark.parametrize(("dtype", "full_scale"), [(np.int16, 32768), (np.int32, 2**31),
                                                   (np.int8, 128)])
def test_integer_pcm_is_scaled_by_its_full_range(dtype, full_scale):
    info = np.iinfo(dtype)
    audio = Audio(np.array([info.min, 0, info.max], dtype=dtype), 8000)
    expected = torch.tensor([-1.0, 0.0, info.max / full_scale], dtype=torch.float64)
    assert torch.equal(audio.samples, expected.to(torch.float32))


def test_unsigned_8_bit_is_offset_binary_and_float64_is_rounded():
    assert torch.equal(Audio(np.array([0, 128, 255], dtype=np.uint8), 8000).samples,
                       torch.tensor([-1.0, 0.0, 127 / 128]))
    values = np.array([0.1, -0.25], dtype=np.float64)
    assert torch.equal(Audio(values, 8000).samples, torch.from_numpy(values).float())
    with pytest.raises(InvalidAudio, match="real numbers"):
        Audio(np.array([True, False]), 8000)


def test_training_memory_level_is_checked(tmp_path):
    with pytest.raises(InvalidRequest) as raised:
        TrainingConfig("full", "m", tmp_path, tmp_path, memory="tiny")
    assert raised.value.field == "training.memory"
    assert TrainingConfig("lora", "m", str(tmp_path), tmp_path).dataset == tmp_path


def test_control_characters_are_dropped_and_reported():
    request = SynthesisRequest("Hello\x00 there\x1b[0m.\r\n\tNext line\x07")
    assert request.text == "Hello there[0m.\r\n\tNext line"
    assert request.notices == ("text: dropped 3 control character(s) (U+0000, U+0007, U+001B)",)
    assert SynthesisRequest("Plain.\nText\t").notices == ()


@pytest.mark.parametrize("text", ["\x00\x01", "\x07 \n\x1b", "\x00\t"])
def test_text_of_control_characters_only_is_refused(text):
    with pytest.raises(InvalidRequest, match="only control characters") as caught:
        SynthesisRequest(text)
    assert caught.value.field == "text"


def test_edit_text_is_cleaned_too(tmp_path):
    request = EditRequest(Reference(tmp_path / "a.wav", "A line."), "New\x00 line.", [(0.1, 0.2)])
    assert request.text == "New line." and request.notices


def test_notices_reach_applied_warnings(fake_plugin, tmp_path):
    from conftest import FakeEngine

    engine = FakeEngine("m", None)
    result = engine.synthesize(SynthesisRequest("Hi\x00 there.", seed=1))
    assert any("control character" in w for w in result.applied.warnings)


@pytest.mark.parametrize("cls", [SynthesisRequest, "edit"])
def test_numpy_numbers_are_plain_numbers_and_numpy_bools_are_still_refused(cls, tmp_path):
    """``for seed in np.arange(4)`` works: a NumPy integer is an int, a NumPy float a float
    (stored as plain Python numbers, so results and manifests carry no NumPy types); a NumPy
    bool, a float for an integer and a tensor are refused as their Python kinds are."""
    def make(**fields):
        if cls == "edit":
            reference = Reference(Audio(torch.full((800,), 0.1), 8000), "ref")
            return EditRequest(reference, "text", [(0.0, 0.05)], **fields)
        return SynthesisRequest("text", **fields)

    request = make(seed=np.int64(3), steps=np.int32(2), guidance=np.float32(2.5))
    assert (request.seed, request.steps, request.guidance) == (3, 2, 2.5)
    assert [type(v) for v in (request.seed, request.steps, request.guidance)] == [int, int, float]
    assert type(make(guidance=np.float64(1.5)).guidance) is float
    for field, value in [("seed", np.bool_(True)), ("steps", np.float64(2.0)),
                         ("seed", np.uint64(2 ** 63)), ("guidance", np.float32("nan")),
                         ("seed", torch.tensor(3))]:
        with pytest.raises(InvalidRequest) as caught:
            make(**{field: value})
        assert caught.value.field == field, (field, value)
