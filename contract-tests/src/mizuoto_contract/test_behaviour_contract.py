"""Contract points a plugin breaks without raising anything: the stream is incremental, the
reference and every declared setting change the audio, a long text is spoken whole, memory
stays flat, the license is declared and reported, the generator the base class passes is the
one drawn from.

Each test fails with the likely cause and the fix. Work is counted in torch operations (a
dispatch mode in the calling thread), never in seconds: the counts are the same on a loaded
machine.
"""

from __future__ import annotations

import gc
import os

import attrs
import pytest
import torch

# torch imports its compiler lazily, at the first torch.arange and the like; imported inside the
# operation counter it fails (CI, in-process self-test runs): import it here, outside any mode
import torch._dynamo
from torch.utils._python_dispatch import TorchDispatchMode

from mizuoto import Audio, Capability
from mizuoto.errors import InvalidRequest
from mizuoto_contract.models import ContractModel
from mizuoto_contract.reference import other_reference
from mizuoto_contract.test_contract import (
    LONG_TEXT,
    SEED,
    TEXT,
    _check_result,
    _duration,
    _plain_request,
    _reference,
    _request,
)
from mizuoto_contract.versions import require as _require

requires = pytest.mark.mizuoto_requires
# Every check here runs on every plugin; they were added with plugin API 1.1's round-4 suite,
# so a plugin written for 1.0 that fails one gets a PluginAPIDeprecation (versions.py).
pytestmark = pytest.mark.since_api("1.1")


