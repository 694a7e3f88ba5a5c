"""The contract suite catches broken engines, and generates its tests from capabilities.

Runs the suite in-process (pytest's ``pytester``) against the example plugin's toy engine
(``docs/examples/mizuoto-example``, installed wherever Mizuoto's tests run): as it is, then
with one contract point broken at a time.
"""

from __future__ import annotations

import functools
import secrets

import attrs
import pytest
import torch

# pytester's in-process runs forget every module they import; torch's compiler (imported by the
# suite's operation counter) registers an operator library once per process, so it is imported
# here, before any run, and kept
import torch._dynamo
from suite_selection import FRESH_PROCESS_TESTS

from mizuoto import Audio, Capability, Engine, hookimpl, plugins
from mizuoto.contracts import engine as engine_base
from mizuoto.errors import CheckpointMismatch, InvalidRequest
from mizuoto_example import engine as toy_engine
from mizuoto_example.engine import ToyEngine

pytest_plugins = ["pytester"]

# Per toy model: 36 tests (8 of them in test_behaviour_contract; 3 in test_step_contract and
# the batching one of test_feature_contract: the toy declares the step interface, a
# SupportsBatching), plus test_empty_text_is_refused once; edit, design, long text and the
# refused-reference-text test do not apply to the toy. Three of them check hostile input
# (non-finite numbers, NaN weights, a Hypothesis property). Then 2 of test_plugin_contract: the
# plugin loads and its hooks run, its EngineRef matches. The toy declares the step interface (a
# SupportsBatching: the batching check of test_feature_contract runs) and LoRA targets (the
# feature contract's LoRA check and test_adapter_contract's run on it).
TOY_TESTS = 48
# 4 that do not apply, the 20 trainer-contract tests run_suite leaves to the contract session
# (10 per method: the toy trainer declares LoRA targets, so it has full and lora) and the 3
# checks in fresh interpreters (the listing: test_the_listing_check_runs_in_the_suite)
TOY_DESELECTED = 27


@pytest.fixture
def run_suite(pytester, monkeypatch):
    monkeypatch.setenv("MIZUOTO_PLUGINS", "toy")
    plugins.reset_plugins()

    def run(*args):
        # the trainer contract runs in the contract session's own process: in-process reruns
        # of it here re-import torch's inductor test ops, which refuses a second registration;
        # the checks in fresh interpreters (seconds each) run in their own test
        return pytester.runpytest_inprocess("--pyargs", "mizuoto_contract",
                                            "-p", "no:cacheprovider", "-k",
                                            f"not ToyTrainer and not ({FRESH_PROCESS_TESTS})",
                                            *args)

    yield run
    plugins.reset_plugins()


def test_the_toy_engine_passes(run_suite):
    result = run_suite("--mizuoto-engine", "toy")
    result.assert_outcomes(passed=TOY_TESTS, deselected=TOY_DESELECTED)


def test_an_engine_that_ignores_the_seed_fails(run_suite, monkeypatch):
    monkeypatch.setattr(ToyEngine, "make_generator",
                        lambda self, seed: torch.Generator().manual_seed(secrets.randbelow(2**32)))
    result = run_suite()
    result.stdout.fnmatch_lines(["FAILED *test_seeded_synthesis_is_deterministic*toy/tiny*"])
    # the failure says what differs and the likely cause, not a bare assert False
    result.stdout.fnmatch_lines(["*two runs of the same seeded request differ: shape (*), * "
                                 "values differ, the first at index (*), max |diff| *"
                                 "Likely cause: the engine draws from an unseeded*"],
                                consecutive=False)
    assert result.ret != 0


def test_an_engine_that_ignores_an_instruction_fails(run_suite, monkeypatch):
    monkeypatch.setattr(ToyEngine, "require", lambda self, capability: None
                        if capability is Capability.DESIGN else Engine.require(self, capability))
    result = run_suite()
    result.stdout.fnmatch_lines(["FAILED *test_unsupported_capability_raises*toy/tiny-design*"])
    assert result.ret != 0


