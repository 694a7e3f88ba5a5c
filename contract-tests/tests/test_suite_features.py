"""The suite catches what a plugin that declares batching, LoRA, a choice param and its
languages can break: the classes a new kind of plugin slipped through in round 5.

Runs the suite in-process (pytester) on ``toy_features`` (registered directly, not installed):
as it is, then with one breakage at a time; each must fail, naming its cause.
"""

from __future__ import annotations

import attrs
import numpy  # noqa: F401  (imported once, before any in-process run: see test_frozen_plugin)
import pytest
import torch
import torch._dynamo  # imported once, before any in-process run (see test_suite.py)
from suite_selection import FRESH_PROCESS_TESTS

from mizuoto import plugins

pytest_plugins = ["pytester"]

# Every contract test generated for the feature toy, with its batching and LoRA checks, the 3
# step-interface checks (it is a ToyEngine, which declares SupportsSteps) and the 2 plugin
# tests run in this process (its hooks run, its EngineRef matches).
FEATURE_TESTS = 47


@pytest.fixture
def run_suite(pytester, monkeypatch):
    import toy_features

    monkeypatch.setenv("MIZUOTO_PLUGINS", "")
    plugins.reset_plugins()
    plugins.load_plugins()
    plugins.pm.register(toy_features, name="toy-features")

    def run(*args):
        return pytester.runpytest_inprocess(
            "--pyargs", "mizuoto_contract", "-p", "no:cacheprovider", "--mizuoto-engine",
            "feature-toy", "-k", f"not ToyTrainer and not ({FRESH_PROCESS_TESTS})", *args)

    yield run
    plugins.reset_plugins()


@pytest.fixture
def toy():
    from toy_features.engine import FeatureToy

    return FeatureToy


def _assert_caught(result, *patterns):
    assert result.ret != 0, "the suite passed a broken engine"
    result.stdout.fnmatch_lines([f"*{pattern}*" for pattern in patterns], consecutive=False)


def test_the_feature_toy_passes(run_suite):
    result = run_suite()
    outcomes = result.parseoutcomes()
    assert result.ret == 0, result.stdout.str()[-4000:]
    assert outcomes.get("passed") == FEATURE_TESTS and "skipped" not in outcomes, outcomes
    assert "PluginAPIDeprecation" not in result.stdout.str()


def test_batch_rows_sharing_one_generator_are_caught(run_suite, monkeypatch, toy):
    # every row draws from a generator seeded with the batch's first seed
    monkeypatch.setattr(toy, "_row_generator",
                        lambda self, batch, generator: torch.Generator().manual_seed(batch[0]))
    _assert_caught(run_suite("-k", "batch_mates"),
                   "row 1 of a batch of 3 and alone differ: *Likely cause: the row depends on "
                   "its batch mates (a generator or noise shared by the batch",
                   "FAILED *test_batched_rows_do_not_depend_on_their_batch_mates*")


def test_a_batch_generator_seeded_by_its_mates_is_caught(run_suite, monkeypatch, toy):
    # every row draws from a generator seeded with the sum of the batch's seeds
    monkeypatch.setattr(toy, "_row_generator",
                        lambda self, batch, generator: torch.Generator().manual_seed(sum(batch)))
    _assert_caught(run_suite("-k", "batch_mates"),
                   "a batched row with mates of seeds 1235, 1236 and with mates of 1335, 1336 "
                   "differ*Likely cause: the rows of a batch draw from one generator")


def test_an_ignored_choice_param_is_caught(run_suite, monkeypatch, toy):
    hum = toy._hum
    monkeypatch.setattr(toy, "_hum", lambda self, text, params, *args: hum(
        self, text, attrs.evolve(params, timbre="sine"), *args))
    _assert_caught(run_suite("-k", "declared_param"),
                   "params changed nothing (seed 1234): timbre (tried 'soft'; the fixture's "
                   "'sine'). Likely cause: the engine declares them but never reads them")


def _latin_only(stream, *, warn: bool):
    """``stream`` behind a tokenizer that knows ASCII only: the rest is dropped, and, with
    ``warn``, reported in the pieces' warnings."""
    from mizuoto.text.coverage import dropped_characters_warning

    def speak(self, request, *args):
        dropped = [char for char in request.text if ord(char) >= 128]
        text = "".join(char for char in request.text if ord(char) < 128)
        pieces = stream(self, attrs.evolve(request, text=text), *args)
        warning = dropped_characters_warning(dropped, request.text, "nothing")
        if not (warn and warning):
            return pieces
        return (attrs.evolve(piece, warnings=(warning,)) for piece in pieces)

    return speak


def test_non_latin_characters_dropped_silently_are_caught(run_suite, monkeypatch, toy):
    monkeypatch.setattr(toy, "_stream", _latin_only(toy._stream, warn=False))
    _assert_caught(run_suite("-k", "drops"),
                   "characters dropped silently: Cyrillic ('привет'), Han ('你好世界'), Arabic*"
                   "Likely cause: the tokenizer maps characters it lacks to a filler")


def test_dropped_characters_that_are_reported_pass(run_suite, monkeypatch, toy):
    monkeypatch.setattr(toy, "_stream", _latin_only(toy._stream, warn=True))
    run_suite("-k", "drops").assert_outcomes(passed=1)


def test_an_ignored_lora_is_caught(run_suite, monkeypatch, toy):
    monkeypatch.setattr(toy, "set_lora", lambda self, path: setattr(
        self, "_lora", None if path is None else str(path)))
    _assert_caught(run_suite("-k", "lora"),
                   "a LoRA (ContractFixture.make_lora, seed 1) gave the base model's audio*"
                   "Likely cause: set_lora records the adapter but never applies its weights")


def test_a_hot_swap_that_keeps_the_previous_lora_is_caught(run_suite, monkeypatch, toy):
    from toy_features.engine import read_lora

    def stacking(self, path):  # adds the new adapter to the levels as they are
        if path is None:
            self._level, self._lora = self._base_level, None
            return
        self._level = self._level + read_lora(path, self._base_level.shape)
        self._lora = str(path)

    monkeypatch.setattr(toy, "set_lora", stacking)
    _assert_caught(run_suite("-k", "lora"),
                   "a LoRA swapped in over another and the same LoRA on a clean model differ*"
                   "Likely cause: the swap keeps the previous adapter applied")


def test_a_lora_removal_that_leaves_it_applied_is_caught(run_suite, monkeypatch, toy):
    set_lora = toy.set_lora
    monkeypatch.setattr(toy, "set_lora", lambda self, path: (
        setattr(self, "_lora", None) if path is None else set_lora(self, path)))
    _assert_caught(run_suite("-k", "lora"),
                   "the audio after set_lora(None) and before any LoRA differ*Likely cause: "
                   "removing a LoRA leaves part of it applied")