class _OperationCount(TorchDispatchMode):
    """Counts the torch operations run in this thread while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


# An incremental stream of n chunks has done about 1/n of its work when the first chunk
# arrives; one that computes everything first, all of it. Half is generous for any n >= 3.
FIRST_CHUNK_SHARE = 0.5


@requires(Capability.STREAM)
def test_the_first_chunk_arrives_before_the_rest_is_computed(contract_model: ContractModel
                                                             ) -> None:
    """For a long text, the first chunk comes after a fraction of the stream's work (torch
    operations counted, not seconds): a stream is yielded as it is made, not at the end."""
    request = _plain_request(contract_model, text=LONG_TEXT, seed=SEED)
    counter = _OperationCount()
    try:
        with counter:  # opening the stream counts too: it may do the work before the first
            chunks = iter(contract_model.engine.stream(request))
            next(chunks)
            first = counter.count
            rest = sum(1 for _ in chunks)
    except InvalidRequest as exc:
        # an engine without LONG_TEXT may refuse a long text, naming it (never cut it)
        assert exc.field == "text", (
            f"streaming a {len(LONG_TEXT)}-character text was refused naming {exc.field!r}. "
            f"Likely cause: the refusal names another field; refuse a text too long with "
            f"InvalidRequest('text', ...) naming the limit")
        return
    total = counter.count
    if rest < 2 or total == 0:
        # one or two chunks (or no torch work): nothing tells incremental from all-at-once
        pytest.skip(f"the stream of a {len(LONG_TEXT)}-character text has {rest + 1} chunks")
    share = first / total
    _require_at_most(share, FIRST_CHUNK_SHARE, (
        f"the first of {rest + 1} stream chunks came after {share:.0%} of the stream's torch "
        f"operations ({first} of {total}; limit {FIRST_CHUNK_SHARE:.0%})"),
        "_stream computes the whole utterance and then yields it in pieces; yield each chunk "
        "as soon as it is made")


def _require_at_most(measured: float, limit: float, said: str, cause: str) -> None:
    """``measured`` is at most ``limit``; else fail with ``said`` (the measure and the limit)
    and the likely ``cause`` with its fix."""
    _require(measured <= limit, f"{said}. Likely cause: {cause}")


@requires(Capability.CLONE)
def test_the_reference_changes_the_audio(contract_model: ContractModel) -> None:
    """Two different references (and, for a zero-shot model, no reference) give different
    audio with the same seed: a cloning engine uses the recording."""
    engine = contract_model.engine
    cloned = engine.synthesize(_request(contract_model, reference=_reference(contract_model),
                                        seed=SEED))
    _check_result(contract_model, cloned, seed=SEED)
    other = engine.synthesize(_request(
        contract_model, reference=other_reference(contract_model.engine.info.sample_rate), seed=SEED))
    samples = {"another reference": other.audio.samples}
    if Capability.ZERO_SHOT in engine.capabilities:
        samples["no reference"] = engine.synthesize(_request(contract_model,
                                                             seed=SEED)).audio.samples
    same = [what for what, audio in samples.items() if torch.equal(audio, cloned.audio.samples)]
    _require(not same, (
        f"cloning from the suite's reference gave the same audio as {' and '.join(same)}, "
        f"seed {SEED}. Likely cause: synthesis ignores request.reference (and the voice built "
        f"from it); condition the audio on the reference's features"))


def test_every_declared_param_changes_the_audio(contract_model: ContractModel) -> None:
    """Each request param the engine declares (``params_class``) changes the audio at one of
    the values :mod:`mizuoto_contract.param_probes` tries for its type and declared range or
    choices, or is refused there by name, unless the fixture declares it inert
    (``ContractFixture.inert_params``): a declared setting is never silently ignored."""
    from mizuoto_contract.param_probes import probe_values

    engine, fixture = contract_model.engine, contract_model.fixture
    if engine.params_class is None:
        pytest.skip("the engine declares no request params")
    unknown = fixture.inert_params - {f.name for f in attrs.fields(engine.params_class)}
    assert not unknown, (
        f"ContractFixture.inert_params names params the engine lacks: {sorted(unknown)}. "
        f"Likely cause: a param renamed or removed; update the fixture's inert_params")
    plain = engine.synthesize(_plain_request(contract_model, seed=SEED)).audio.samples
    ignored = []
    for field in attrs.fields(engine.params_class):
        if field.name in fixture.inert_params:
            continue
        base = fixture.request_params.get(field.name, field.default)
        changed, tried = False, []
        for value in probe_values(engine, field, dict(fixture.request_params)):
            params = {**fixture.request_params, field.name: value}
            try:
                audio = engine.synthesize(_plain_request(contract_model, seed=SEED,
                                                         params=params)).audio.samples
            except InvalidRequest as exc:
                assert field.name in exc.field, (
                    f"params.{field.name}={value!r} was refused naming {exc.field!r}. Likely "
                    f"cause: the refusal names another field; name params.{field.name}")
                continue
            tried.append(value)
            changed = changed or not torch.equal(audio, plain)
        if tried and not changed:
            ignored.append(f"{field.name} (tried {', '.join(map(repr, tried))}; "
                           f"the fixture's {base!r})")
    _require(not ignored, (
        f"params changed nothing (seed {SEED}): {'; '.join(ignored)}. Likely cause: the "
        f"engine declares them but never reads them (or reads another name); use them, "
        f"remove them from the params class, or, where the fixture's model cannot show them "
        f"(a limit it does not reach), list them in ContractFixture(inert_params=...)"))


# A word per script (the model's declared languages pick theirs; these three are tried on
# every model): said in a sentence, then with its characters rotated. A model that speaks them
# gives other audio; one that drops them (an unknown-token filler, a filter) gives the same.
SCRIPT_WORDS = {"Latin": "Grüße, garçon", "Cyrillic": "привет", "Greek": "καλημέρα",
                "Arabic": "مرحبا", "Hebrew": "שלום", "Devanagari": "नमस्ते", "Han": "你好世界",
                "Kana": "こんにちは", "Hangul": "안녕하세요", "Thai": "สวัสดี"}
LANGUAGE_SCRIPTS = {"ru": "Cyrillic", "uk": "Cyrillic", "bg": "Cyrillic", "el": "Greek",
                    "ar": "Arabic", "fa": "Arabic", "ur": "Arabic", "he": "Hebrew",
                    "hi": "Devanagari", "mr": "Devanagari", "ne": "Devanagari", "zh": "Han",
                    "yue": "Han", "ja": "Kana", "ko": "Hangul", "th": "Thai"}
ALWAYS_TRIED = ("Cyrillic", "Han", "Arabic")


def _scripts(languages) -> list[str]:
    """The scripts of the declared languages (BCP 47 tags; Latin for any other), then
    :data:`ALWAYS_TRIED`."""
    declared = [LANGUAGE_SCRIPTS.get(tag.lower().split("-")[0], "Latin") for tag in languages]
    return list(dict.fromkeys([*declared, *ALWAYS_TRIED]))


def test_characters_the_model_drops_are_reported(contract_model: ContractModel) -> None:
    """For the scripts of the model's declared languages (``ModelInfo.languages``) and three
    others, a sentence with a word of that script is spoken (its audio changes when the word's
    characters are rotated), refused naming ``text``, or what was dropped is reported in
    ``applied.warnings``: text is never silently shortened."""
    engine = contract_model.engine
    plain = engine.synthesize(_plain_request(contract_model, seed=SEED)).applied.warnings
    silent = []
    for script in _scripts(engine.info.languages):
        word = SCRIPT_WORDS[script]
        said = []
        for text in (f"Say {word} now.", f"Say {word[1:] + word[0]} now."):
            try:
                said.append(engine.synthesize(_plain_request(contract_model, text=text,
                                                             seed=SEED)))
            except InvalidRequest as exc:
                assert exc.field == "text", (
                    f"refusing {text!r} named {exc.field!r}. Likely cause: the refusal names "
                    f"another field; name text")
                break
        if len(said) < 2 or not torch.equal(said[0].audio.samples, said[1].audio.samples):
            continue
        if not set(said[0].applied.warnings) - set(plain):
            silent.append(f"{script} ({word!r})")
    _require(not silent, (
        f"characters dropped silently: {', '.join(silent)} in 'Say ... now.' gave the same "
        f"audio with the word's characters rotated (seed {SEED}), and applied.warnings said "
        f"nothing. Likely cause: the tokenizer maps characters it lacks to a filler (id 0, "
        f"<unk>) or filters them; report them in Rendered(warnings=[...]) with "
        f"mizuoto.text.coverage.dropped_characters_warning, or refuse the text with "
        f"InvalidRequest('text', ...)"))


# About 2000 characters: far beyond a sentence, where a hidden cut (text[:n]) shows.
THOUSANDS_TEXT = " ".join([LONG_TEXT] * 2)
# The audio grows at least this share as fast as the text (a cut text gives far less).
WHOLE_SHARE = 0.25


@requires(when=lambda fixture: fixture.length_follows_text)
def test_thousands_of_characters_are_spoken_whole_or_refused_by_name(
        contract_model: ContractModel) -> None:
    """A text of about 2000 characters is spoken whole (its audio grows with the text), or
    refused naming ``text``, streamed and not: never cut at some hidden length."""
    engine = contract_model.engine
    short = _duration(engine.synthesize(_plain_request(contract_model, seed=SEED)))
    request = _plain_request(contract_model, text=THOUSANDS_TEXT, seed=SEED)
    expected = WHOLE_SHARE * len(THOUSANDS_TEXT) / len(TEXT)
    ways = {"synthesized": lambda: engine.synthesize(request).audio}
    if Capability.STREAM in engine.capabilities:
        ways["streamed"] = lambda: Audio(torch.cat([c.audio.samples
                                                    for c in engine.stream(request)]),
                                         engine.info.sample_rate)
    for way, speak in ways.items():
        try:
            audio = speak()
        except InvalidRequest as exc:
            assert exc.field == "text", f"a refused long text must name the field text: {exc}"
            continue
        ratio = audio.duration / max(short, 1e-9)
        _require(ratio >= expected, (
            f"a {len(THOUSANDS_TEXT)}-character text {way} gave {ratio:.1f} times the audio of "
            f"a {len(TEXT)}-character one (expected at least {expected:.0f}). Likely cause: the "
            f"text is cut beyond some length or a length cap ends the audio; speak it whole "
            f"(in chunks) or refuse it with InvalidRequest('text', ...) naming the limit"))


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


REPEATS = 12
# What twelve requests may add to the resident memory once warm: allocator slack, not a
# leak (a leak of a second of float32 audio per request at 48 kHz is 2.3 MB; a cache that
# keeps each request's tensors is more).
MEMORY_GROWTH_LIMIT = 24 * 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_memory_stays_flat_over_repeated_requests(contract_model: ContractModel) -> None:
    """The same request twelve times, after two to warm up: the process's resident memory
    grows by at most 24 MiB. An engine that keeps something per request leaks."""
    request = _plain_request(contract_model, seed=SEED)
    for _ in range(2):
        contract_model.engine.synthesize(request)
    gc.collect()
    before = _resident_bytes()
    for _ in range(REPEATS):
        contract_model.engine.synthesize(request)
    gc.collect()
    grown = _resident_bytes() - before
    _require_at_most(grown, MEMORY_GROWTH_LIMIT, (
        f"{REPEATS} identical requests grew the resident memory by {grown / 2**20:.1f} MiB "
        f"(limit {MEMORY_GROWTH_LIMIT / 2**20:.0f} MiB)"),
        "each request leaves something behind (a list or cache of tensors on the engine, a "
        "history kept for debugging); keep per-request state in the call, bound any cache")


def test_the_license_is_declared_and_reported(contract_model: ContractModel) -> None:
    """The fixture declares its model's license; the engine reports it in ModelInfo and every
    result, and a non-commercial model's results say so (``applied.non_commercial``, written
    into saved files). A fixture that declares none is checked against what the engine
    reports (assumed to be the model's license), and then fails for the missing declaration."""
    fixture, info = contract_model.fixture, contract_model.engine.info
    declared = fixture.license is not None
    # without a declaration, what the engine reports is all that can be known: assume it
    license, non_commercial = ((fixture.license, fixture.non_commercial) if declared
                               else (info.license, info.non_commercial))
    assert (info.license, info.non_commercial) == (license, non_commercial), (
        f"the model reports license {info.license!r}, non_commercial={info.non_commercial}, "
        f"but its fixture declares {license!r}, non_commercial={non_commercial}. Likely "
        f"cause: placement.model_info(...) is not given the model's license; pass "
        f"license=... and non_commercial=... to it")
    applied = contract_model.engine.synthesize(_plain_request(contract_model,
                                                              seed=SEED)).applied
    from mizuoto.contracts.results import file_metadata

    assert applied.non_commercial == non_commercial, (
        "a non-commercial model's result does not say so (applied.non_commercial is False). "
        "Likely cause: Applied is built without ModelInfo.non_commercial; copy it into "
        "Applied (the base class does)")
    if non_commercial:
        assert "non-commercial" in file_metadata(applied)["comment"]
    _require(declared, (
        f"contract fixture {fixture.id} declares no license (checked assuming the engine's "
        f"report, {info.license!r}, non_commercial={info.non_commercial}, is right). Fix: set "
        f"ContractFixture(license=..., non_commercial=...) to the model's license, so the "
        f"suite can check what the engine reports"))


def test_the_generator_passed_is_the_one_drawn_from(contract_model: ContractModel) -> None:
    """Where the seed changes the audio, the engine draws from the generator the base class
    made for ``applied.seed``, or seeds one of its own with exactly that seed (an upstream's
    RNG may need its own generator, as VoxCPM's does): what it reports is what it used."""
    engine = contract_model.engine
    first = engine.synthesize(_plain_request(contract_model, seed=SEED)).audio.samples
    second = engine.synthesize(_plain_request(contract_model, seed=SEED + 1)).audio.samples
    if torch.equal(first, second):
        pytest.skip("the seed does not change this model's audio")
    made, seeded = [], []
    make, torch_generator = engine.make_generator, torch.Generator

    class Recording(torch_generator):  # every torch generator the request seeds, by seed
        def manual_seed(self, seed):
            seeded.append(int(seed))
            return super().manual_seed(seed)

    def recording(seed):
        made.append((seed, make(seed)))
        return made[-1][1]

    try:
        engine.make_generator, torch.Generator = recording, Recording
        result = engine.synthesize(_plain_request(contract_model, seed=SEED))
    finally:
        torch.Generator = torch_generator
        del engine.make_generator
    if not made or not isinstance(made[0][1], torch_generator):
        return  # the engine draws elsewhere (numpy, an external program): not checkable here
    seed, generator = made[0]
    drawn = not torch.equal(generator.get_state(), make(seed).get_state())
    own = seeded[1:]  # the first is the base class's own generator
    _require(seed == result.applied.seed and (drawn or seed in own), (
        f"the generator the base class made for seed {seed} was never drawn from, yet the seed "
        f"changes the audio"
        + (f", and the engine seeded its own generators with {sorted(set(own))}" if own else "")
        + ". Likely cause: the engine draws from a generator of its own (or torch's global "
        "one), seeded otherwise than applied.seed says; draw only from the generator passed "
        "to _synthesize/_stream (or seed yours with its initial_seed())"))