def test_an_engine_that_accepts_a_silent_reference_fails(run_suite, monkeypatch):
    from mizuoto.nn.dsp import reference

    # the toy reads references with mizuoto.plugin.read_reference, which calls this check
    monkeypatch.setattr(reference, "check_not_silent", lambda samples, field: None)
    result = run_suite()
    result.stdout.fnmatch_lines(["FAILED *test_silent_reference_is_invalid_audio*toy/tiny*"])
    assert result.ret != 0


def test_capabilities_decide_which_tests_exist(run_suite, monkeypatch):
    info = ToyEngine.info.fget
    fewer = {Capability.STREAM, Capability.VOICE_CACHE}
    monkeypatch.setattr(ToyEngine, "info", property(
        lambda self: attrs.evolve(info(self), capabilities=info(self).capabilities - fewer)))
    result = run_suite("-v")
    # 7 stream and 2 voice tests are not generated; 2 refusal tests are, and pass. The listing
    # (the EngineRef) still promises both: its check fails, naming them.
    result.assert_outcomes(passed=TOY_TESTS - 8, failed=1, deselected=TOY_DESELECTED + 9)
    result.stdout.fnmatch_lines(["*the listing of 'toy' promises what no model of the engine "
                                 "can do: stream, voice_cache*"], consecutive=False)
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
    # Its capabilities are unknown: only the tests every model gets are generated (18
    # functions, one of them for three texts, one for two settings, the 3 step-interface tests
    # and the batching one, and the two LoRA checks: those ask the engine class, which declares
    # them), and they error with the load error; the others are deselected. Of the plugin's own
    # tests, the EngineRef check fails with the load error; its hooks pass.
    result.assert_outcomes(passed=1, failed=1, errors=28, deselected=44)
    result.stdout.fnmatch_lines(["*contract fixture toy/tiny: writing or loading its model "
                                 "failed: CheckpointMismatch*"])


@pytest.mark.parametrize("graceful_stop", [False, True])
def test_the_stop_signal_test_is_generated_for_trainers_that_declare_it(run_suite, monkeypatch,
                                                                        graceful_stop):
    """A trainer written before ``Trainer.graceful_stop`` existed (False by default) gets the
    other trainer tests, not the stop-signal one."""
    from mizuoto import Trainer, registry

    class ToyTrainer(Trainer):
        engine = "toy"
        methods = frozenset({"full"})

        def prepare(self, config, *, progress=None): ...
        def train(self, run, *, progress=None): ...
        def export(self, run, destination): ...

    ToyTrainer.graceful_stop = graceful_stop
    monkeypatch.setattr(registry, "trainers",  # cached, as the real one (cache_clear)
                        functools.cache(lambda: {("toy", "ToyTrainer"): ToyTrainer}))
    result = run_suite("--mizuoto-engine", "toy", "--collect-only", "-q",
                       "-k", "trainer_contract")
    collected = result.stdout.str()
    assert ("test_resume_after_sigkill_exports_the_same_weights[toy-ToyTrainer-full-first-update]"
            in collected)
    stop_test = "test_a_stop_signal_saves_the_checkpoint_and_resumes_identically"
    assert (f"{stop_test}[toy-ToyTrainer-full]" in collected) is graceful_stop


def test_the_listing_check_runs_in_the_suite(run_suite):
    # the start-up variants (three fresh interpreters with torch) are not run again here: the
    # contract session runs them against every installed engine, the toy's included
    result = run_suite("--mizuoto-engine", "toy", "-k", "imports_no_torch", "-v")
    outcomes = result.parseoutcomes()
    assert (outcomes.get("passed"), outcomes.get("failed")) == (1, None), outcomes
    result.stdout.fnmatch_lines(["*test_listing_the_plugin_imports_no_torch?toy? PASSED*"])


class _BrokenPlugin:
    """A plugin whose trainer hook imports a module not yet written (its engine is fine)."""

    @staticmethod
    @hookimpl
    def register_trainers(register):
        import mizuoto_hum_training_not_written  # noqa: F401


