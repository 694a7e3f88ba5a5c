"""The speech service: the one path from what a client sent to a request in flight.

Every front end (the HTTP server, the Wyoming server, the Ray ingress, ``say``) goes the same
three steps, transport-free, and none checks again what an earlier step checked:

1. :func:`speech_order`: what the client sent, as a :class:`~mizuoto.SynthesisRequest` built
   by the validators every front end shares (OpenAI's ``speed`` folded into the params),
   before any model is loaded or waited for;
2. :func:`plan_speech`: the order fitted to the model and planned by its engine
   (:meth:`~mizuoto.contracts.engine.Engine.plan`): capabilities, the saved voice's weights,
   the params parsed once by the engine's declared settings, the seed drawn once (and
   reported as drawn), before the request waits for its turn;
3. :func:`speak`: the plan run, its audio chunk by chunk (or whole, as one chunk).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.plan import RequestPlan
from mizuoto.contracts.progress import ProgressCallback
from mizuoto.contracts.requests import SynthesisRequest
from mizuoto.contracts.results import AudioChunk
from mizuoto.errors import InvalidRequest, UnsupportedSetting
from mizuoto.validation.ranges import check_number

#: OpenAI's range of ``speed``.
SPEED_RANGE = (0.25, 4.0)


@attrs.frozen
class SpeechOrder:
    """What a client asked for, checked without the model: ``request`` (``text`` as sent,
    before validation cleaned it), OpenAI's ``speed`` (in the request's params unless 1.0),
    and ``optional_instruction``: an instruction a model that cannot design voices ignores
    with a warning instead of refusing (OpenAI's clients send ``instructions`` routinely)."""

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
    none. The seed is left unset when the client sent none: the engine's plan draws it."""
    check_number("speed", speed, *SPEED_RANGE)
    if speed != 1.0 and isinstance(params or {}, Mapping):  # else refused as params below
        given = params or {}
        if "speed" in given:
            raise InvalidRequest("speed", "is given twice",
                                 "send either speed or params.speed")
        params = {**given, "speed": float(speed)}
    if instruction is not None and not instruction.strip():
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
    if engine.plugin_api == "1.0":  # it overrides the public calls: a request, as it knew
        work = attrs.evolve(planned.plan.request, seed=planned.seed)
    if not stream:
        result = engine.synthesize(work, progress=progress)
        yield AudioChunk(result.audio, 0, is_last=True, applied=result.applied)
        return
    chunks = engine.stream(work, progress=progress)
    try:
        yield from chunks
    finally:
        chunks.close()  # releases the engine at once when the client left


__all__ = ["SPEED_RANGE", "SpeechOrder", "SpeechPlan", "declared_settings", "plan_speech",
           "speak", "speech_order"]
