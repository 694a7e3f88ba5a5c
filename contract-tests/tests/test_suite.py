"""The contract suite catches broken engines, and generates its tests from capabilities.

Runs the suite in-process (pytest's ``pytester``) against the example plugin's toy engine
(``docs/examples/mizuoto-example``, installed wherever Mizuoto's tests run): as it is, then
with one contract point broken at a time.
"""

from __future__ import annotations

import secrets

import attrs
import pytest

from mizuoto import Capability, plugins
from mizuoto.errors import CheckpointMismatch
from mizuoto_example import engine as toy_engine
from mizuoto_example.engine import ToyEngine

pytest_plugins = ["pytester"]

# Per toy model: 19 tests, plus test_empty_text_is_refused once; edit, design, long text and
# the refused-reference-text test do not apply to the toy. Three of them check hostile input
# (non-finite numbers, NaN weights, a Hypothesis property).
TOY_TESTS = 23
TOY_DESELECTED = 4


@pytest.fixture
def run_suite(pytester, monkeypatch):
    monkeypatch.setenv("MIZUOTO_PLUGINS", "example")
    plugins.reset_plugins()

    def run(*args):
        return pytester.runpytest_inprocess("--pyargs", "mizuoto_contract",
                                            "-p", "no:cacheprovider", *args)

    yield run
    plugins.reset_plugins()


def test_the_toy_engine_passes(run_suite):
    result = run_suite("--mizuoto-engine", "toy")
    result.assert_outcomes(passed=TOY_TESTS, deselected=TOY_DESELECTED)


def test_an_engine_that_ignores_the_seed_fails(run_suite, monkeypatch):
    monkeypatch.setattr(toy_engine, "resolve_seed",
                        lambda seed: (secrets.randbelow(2**32), False))
    result = run_suite()
    result.stdout.fnmatch_lines(["FAILED *test_seeded_synthesis_is_deterministic*toy/tiny*"])
    assert result.ret != 0


def test_an_engine_that_ignores_an_instruction_fails(run_suite, monkeypatch):
    prepare = ToyEngine._prepare
    monkeypatch.setattr(ToyEngine, "_prepare",
                        lambda self, request: prepare(self, attrs.evolve(request,
                                                                         instruction=None)))
    result = run_suite()
    result.stdout.fnmatch_lines(["FAILED *test_unsupported_capability_raises*toy/tiny-design*"])
    assert result.ret != 0


def test_an_engine_that_accepts_a_silent_reference_fails(run_suite, monkeypatch):
    monkeypatch.setattr(toy_engine, "check_not_silent", lambda samples, field: None)
    result = run_suite()
    result.stdout.fnmatch_lines(["FAILED *test_silent_reference_is_invalid_audio*toy/tiny*"])
    assert result.ret != 0


def test_capabilities_decide_which_tests_exist(run_suite, monkeypatch):
    info = ToyEngine.info.fget
    fewer = {Capability.STREAM, Capability.VOICE_CACHE}
    monkeypatch.setattr(ToyEngine, "info", property(
        lambda self: attrs.evolve(info(self), capabilities=info(self).capabilities - fewer)))
    result = run_suite("-v")
    # 3 stream and 2 voice tests are not generated; 2 refusal tests are, and pass.
    result.assert_outcomes(passed=TOY_TESTS - 3, deselected=TOY_DESELECTED + 5)
    result.stdout.fnmatch_lines(["*test_unsupported_capability_raises?toy/tiny-stream? PASSED*",
                                 "*test_unsupported_capability_raises?toy/tiny-voice_cache? "
                                 "PASSED*"])
    assert "test_stream_chunks_arrive_in_order" not in result.stdout.str()


def test_an_engine_without_fixtures_is_a_usage_error(run_suite):
    result = run_suite("--mizuoto-engine", "nope")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*--mizuoto-engine nope: no contract fixture registers that "
                                 "engine*"])


def test_a_model_that_fails_to_load_fails_the_plain_tests(run_suite, monkeypatch):
    def broken(cls, model_dir, **kwargs):
        raise CheckpointMismatch(str(model_dir), missing=["pitch"])

    monkeypatch.setattr(ToyEngine, "load", classmethod(broken))
    result = run_suite()
    # Its capabilities are unknown: of the 26 test functions, only the nine every model gets
    # are generated, and they error with the load error; test_empty_text_is_refused needs no
    # model; the other 16 are deselected.
    result.assert_outcomes(passed=1, errors=9, deselected=16)
    result.stdout.fnmatch_lines(["*contract fixture toy/tiny: writing or loading its model "
                                 "failed: CheckpointMismatch*"])