def test_a_hook_that_raises_is_a_failing_test_and_the_rest_runs(run_suite):
    plugins.load_plugins()
    plugins.pm.register(_BrokenPlugin, name="hum")
    result = run_suite("--mizuoto-engine", "toy", "-k", "hooks_run or seeded")
    # the toy's own plugin test and its 3 seeded tests still run and pass
    result.assert_outcomes(failed=1, passed=4)
    result.stdout.fnmatch_lines([
        "*plugin 'hum': its register_trainers hook raised ModuleNotFoundError: No module named "
        "'mizuoto_hum_training_not_written'*",
        "FAILED *test_the_plugin_loads_and_its_hooks_run[[]hum[]]*"], consecutive=False)


def test_a_plugin_that_fails_to_import_is_a_failing_test(run_suite, monkeypatch):
    import importlib.metadata

    entry_points = importlib.metadata.entry_points
    broken = importlib.metadata.EntryPoint("hum", "mizuoto_hum_not_written", "mizuoto")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: (
        [*entry_points(**kw), broken] if kw.get("group") == "mizuoto" else entry_points(**kw)))
    monkeypatch.setenv("MIZUOTO_PLUGINS", "toy,hum")
    plugins.reset_plugins()
    result = run_suite("--mizuoto-engine", "toy", "-k", "hooks_run")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*plugin 'hum' was not loaded: importing mizuoto_hum_not_written"
                                 " failed: ModuleNotFoundError*"], consecutive=False)


# -- mutations: each breakage a plugin author could make is caught ---------------------------

def _patch_result(monkeypatch, change):
    """Route every synthesize result and streamed chunk of the toy through ``change``."""
    hum = ToyEngine._hum

    def broken(self, *args, **kwargs):
        for piece in hum(self, *args, **kwargs):
            yield attrs.evolve(piece, audio=change(piece.audio))

    monkeypatch.setattr(ToyEngine, "_hum", broken)


def _assert_caught(result, *patterns):
    assert result.ret != 0, "the suite passed a broken engine"
    result.stdout.fnmatch_lines([f"*{pattern}*" for pattern in patterns], consecutive=False)


def test_unscaled_int16_samples_are_caught(run_suite, monkeypatch):
    _patch_result(monkeypatch, lambda audio: Audio((audio.samples * 32767).round(),
                                                    audio.sample_rate))
    _assert_caught(run_suite("--mizuoto-engine", "toy"), "beyond full scale (1.0)")


def test_clipped_audio_is_caught(run_suite, monkeypatch):
    _patch_result(monkeypatch, lambda audio: Audio((audio.samples * 1000).clamp(-1, 1),
                                                   audio.sample_rate))
    _assert_caught(run_suite("--mizuoto-engine", "toy"), "the signal is clipped")


def test_audio_at_another_rate_than_declared_is_caught(run_suite, monkeypatch):
    _patch_result(monkeypatch, lambda audio: Audio(audio.samples, audio.sample_rate * 2))
    _assert_caught(run_suite("--mizuoto-engine", "toy"), "return audio at the rate the model")


def test_stereo_output_is_caught(run_suite, monkeypatch):
    # Audio refuses 2-D samples: the engine fails with InvalidAudio instead of returning them
    _patch_result(monkeypatch, lambda audio: Audio(torch.stack([audio.samples] * 2),
                                                   audio.sample_rate))
    _assert_caught(run_suite("--mizuoto-engine", "toy"), "InvalidAudio*must be 1-D")


def test_silent_output_is_caught(run_suite, monkeypatch):
    _patch_result(monkeypatch, lambda audio: Audio(audio.samples * 0, audio.sample_rate))
    _assert_caught(run_suite("--mizuoto-engine", "toy"), "is silent")


def test_license_missing_from_applied_is_caught(run_suite, monkeypatch):
    def no_license(self, call, rendered):
        return attrs.evolve(Engine._applied(self, call, rendered), license=None)

    monkeypatch.setattr(ToyEngine, "_applied", no_license)
    _assert_caught(run_suite("--mizuoto-engine", "toy"), "applied.license and applied.non_comm")


