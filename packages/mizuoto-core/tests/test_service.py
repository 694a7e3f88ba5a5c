"""The speech service (``mizuoto.service``) and the engine's pre-flight (``Engine.plan``): a
request is checked and its params parsed once, its seed drawn once and reported as drawn,
and a plan runs without being checked again."""

from __future__ import annotations

import pytest
import torch

from mizuoto import errors
from mizuoto.contracts.plan import RequestPlan
from mizuoto.contracts.requests import SynthesisRequest
from mizuoto.service import (
    SpeechOrder,
    plan_document,
    plan_speech,
    section_seed,
    speak,
    speech_order,
)

mizuoto_example = pytest.importorskip("mizuoto_example")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    import mizuoto
    from mizuoto_example.engine import write_tiny_model

    directory = tmp_path_factory.mktemp("toy")
    write_tiny_model(directory)
    return mizuoto.load(directory, engine="toy")


def test_an_unset_seed_is_drawn_once_by_the_plan_and_reported_as_drawn(toy):
    planned = plan_speech(toy, speech_order("Hum this."))
    assert planned.plan.seed_drawn and 0 <= planned.seed < 2**32
    chunks = list(speak(toy, planned, stream=True))
    assert (chunks[-1].applied.seed, chunks[-1].applied.seed_drawn) == (planned.seed, True)
    whole = next(speak(toy, planned, stream=False))
    assert (whole.applied.seed, whole.applied.seed_drawn) == (planned.seed, True)
    # the same audio as the request with that seed given
    given = toy.synthesize(SynthesisRequest("Hum this.", seed=planned.seed))
    assert torch.equal(whole.audio.samples, given.audio.samples)
    assert not given.applied.seed_drawn


def test_a_plan_runs_without_its_params_parsed_again(toy, monkeypatch):
    parsed = []
    parse = type(toy).parse_params
    monkeypatch.setattr(type(toy), "parse_params",
                        lambda self, params: (parsed.append(dict(params)), parse(self, params))[1])
    planned = plan_speech(toy, speech_order("Once.", seed=1, params={"char_seconds": 0.05}))
    list(speak(toy, planned, stream=True))
    next(speak(toy, planned, stream=False))
    assert parsed == [{"char_seconds": 0.05}]


def test_a_refused_request_is_refused_by_the_plan_before_it_runs(toy):
    with pytest.raises(errors.InvalidRequest, match="params"):
        plan_speech(toy, speech_order("x", params={"nope": 1}))
    with pytest.raises(errors.UnsupportedCapability):
        toy.plan(SynthesisRequest("x", instruction="a low voice"))
    with pytest.raises(errors.InvalidRequest, match="speed"):
        speech_order("x", speed=9.0)
    with pytest.raises(errors.InvalidRequest, match="given twice"):
        speech_order("x", speed=2.0, params={"speed": 2.0})
    with pytest.raises(errors.UnsupportedSetting, match="no speed setting"):
        plan_speech(toy, speech_order("x", speed=2.0))  # the toy declares no speed


def test_an_optional_instruction_is_dropped_with_a_warning_keeping_the_notices(toy):
    order = speech_order("Hum\x07 this.", instruction="a low voice", seed=2,
                         optional_instruction=True)
    planned = plan_speech(toy, order)
    assert planned.plan.request.instruction is None
    assert planned.warnings == ("instructions ignored: the toy model cannot design voices",)
    assert planned.plan.notices == order.request.notices != ()
    # blank: none where the instruction is optional (OpenAI's clients), else refused as empty
    # (`say --instruction ""`, a batch line), as the request's own check names it
    assert speech_order("x", instruction="  ", optional_instruction=True) \
        .request.instruction is None
    with pytest.raises(errors.InvalidRequest, match="instruction: is empty"):
        speech_order("x", instruction="  ")


def test_a_plan_of_another_model_is_refused(toy):
    plan = toy.plan(SynthesisRequest("x", seed=1))
    other = RequestPlan(plan.request, plan.params, 1, False, toy.name, "another")
    with pytest.raises(errors.InvalidRequest, match="planned by another model"):
        toy.synthesize(other)


def test_an_api_1_0_engine_runs_the_request_with_the_planned_seed():
    from conftest import FakeEngine

    engine = FakeEngine("m", FakeEngine.options_class())
    planned = plan_speech(engine, SpeechOrder(SynthesisRequest("x"), "x", speed=2.0))
    chunk = next(speak(engine, planned, stream=False))
    assert chunk.applied.seed == planned.seed
    # it was handed the seed as if the client had sent it: the service reports it as drawn
    assert chunk.applied.seed_drawn
    given = plan_speech(engine, speech_order("x", seed=planned.seed))
    assert not next(speak(engine, given, stream=False)).applied.seed_drawn


def test_an_api_1_0_engine_without_a_params_class_reads_its_params_itself():
    from conftest import FakeEngine

    class OwnParams(FakeEngine):
        params_class = None

    engine = OwnParams("m", FakeEngine.options_class())
    planned = plan_speech(engine, speech_order("x", params={"its_own": 1}))
    assert planned.plan.params is None and planned.plan.request.params == {"its_own": 1}


def test_an_api_1_0_engine_keeps_taking_what_it_did_not_declare_with_a_warning(toy):
    from conftest import FakeEngine

    from mizuoto.contracts.api import PluginAPIDeprecation

    engine = FakeEngine("m", FakeEngine.options_class())
    assert "design" not in {c.value for c in engine.info.capabilities}
    # an API 1.0 plugin checked its own requests: what it took unplanned, it still takes
    with pytest.warns(PluginAPIDeprecation, match="'design' without declaring it"):
        planned = plan_speech(engine, speech_order("x", instruction="a low voice"))
    assert planned.plan.request.instruction == "a low voice"
    # an engine at the current API is refused, before it runs
    with pytest.raises(errors.UnsupportedCapability):
        toy.plan(SynthesisRequest("x", instruction="a low voice"))


def test_a_document_is_planned_once_and_its_sections_seeded_from_its_seed(toy, monkeypatch):
    parsed = []
    parse = type(toy).parse_params
    monkeypatch.setattr(type(toy), "parse_params",
                        lambda self, params: (parsed.append(dict(params)), parse(self, params))[1])
    document = plan_document(toy, speech_order("Start.", params={"char_seconds": 0.05}))
    assert document.plan.seed_drawn and document.seed == document.plan.seed
    sections = [document.section(k, text) for k, text in enumerate(["One.", "Two\x07."])]
    assert parsed == [{"char_seconds": 0.05}]  # the document's plan only
    assert [s.seed for s in sections] == [section_seed(document.seed, k) for k in (0, 1)]
    assert sections[0].seed == document.seed != sections[1].seed
    assert sections[1].plan.request.text == "Two." and sections[1].plan.notices != ()
    # a section runs as the request of its text with its seed given would
    [spoken] = speak(toy, sections[1], stream=False)
    given = toy.synthesize(SynthesisRequest("Two.", seed=sections[1].seed,
                                            params={"char_seconds": 0.05}))
    assert torch.equal(spoken.audio.samples, given.audio.samples)
    resumed = document.with_seed(7, False)
    assert (resumed.seed, resumed.plan.seed_drawn, resumed.section(0, "x").seed) == (7, False, 7)
