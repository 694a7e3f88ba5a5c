"""The speech service: the one path from what a client sent to a request in flight.

Every front end (the HTTP server, the Wyoming server, the Ray ingress, ``say``, ``batch`` and
long-form) goes the same three steps, transport-free, and none checks again what an earlier
step checked:

1. :func:`speech_order`: what the client sent, as a :class:`~mizuoto.SynthesisRequest` built
   by the validators every front end shares (OpenAI's ``speed`` folded into the params),
   before any model is loaded or waited for;
2. :func:`plan_speech`: the order fitted to the model and planned by its engine
   (:meth:`~mizuoto.contracts.engine.Engine.plan`): capabilities, the saved voice's weights,
   the params parsed once by the engine's declared settings, the seed drawn once (and
   reported as drawn), before the request waits for its turn;
3. :func:`speak`: the plan run, its audio chunk by chunk (or whole, as one chunk).

A text spoken as several requests (long-form's sections) is planned once too: a
:class:`DocumentPlan` derives each section's plan from the document's, and its seed from the
document's one seed (:func:`section_seed`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.plan import RequestPlan
from mizuoto.contracts.progress import ProgressCallback
from mizuoto.contracts.requests import SynthesisRequest
from mizuoto.contracts.results import Applied, AudioChunk
from mizuoto.errors import InvalidRequest, UnsupportedSetting
from mizuoto.runtime.seeds import MAX_SEED, keyed_seed
from mizuoto.validation.ranges import check_number

#: OpenAI's range of ``speed``.
SPEED_RANGE = (0.25, 4.0)


@attrs.frozen
class SpeechOrder:
    """What a client asked for, checked without the model: ``request`` (``text`` as sent,
    before validation cleaned it), OpenAI's ``speed`` (in the request's params unless 1.0),
    and ``optional_instruction``: an instruction a model that cannot design voices ignores
    with a warning instead of refusing, and a blank one is none (OpenAI's clients send
    ``instructions`` routinely)."""

    request: SynthesisRequest
    text: str
    speed: float = 1.0
    optional_instruction: bool = False


def speech_order(text: str, *, voice=None, reference=None, instruction: str | None = None,
                 seed: Any = None, steps: Any = None, guidance: Any = None,
                 params: Any = None, speed: Any = 1.0,
                 optional_instruction: bool = False) -> SpeechOrder:
    """The order for what a client sent; a bad field raises :class:`InvalidRequest` naming it
    (``params``, ``seed``, ... as the request's fields; ``speed``). A blank instruction is
    none where it is ``optional_instruction``, else refused as empty (``say --instruction``,
    a batch line). The seed is left unset when the client sent none: the engine's plan draws
    it."""
    check_number("speed", speed, *SPEED_RANGE)
    if speed != 1.0 and isinstance(params or {}, Mapping):  # else refused as params below
        given = params or {}
        if "speed" in given:
            raise InvalidRequest("speed", "is given twice",
                                 "send either speed or params.speed")
        params = {**given, "speed": float(speed)}
    if optional_instruction and isinstance(instruction, str) and not instruction.strip():
        instruction = None
    request = SynthesisRequest(text, reference=reference, voice=voice, instruction=instruction,
                               seed=seed, steps=steps, guidance=guidance, params=params)
    return SpeechOrder(request, text, float(speed), optional_instruction)


@attrs.frozen
class SpeechPlan:
    """An order as it will run on one model: the engine's ``plan`` and the ``warnings`` for
    what the model ignored."""

    plan: RequestPlan
    warnings: tuple[str, ...] = ()

    @property
    def seed(self) -> int:
        return self.plan.seed


def declared_settings(engine) -> frozenset[str]:
    """The settings ``engine`` declares: its params' fields and its sampler settings."""
    params_class = type(engine).params_class
    fields = {field.name for field in attrs.fields(params_class)} \
        if params_class is not None else set()
    return frozenset(fields) | type(engine).request_settings


def plan_speech(engine, order: SpeechOrder) -> SpeechPlan:
    """``order`` fitted to ``engine`` and planned by it (the engine's checks, its params
    parsed, the seed drawn when unset): a request it refuses raises here, before it waits
    for its turn. ``speed`` on an engine without the setting is refused
    (:class:`UnsupportedSetting`): Mizuoto does not time-stretch, which would change the
    engine's audio."""
    request, warnings = order.request, []
    if order.speed != 1.0 and "speed" not in declared_settings(engine):
        raise UnsupportedSetting("speed", f"the {engine.name} engine has no speed setting, "
                                 "and Mizuoto does not time-stretch (it would change the "
                                 "engine's audio)", "send speed 1.0")
    if request.instruction is not None and order.optional_instruction \
            and not engine.supports(Capability.DESIGN):
        warnings.append(f"instructions ignored: the {engine.name} model cannot design voices")
        # from the text as sent: evolving re-cleans it, and the notices must say what changed
        request = attrs.evolve(request, text=order.text, instruction=None)
    return SpeechPlan(engine.plan(request), tuple(warnings))


def speak(engine, planned: SpeechPlan, *, stream: bool,
          progress: ProgressCallback | None = None) -> Iterator[AudioChunk]:
    """Run ``planned`` on ``engine``: its chunks as they are made (``stream``), or the whole
    audio as one last chunk. Closing the iterator stops the engine at its next step."""
    work: Any = planned.plan
    old_api = engine.plugin_api == "1.0"
    if old_api:  # it overrides the public calls: a request, as it knew
        work = attrs.evolve(planned.plan.request, seed=planned.seed)
    if not stream:
        result = engine.synthesize(work, progress=progress)
        applied = _drawn_reported(result.applied, planned.plan) if old_api else result.applied
        yield AudioChunk(result.audio, 0, is_last=True, applied=applied)
        return
    chunks = engine.stream(work, progress=progress)
    try:
        for chunk in chunks:
            if old_api and chunk.applied is not None:
                chunk = attrs.evolve(chunk, applied=_drawn_reported(chunk.applied, planned.plan))
            yield chunk
    finally:
        chunks.close()  # releases the engine at once when the client left


def _drawn_reported(applied: Applied, plan: RequestPlan) -> Applied:
    """``applied`` of an API 1.0 engine, which got the seed the plan drew as if its client
    had sent it: reported as drawn, as the newer engines report it."""
    if plan.seed_drawn and applied.seed == plan.seed and not applied.seed_drawn:
        return attrs.evolve(applied, seed_drawn=True)
    return applied


def section_seed(seed: int, index: int) -> int:
    """The seed of section ``index`` of a document seeded with ``seed``: ``seed`` itself for
    the first, then a 32-bit seed derived from ``(seed, index)`` (stable across runs,
    machines and versions)."""
    if index == 0:
        return seed
    return keyed_seed(seed, f"long-form section {index}") % (MAX_SEED + 1)


@attrs.frozen
class DocumentPlan:
    """A text spoken as several requests (long-form's sections), planned once: ``plan`` is
    the document's (the engine's checks, its params parsed, the document's seed drawn when
    unset), and ``warnings`` what the model ignored. A section is not planned again: its plan
    is the document's with the section's text and :func:`section_seed`, so that every
    section is a pure function of its text, the settings and its index."""

    plan: RequestPlan
    warnings: tuple[str, ...] = ()

    @property
    def seed(self) -> int:
        return self.plan.seed

    def with_seed(self, seed: int, seed_drawn: bool) -> DocumentPlan:
        """This plan with the seed an interrupted run of it drew (resuming it)."""
        return attrs.evolve(self, plan=attrs.evolve(self.plan, seed=seed,
                                                    seed_drawn=seed_drawn))

    def section(self, index: int, text: str) -> SpeechPlan:
        """The plan of section ``index``, ``text``: its text checked as any request's (what
        cleaning changed in it are its notices), its seed derived, not drawn."""
        seed = section_seed(self.seed, index)
        request = attrs.evolve(self.plan.request, text=text, seed=seed)
        return SpeechPlan(attrs.evolve(self.plan, request=request, seed=seed,
                                       seed_drawn=False, notices=request.notices),
                          self.warnings)


def plan_document(engine, order: SpeechOrder) -> DocumentPlan:
    """``order``, whose text is a document's (or its start), planned by :func:`plan_speech`
    once for all its sections."""
    planned = plan_speech(engine, order)
    return DocumentPlan(planned.plan, planned.warnings)


__all__ = ["SPEED_RANGE", "DocumentPlan", "SpeechOrder", "SpeechPlan", "declared_settings",
           "plan_document", "plan_speech", "section_seed", "speak", "speech_order"]