def test_an_unseeded_request_without_a_drawn_seed_is_caught(run_suite, monkeypatch):
    monkeypatch.setattr(engine_base, "resolve_seed",
                        lambda seed: (0 if seed is None else seed, False))
    _assert_caught(run_suite("--mizuoto-engine", "toy"),
                   "an unseeded request must report seed_drawn=True")


def _declare(monkeypatch, capability):
    info = ToyEngine.info.fget
    monkeypatch.setattr(ToyEngine, "info", property(
        lambda self: attrs.evolve(info(self), capabilities=info(self).capabilities
                                  | {capability})))


def test_design_declared_but_instruction_ignored_is_caught(run_suite, monkeypatch):
    _declare(monkeypatch, Capability.DESIGN)  # the toy hums the same tune whatever it is told
    _assert_caught(run_suite("--mizuoto-engine", "toy"),
                   "test_design?toy/tiny?", "must use request.instruction")


def test_a_declared_capability_that_raises_is_caught(run_suite, monkeypatch):
    _declare(monkeypatch, Capability.EDIT)  # the toy does not implement edit()
    _assert_caught(run_suite("--mizuoto-engine", "toy"), "test_edit?toy/tiny?",
                   "does not implement edit()")


def test_an_undeclared_capability_that_works_is_caught(run_suite, monkeypatch):
    info = ToyEngine.info.fget
    monkeypatch.setattr(ToyEngine, "info", property(
        lambda self: attrs.evolve(info(self),
                                  capabilities=info(self).capabilities - {Capability.STREAM})))
    monkeypatch.setattr(ToyEngine, "require", lambda self, capability: None)
    _assert_caught(run_suite("--mizuoto-engine", "toy"),
                   "test_unsupported_capability_raises?toy/tiny-stream?")


def test_a_crash_on_text_without_words_is_caught(run_suite, monkeypatch):
    stream = ToyEngine._stream

    def crash(self, request, *args):
        if not any(char.isalnum() for char in request.text):
            raise IndexError("list index out of range")
        return stream(self, request, *args)

    monkeypatch.setattr(ToyEngine, "_stream", crash)
    _assert_caught(run_suite("--mizuoto-engine", "toy"),
                   "test_text_without_words_is_spoken_or_refused_by_name?toy/tiny-*")


def test_a_dc_offset_is_caught(run_suite, monkeypatch):
    _patch_result(monkeypatch, lambda audio: Audio(audio.samples + 0.5, audio.sample_rate))
    _assert_caught(run_suite("--mizuoto-engine", "toy"), "has a DC offset: its mean is 0.5",
                   "remove it so the samples swing around zero")


def test_a_text_cut_short_is_caught(run_suite, monkeypatch):
    hum = ToyEngine._hum
    monkeypatch.setattr(ToyEngine, "_hum", lambda self, text, *args: hum(self, text[:20], *args))
    _assert_caught(run_suite("--mizuoto-engine", "toy"),
                   "test_longer_text_gives_longer_audio_or_is_refused_by_name?toy/tiny?",
                   "Likely cause: the text is cut")


def test_a_text_cut_beyond_the_longest_sentence_is_caught(run_suite, monkeypatch):
    hum = ToyEngine._hum
    monkeypatch.setattr(ToyEngine, "_hum", lambda self, text, *args: hum(self, text[:200], *args))
    _assert_caught(run_suite("--mizuoto-engine", "toy", "-k", "thousands or longer_text"),
                   "Likely cause: the text is cut beyond some length",
                   "FAILED *test_thousands_of_characters_are_spoken_whole*toy/tiny*")


def test_a_stream_computed_whole_before_its_first_chunk_is_caught(run_suite, monkeypatch):
    hum = ToyEngine._hum
    monkeypatch.setattr(ToyEngine, "_hum", lambda self, *args: iter(list(hum(self, *args))))
    _assert_caught(run_suite("--mizuoto-engine", "toy", "-k", "first_chunk"),
                   "_stream computes the whole utterance",
                   "FAILED *test_the_first_chunk_arrives_before_the_rest*toy/tiny*")


def test_an_ignored_reference_is_caught(run_suite, monkeypatch):
    monkeypatch.setattr(toy_engine, "_analyse", lambda audio: toy_engine._NEUTRAL)
    _assert_caught(run_suite("--mizuoto-engine", "toy", "-k", "reference_changes"),
                   "synthesis ignores request.reference",
                   "FAILED *test_the_reference_changes_the_audio*toy/tiny*")


def test_an_ignored_declared_param_is_caught(run_suite, monkeypatch):
    hum = ToyEngine._hum
    monkeypatch.setattr(ToyEngine, "_hum", lambda self, text, params, *args: hum(
        self, text, attrs.evolve(params, char_seconds=0.02), *args))
    _assert_caught(run_suite("--mizuoto-engine", "toy", "-k", "declared_param"),
                   "params changed nothing (seed 1234): char_seconds (tried 0.005, 0.08; the "
                   "fixture's 0.02). Likely cause: the engine declares them but never reads",
                   "FAILED *test_every_declared_param_changes_the_audio*toy/tiny*")


def test_memory_kept_per_request_is_caught(run_suite, monkeypatch):
    kept = []
    synthesize = ToyEngine._synthesize

    def leaking(self, *args):
        kept.append(torch.ones(5 * 2**18))  # 5 MiB each request, never freed
        return synthesize(self, *args)

    monkeypatch.setattr(ToyEngine, "_synthesize", leaking)
    _assert_caught(run_suite("--mizuoto-engine", "toy", "-k", "memory"),
                   "grew the resident memory by", "FAILED *test_memory_stays_flat*toy/tiny*")


@pytest.mark.parametrize("plugin_api", ["1.0", "1.1"])
def test_a_fixture_without_a_license_is_named(run_suite, monkeypatch, plugin_api):
    """The license check runs without the declaration (assuming what the engine reports) and
    then names the missing declaration: a failure for a plugin written for API 1.1, a
    deprecation and the closing line for one written for 1.0."""
    from mizuoto import registry

    listed = registry.contract_fixtures
    monkeypatch.setattr(registry, "contract_fixtures", functools.cache(lambda: {  # cache_clear
        key: attrs.evolve(fixture, license=None) for key, fixture in listed().items()}))
    monkeypatch.setattr(ToyEngine, "plugin_api", plugin_api)
    result = run_suite("--mizuoto-engine", "toy", "-k", "license")
    result.stdout.fnmatch_lines(["*declares no license (checked assuming the engine's report, "
                                 "'Apache-2.0'*Fix: set ContractFixture(license=*"],
                                consecutive=False)
    if plugin_api == "1.1":
        assert result.ret != 0
        return
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["plugin mizuoto_example (engine toy) is written for API 1.0; "
                                 "it misses 1 requirements of 1.1: "
                                 "test_the_license_is_declared*"], consecutive=False)


def test_a_long_text_refused_by_name_passes_the_first_chunk_check(run_suite, monkeypatch):
    """An engine without LONG_TEXT may refuse a long text naming ``text`` (the toy does beyond
    ``params.max_seconds``): the incremental-stream check accepts it."""
    from mizuoto import registry

    listed = registry.contract_fixtures
    monkeypatch.setattr(registry, "contract_fixtures", functools.cache(lambda: {  # cache_clear
        key: attrs.evolve(fixture, request_params={**fixture.request_params, "max_seconds": 5.0})
        for key, fixture in listed().items()}))
    run_suite("--mizuoto-engine", "toy", "-k", "first_chunk").assert_outcomes(passed=1)


def test_a_generator_never_drawn_from_is_caught(run_suite, monkeypatch):
    hum = ToyEngine._hum

    def own_generator(self, text, params, shape, generator, progress):
        mine = torch.Generator().manual_seed(generator.initial_seed() + 1)
        return hum(self, text, params, shape, mine, progress)

    monkeypatch.setattr(ToyEngine, "_hum", own_generator)
    _assert_caught(run_suite("--mizuoto-engine", "toy", "-k", "generator_passed"),
                   "was never drawn from*seeded its own generators with [[]1235[]]",
                   "FAILED *test_the_generator_passed_is_the_one_drawn_from*toy/tiny*")


def test_a_generator_derived_from_the_one_passed_passes(run_suite, monkeypatch):
    """An engine whose upstream needs its own generator (VoxCPM) seeds it from the one passed:
    what it reports is what it used, so the check passes."""
    hum = ToyEngine._hum

    def derived(self, text, params, shape, generator, progress):
        mine = torch.Generator().manual_seed(generator.initial_seed())
        return hum(self, text, params, shape, mine, progress)

    monkeypatch.setattr(ToyEngine, "_hum", derived)
    run_suite("--mizuoto-engine", "toy", "-k", "generator_passed").assert_outcomes(passed=1)


def test_a_voice_that_synthesis_ignores_blames_synthesis(run_suite, monkeypatch):
    stream = ToyEngine._stream

    def voiceless(self, request, *args):  # build_voice is right; synthesis drops the voice
        return stream(self, attrs.evolve(request, voice=None) if request.voice else request,
                      *args)

    monkeypatch.setattr(ToyEngine, "_stream", voiceless)
    _assert_caught(run_suite("--mizuoto-engine", "toy", "-k", "saved_voice"),
                   "Likely cause: synthesis ignores request.voice*build_voice is not at fault",
                   "FAILED *test_saved_voice_speaks_like_its_reference*toy/tiny*")


def test_a_stream_on_the_global_rng_is_named(run_suite, monkeypatch):
    stream = ToyEngine._stream

    def whole(self, request, params, generator, progress):  # synthesis as before
        pieces = list(stream(self, request, params, generator, progress))
        samples = torch.cat([piece.audio.samples for piece in pieces])
        return attrs.evolve(pieces[-1], audio=Audio(samples, pieces[-1].audio.sample_rate))

    def global_rng(self, request, params, generator, progress):  # the stream ignores its own
        return stream(self, request, params, torch.default_generator, progress)

    monkeypatch.setattr(ToyEngine, "_synthesize", whole)
    monkeypatch.setattr(ToyEngine, "_stream", global_rng)
    _assert_caught(run_suite("--mizuoto-engine", "toy", "-k", "two_threads"),
                   "Likely cause: the given generator is not used: the audio follows torch's "
                   "global RNG",
                   "FAILED *test_streams_from_two_threads_match_each_alone*toy/tiny*")


def test_int16_stream_chunks_are_named(run_suite, monkeypatch):
    stream = ToyEngine._stream

    def whole(self, *args):  # synthesis as before, from the float32 pieces
        pieces = list(stream(self, *args))
        samples = torch.cat([piece.audio.samples for piece in pieces])
        return attrs.evolve(pieces[-1], audio=Audio(samples, pieces[-1].audio.sample_rate))

    def quantised(self, *args):  # the stream's chunks rounded to 16-bit PCM
        for piece in stream(self, *args):
            samples = (piece.audio.samples * 32768).round() / 32768
            yield attrs.evolve(piece, audio=Audio(samples, piece.audio.sample_rate))

    monkeypatch.setattr(ToyEngine, "_synthesize", whole)
    monkeypatch.setattr(ToyEngine, "_stream", quantised)
    _assert_caught(run_suite("--mizuoto-engine", "toy", "-k", "stream_matches"),
                   "one side is quantised to 16-bit PCM",
                   "FAILED *test_stream_matches_synthesis*toy/tiny*")


@pytest.mark.parametrize("setting", ["steps", "guidance"])
def test_an_ignored_sampler_setting_is_caught(run_suite, monkeypatch, setting):
    # the toy declares it has no sampler; one that claims both and uses neither is caught
    monkeypatch.setattr(ToyEngine, "request_settings", frozenset({"steps", "guidance"}))
    _assert_caught(run_suite("--mizuoto-engine", "toy", "-k", setting),
                   f"test_sampler_settings_change_the_audio_or_are_refused?toy/tiny-{setting}?",
                   f"the engine ignores {setting}")


def test_audio_relabelled_at_another_rate_is_caught(run_suite, monkeypatch):
    """16 kHz samples labelled 24 kHz, ModelInfo saying 24 kHz too: only the duration rule the
    fixture declares tells."""
    info = ToyEngine.info.fget
    monkeypatch.setattr(ToyEngine, "info", property(
        lambda self: attrs.evolve(info(self), sample_rate=24000)))
    synthesize = ToyEngine._synthesize

    def relabelled(self, *args):
        rendered = synthesize(self, *args)
        return attrs.evolve(rendered, audio=Audio(rendered.audio.samples, 24000))

    monkeypatch.setattr(ToyEngine, "_synthesize", relabelled)
    _assert_caught(run_suite("--mizuoto-engine", "toy", "-k", "sample_rate"),
                   "s per character at the declared 24000 Hz*"
                   "Likely cause: samples made at another rate")


def test_a_request_that_walks_into_an_open_stream_is_caught(run_suite, monkeypatch):
    """An engine that declares concurrent_requests but keeps a request's state in the
    instance (here: its generator)."""
    hum = ToyEngine._hum

    def shared_generator(self, text, params, shape, generator, progress):
        self.__dict__.setdefault("generator", generator).set_state(generator.get_state())
        return hum(self, text, params, shape, self.generator, progress)

    monkeypatch.setattr(ToyEngine, "_hum", shared_generator)
    monkeypatch.setattr(ToyEngine, "concurrent_requests", True)
    _assert_caught(run_suite("--mizuoto-engine", "toy", "-k", "during_a_stream"),
                   "a stream with a request run during it, and the stream alone differ: *"
                   "Likely cause: the request walked into the stream's state")


# -- trainer mutations (a toy trainer; the SIGKILL resume runs in a subprocess, which only
# installed plugins reach, so these select the in-process trainer tests) ---------------------

def _with_toy_trainer(monkeypatch, trainer_cls):
    from mizuoto import registry

    monkeypatch.setattr(registry, "trainers",
                        functools.cache(lambda: {("toy", "ToyTrainer"): trainer_cls}))


def test_the_toy_trainer_passes_the_in_process_trainer_tests(run_suite, monkeypatch):
    from toy_trainer import ToyTrainer

    _with_toy_trainer(monkeypatch, ToyTrainer)
    result = run_suite("--mizuoto-engine", "toy", "-k", "trainer_contract and not sigkill")
    result.assert_outcomes(passed=6)


@pytest.mark.parametrize("plugin_api", ["1.0", "1.1"])
def test_a_save_the_suite_cannot_interrupt_fails_or_warns_never_skips(run_suite, monkeypatch,
                                                                       plugin_api):
    """The kill-during-save check on a run that finishes (it saved its checkpoint no way the
    suite can interrupt; here its child process is stood in for): a failure naming the fix
    for a plugin written for API 1.1, a deprecation and the closing line for one written for
    1.0; a skip for neither."""
    import subprocess

    from toy_trainer import ToyTrainer

    _with_toy_trainer(monkeypatch, ToyTrainer)
    monkeypatch.setattr(ToyEngine, "plugin_api", plugin_api)
    monkeypatch.setattr(subprocess, "run",
                        lambda args, **_: subprocess.CompletedProcess(args, 0, b"", b""))
    result = run_suite("--mizuoto-engine", "toy", "-k", "during_a_checkpoint_save",
                       "-W", "default::DeprecationWarning")
    result.stdout.fnmatch_lines(["*saved no weight file the suite could interrupt*Likely "
                                 "cause*mizuoto.plugin.atomic_path*"], consecutive=False)
    if plugin_api == "1.1":
        result.assert_outcomes(failed=1)
        return
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["plugin mizuoto_example (engine toy) is written for API 1.0; "
                                 "it misses 1 requirements of 1.1: test_resume_after_sigkill_"
                                 "during_a_checkpoint_save_or_a_named_refusal*"],
                                consecutive=False)


def test_a_trainer_that_ignores_the_learning_rate_is_caught(run_suite, monkeypatch):
    from toy_trainer import ToyTrainer

    class Fixed(ToyTrainer):
        def learning_rate(self, config):
            return 1e-3

    _with_toy_trainer(monkeypatch, Fixed)
    _assert_caught(run_suite("--mizuoto-engine", "toy", "-k", "learning_rate"),
                   "exported the same weights. Likely cause: the trainer ignores "
                   "TrainingConfig.learning_rate")


def test_a_trainer_that_ignores_the_warm_up_is_caught(run_suite, monkeypatch):
    from toy_trainer import ToyTrainer, _Session

    _with_toy_trainer(monkeypatch, ToyTrainer)
    monkeypatch.setattr(_Session, "scheduled_rate", lambda self, update: self.learning_rate)
    _assert_caught(run_suite("--mizuoto-engine", "toy", "-k", "warm_up"),
                   "with params.warmup_updates=3 the logged learning rate is [[]0.001, 0.001, "
                   "0.001, 0.001[]]*Likely cause: the trainer ignores the warm-up",
                   "FAILED *test_the_learning_rate_follows_the_declared_warm_up*")


def test_a_trainer_that_ignores_clipping_is_caught(run_suite, monkeypatch):
    from toy_trainer import ToyTrainer, _Session

    _with_toy_trainer(monkeypatch, ToyTrainer)
    monkeypatch.setattr(_Session, "clipped", lambda self, gradient, norm: gradient)
    _assert_caught(run_suite("--mizuoto-engine", "toy", "-k", "clipping"),
                   "params.max_grad_norm 0 (no clipping) and 1e-6 exported the same weights. "
                   "Likely cause: the trainer ignores max_grad_norm",
                   "FAILED *test_gradient_clipping_changes_the_export_or_is_refused*")


def test_a_trainer_that_ignores_batch_size_and_accumulation_is_caught(run_suite, monkeypatch):
    from toy_trainer import ToyTrainer

    class OneExampleAtATime(ToyTrainer):
        def prepare(self, config, *, progress=None):
            return super().prepare(attrs.evolve(config, batch_size=1, params={}),
                                   progress=progress)

    _with_toy_trainer(monkeypatch, OneExampleAtATime)
    _assert_caught(run_suite("--mizuoto-engine", "toy", "-k", "batch_size"),
                   "batch size 1 and 4 exported the same weights. Likely cause: the trainer "
                   "ignores TrainingConfig.batch_size",
                   "FAILED *test_batch_size_and_accumulation_change_the_export_or_are_refused*")


def test_a_trainer_that_refuses_accumulation_by_name_passes(run_suite, monkeypatch):
    from toy_trainer import ToyTrainer

    class NoAccumulation(ToyTrainer):
        def prepare(self, config, *, progress=None):
            if config.params.get("grad_accumulation", 1) != 1:
                raise InvalidRequest("params.grad_accumulation", "this trainer does not "
                                     "accumulate gradients", "leave it at 1")
            return super().prepare(config, progress=progress)

    _with_toy_trainer(monkeypatch, NoAccumulation)
    run_suite("--mizuoto-engine", "toy", "-k", "batch_size").assert_outcomes(passed=1)


def test_a_resumed_export_that_differs_names_the_first_differing_tensor():
    """What ``_resume_and_compare`` says when a resumed export differs (a resume losing
    state); the SIGKILL run itself needs an installed trainer."""
    from safetensors.torch import save

    from mizuoto_contract.test_trainer_contract_resume import _tensor_difference

    straight = {"level": torch.zeros(4), "pitch": torch.ones(3)}
    resumed = {"level": torch.tensor([0.0, 0.0, 0.25, -0.5]), "pitch": torch.ones(3)}
    said = _tensor_difference(save(resumed), save(straight))
    assert said == ("first differing tensor 'level': shape (4,), 2 of 4 values differ, the "
                    "first at index (2,) (0.25 vs 0.0), max |diff| 0.5")
    assert _tensor_difference(save(straight, metadata={"at": "1"}), save(straight)) == \
        "every tensor is equal, the other bytes differ"
