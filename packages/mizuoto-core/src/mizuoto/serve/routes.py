"""The HTTP API: OpenAI's ``/v1/audio/speech`` and ``/v1/models``, voices, health, metrics.

Handlers validate, turn the body into the speech service's order and plan
(:mod:`mizuoto.service`: built once, planned by the engine before the request is queued),
hand the plan to the model's worker and encode what comes back; no model code runs here. Encoding and file work run on worker threads
(``asyncio.to_thread``), never on the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any, Literal

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator
from pydantic_core import PydanticCustomError

from mizuoto.audio_encoding import MEDIA_TYPES, PCM_RATE, StreamEncoder
from mizuoto.audio_formats import FORMATS
from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.requests import MAX_SEED
from mizuoto.contracts.results import AudioChunk
from mizuoto.serve.adapters import holds_adapters
from mizuoto.serve.budget import client_of
from mizuoto.serve.errors import (
    APIError,
    ClientGone,
    bad_request,
    from_mizuoto,
    not_found,
    quoted,
    unavailable,
)
from mizuoto.serve.jobs import DONE, Job
from mizuoto.serve.json_body import parse_json
from mizuoto.serve.pool import pin_for_request
from mizuoto.serve.uploads import ClipLimits, read_clip
from mizuoto.serve.voices import DEFAULT_VOICE, check_name
from mizuoto.service import plan_speech, speak, speech_order

#: Longest ``input`` and ``instructions`` (characters), as OpenAI's spec.
MAX_INPUT_CHARS = 4096
#: Response formats of OpenAI's spec this server does not encode.
#: Formats of the OpenAI spec this server cannot encode, with why (none at present).
UNSUPPORTED_FORMATS: dict[str, str] = {}
#: Header carrying the seed a response was generated with.
SEED_HEADER = "X-Mizuoto-Seed"
#: Header carrying what the server ignored or changed, ``; ``-separated.
WARNING_HEADER = "X-Mizuoto-Warning"

router = APIRouter()


class VoiceId(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str


class MizuotoExtension(BaseModel):
    """The extension key ``mizuoto``: what OpenAI's request cannot say.

    The numbers are taken as sent and checked by :class:`~mizuoto.SynthesisRequest`, the
    validation the CLI and the Python API use: pydantic would turn ``true``, ``"2"`` or
    ``2.0`` into the integer a request refuses."""

    model_config = ConfigDict(extra="forbid")
    seed: Any = None
    steps: Any = None
    guidance: Any = None
    params: Any = None  # a mapping, checked by SynthesisRequest too (None: no settings)
    #: ``False``: the whole response at once, made by ``engine.synthesize`` (engines that
    #: cannot stream always answer so).
    stream: StrictBool = True


class SpeechBody(BaseModel):
    """``POST /v1/audio/speech``, as OpenAI's spec (unknown fields rejected), plus ``mizuoto``."""

    model_config = ConfigDict(extra="forbid")
    model: str
    input: str = Field(max_length=MAX_INPUT_CHARS)
    voice: str | VoiceId
    instructions: str | None = Field(default=None, max_length=MAX_INPUT_CHARS)
    response_format: str = "mp3"  # every format Mizuoto writes (checked below)
    speed: Any = 1.0  # checked by check_number, as every other number (see MizuotoExtension)
    stream_format: Literal["sse", "audio"] = "audio"
    mizuoto: MizuotoExtension | None = None

    @field_validator("response_format")
    @classmethod
    def _a_format_of_the_table(cls, value: str) -> str:
        # read from the table at each request, not frozen into a Literal at import
        if value not in FORMATS:
            names = [repr(name) for name in FORMATS]
            raise PydanticCustomError("literal_error", "Input should be {expected}",
                                      {"expected": f"{', '.join(names[:-1])} or {names[-1]}"})
        return value


def _state(request: Request):
    return request.app.state.mizuoto


def _route(state, model: str):
    """``(worker, adapter)`` of the served name ``model``: a model's worker and None, or an
    adapter's base model's worker and the adapter's name (``--lora-dir``)."""
    route = state.routes.get(model)
    if route is None:
        known = ", ".join(sorted(state.routes))
        raise not_found(f"model {quoted(model)} is not served here (served: {known})", "model",
                        "model_not_found")
    return route


def _speech_order(body: SpeechBody, voice):
    """The service's order for ``body`` (:func:`mizuoto.service.speech_order`), built once,
    before any model is loaded or queued for; ``voice`` is the saved voice named, read from
    the store."""
    extension = body.mizuoto or MizuotoExtension()
    try:
        return speech_order(body.input, voice=voice, instruction=body.instructions,
                            seed=extension.seed, steps=extension.steps,
                            guidance=extension.guidance, params=extension.params,
                            speed=body.speed, optional_instruction=True)
    except Exception as exc:
        raise from_mizuoto(exc, param_prefix="mizuoto.") from exc


def _planned(engine, order):
    """The order planned on the model (:func:`mizuoto.service.plan_speech`): refused with a
    400 before it queues; the seed known (drawn once, there) before the first byte."""
    try:
        return plan_speech(engine, order)
    except Exception as exc:
        raise from_mizuoto(exc, param_prefix="mizuoto.") from exc


def _speech_job(planned, stream: bool, order=None):
    """The job speaking ``planned``; None: planned by the job, with its adapter applied (a
    plan names the weights it was made for, and a voice is checked against them), and emitted
    before the chunks."""
    def run(engine, job: Job) -> None:
        plan = planned
        if plan is None:
            plan = _planned(engine, order)
            job.emit(plan)
        chunks = speak(engine, plan, stream=stream, progress=job.check)
        try:
            for chunk in chunks:
                job.check()
                job.audio_seconds += chunk.audio.duration
                job.emit(chunk)
        finally:
            chunks.close()  # releases the engine at once when the client left

    return run


async def _next(job: Job, request: Request | None):
    """The job's next item (an error it emitted is raised). With ``request``, the job is
    cancelled when the client disconnects meanwhile; a streaming response passes none, since
    Starlette watches its client and cancels the response (see :func:`_chunks`)."""
    if request is None:
        item = await job.get()
    else:
        getter = asyncio.ensure_future(job.get())
        while not (await asyncio.wait({getter}, timeout=0.25))[0]:
            if await request.is_disconnected():
                getter.cancel()
                job.cancel()
                raise ClientGone
        item = getter.result()
    if isinstance(item, BaseException):
        raise from_mizuoto(item, param_prefix="mizuoto.")
    return item


async def _loaded_engine(worker, request: Request):
    """The worker's engine, loaded first (by a job in its queue) if the pool unloaded it. The
    caller holds a pin: once loaded, it stays so until the pin is released."""
    if worker.engine is None:
        job = Job(lambda engine, job: None, asyncio.get_running_loop())
        worker.submit(job)
        while await _next(job, request) is not DONE:
            pass
    if worker.engine is None:  # the server stopped meanwhile
        raise unavailable(f"model {worker.name!r} is not loaded", "model_unavailable")
    return worker.engine


class _Hold:
    """A request's pin on its model and its share of its client's budget, released together
    when its job ends (or is never run)."""

    def __init__(self, pin, give_back) -> None:
        self._pin = pin
        self._give_back = give_back

    def release(self) -> None:
        self._pin.release()
        self._give_back()


@router.post("/v1/audio/speech")
async def speech(request: Request):
    state = _state(request)
    started = time.monotonic()
    body = SpeechBody.model_validate(await _json(request))
    if body.response_format in UNSUPPORTED_FORMATS:
        supported = ", ".join(MEDIA_TYPES)
        raise bad_request(f"response_format {body.response_format!r} is not supported: "
                          f"{UNSUPPORTED_FORMATS[body.response_format]}; use one of "
                          f"{supported}", param="response_format", code="unsupported_value")
    worker, adapter = _route(state, body.model)
    request.scope["mizuoto.model"] = worker.name  # served names only: bounded label values
    voice_name = body.voice if isinstance(body.voice, str) else body.voice.id
    voice = None
    if voice_name != DEFAULT_VOICE:
        check_name(voice_name, "voice")
        voice = await asyncio.to_thread(state.voices.load, voice_name)
    order = _speech_order(body, voice)
    # the cost in characters, held for the client until its job ends (a 429 past its budget)
    client = client_of(request.scope["headers"],
                       request.client.host if request.client else None)
    give_back = state.budget.take(client, len(body.input) + len(body.instructions or ""))
    try:
        pin = _Hold(await pin_for_request(worker, request.is_disconnected), give_back)
    except BaseException:
        give_back()
        raise
    try:
        engine = await _loaded_engine(worker, request)
        # on a model holding adapters (--lora-dir), requests are planned on its worker, with
        # theirs applied (the one applied now may be another request's)
        planned = None if holds_adapters(engine) else _planned(engine, order)
        # an engine that cannot stream has the whole audio before the first byte: a whole
        # file (with its length in the header) then comes as early as a stream would
        stream = (body.mizuoto or MizuotoExtension()).stream \
            and engine.supports(Capability.STREAM)
        job = Job(_speech_job(planned, stream, order), asyncio.get_running_loop(), pin=pin,
                  adapter=adapter)
        worker.submit(job)
        request.scope["mizuoto.cancel"] = job.cancel  # the gate's write timeout ends it
    except BaseException:
        pin.release()  # the job's once submitted (it releases the pin when it ends)
        raise
    try:
        if planned is None:
            planned = await _next(job, request)
        first = await _next(job, request)
    except BaseException:
        job.cancel()
        raise
    state.metrics.first_audio(worker.name, time.monotonic() - started)
    headers = {SEED_HEADER: str(planned.seed)}
    # what validation changed (control characters dropped), named as the client sent it:
    # known before any audio, so streamed answers carry it too
    notices = planned.plan.notices
    warnings = [*planned.warnings,
                *(notice.replace("text:", "input:", 1) for notice in notices)]
    if first is not DONE and first.applied is not None:
        # the whole audio in one piece: what the engine warned of (characters it dropped)
        # arrives before the headers, so they carry it too
        warnings = [*warnings, *(w for w in first.applied.warnings
                                 if w not in warnings and w not in notices)]
    if warnings:
        # a header is Latin-1: a warning naming the characters dropped is escaped
        headers[WARNING_HEADER] = "; ".join(warnings).encode("ascii", "backslashreplace"
                                                             ).decode("ascii")
    encoder = StreamEncoder(body.response_format, engine.info.sample_rate,
                            streaming=stream or body.stream_format == "sse")
    if body.stream_format == "sse":
        return StreamingResponse(_sse(job, first, encoder, body),
                                 media_type="text/event-stream", headers=headers)
    if stream:
        return StreamingResponse(_audio(job, first, encoder),
                                 media_type=MEDIA_TYPES[body.response_format], headers=headers)
    chunks = []
    item = first
    while item is not DONE:
        chunks.append(item)
        item = await _next(job, request)
    content = await asyncio.to_thread(_encode_all, encoder, chunks)
    return Response(content, media_type=MEDIA_TYPES[body.response_format], headers=headers)


async def _json(request: Request):
    return parse_json(await request.body())


def _encode_all(encoder: StreamEncoder, chunks: list[AudioChunk]) -> bytes:
    return b"".join(encoder.feed(c.audio.numpy()) for c in chunks) + encoder.close()


async def _chunks(job: Job, first):
    """The job's audio chunks, ``first`` included; the job is cancelled if the response is
    abandoned (Starlette cancels a streaming response whose client disconnects)."""
    try:
        item = first
        while item is not DONE:
            yield item
            item = await _next(job, None)
    finally:
        job.cancel()


async def _audio(job: Job, first, encoder: StreamEncoder):
    async for chunk in _chunks(job, first):
        data = await asyncio.to_thread(encoder.feed, chunk.audio.numpy())
        if data:
            yield data
    tail = await asyncio.to_thread(encoder.close)
    if tail:
        yield tail


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _sse(job: Job, first, encoder: StreamEncoder, body: SpeechBody):
    deltas = 0
    try:
        async for chunk in _chunks(job, first):
            data = await asyncio.to_thread(encoder.feed, chunk.audio.numpy())
            if data:
                deltas += 1
                yield _event({"type": "speech.audio.delta",
                              "audio": base64.b64encode(data).decode()})
    except APIError as exc:  # headers are sent: the error travels as an event
        yield _event({"type": "error", "error": exc.body()["error"]})
        return
    tail = await asyncio.to_thread(encoder.close)
    if tail:
        deltas += 1
        yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(tail).decode()})
    usage = {"input_tokens": len(body.input), "output_tokens": deltas,
             "total_tokens": len(body.input) + deltas}
    yield _event({"type": "speech.audio.done", "usage": usage})


@router.get("/v1/models")
async def models(request: Request):
    """OpenAI's model list; each entry's ``mizuoto`` key is its card (``model_card``), null
    for a model not loaded yet (``state`` says which)."""
    state = _state(request)
    # an adapter (--lora-dir) after its base model, which it names as its parent (vLLM's key)
    data = [{"id": name, "object": "model", "created": 0,
             "owned_by": f"mizuoto-{worker.engine_name or 'unknown'}", "state": worker.state,
             "parent": worker.name if adapter is not None else None,
             "mizuoto": _card(state, worker.name, worker)}
            for name, (worker, adapter) in sorted(
                state.routes.items(), key=lambda item: _listing_order(state, item))]
    # the values every model shares, for a client that has no card yet (a model not loaded)
    shared = {"pcm_sample_rate": PCM_RATE, "max_input_chars": MAX_INPUT_CHARS,
              "formats": _formats(), "seed_range": [0, MAX_SEED]}
    return {"object": "list", "data": data, "mizuoto": shared}


def _listing_order(state, item) -> tuple[int, int]:
    name, (worker, adapter) = item
    return list(state.workers).index(worker.name), adapter is not None


def _formats() -> list[str]:
    return [f for f in MEDIA_TYPES if f not in UNSUPPORTED_FORMATS]


def _card(state, name: str, worker) -> dict | None:
    """The model's card, kept once made: an unloaded model keeps what it was."""
    from mizuoto.serve.model_card import model_card

    engine = worker.engine
    if engine is not None and name not in state.cards:
        state.cards[name] = model_card(engine, max_input_chars=MAX_INPUT_CHARS,
                                       stream_rate=PCM_RATE, formats=_formats())
    return state.cards.get(name)


@router.get("/v1/audio/voices")
async def list_voices(request: Request, model: str | None = None):
    """Every voice (``model=``: those that model can use), ``default`` first."""
    state = _state(request)
    fingerprint = None
    if model is not None:
        worker, adapter = _route(state, model)
        pin = await pin_for_request(worker, request.is_disconnected)
        try:
            engine = await _loaded_engine(worker, request)
            fingerprint = engine.info.fingerprint
            if holds_adapters(engine):  # with the model's adapter (or none) applied
                job = Job(lambda engine, job: job.emit(engine.info.fingerprint),
                          asyncio.get_running_loop(), adapter=adapter)
                worker.submit(job)
                fingerprint = await _next(job, request)
        finally:
            pin.release()
    saved = await asyncio.to_thread(state.voices.list)
    voices = [{"id": DEFAULT_VOICE, "name": DEFAULT_VOICE}]
    voices += [{"id": v["name"], "name": v["name"], "engine": v["engine"]} for v in saved
               if fingerprint is None or v["fingerprint"] == fingerprint]
    return {"voices": voices}


@router.post("/v1/audio/voices", status_code=201)
async def create_voice(request: Request, name: str = Form(...), model: str = Form(...),
                       audio: UploadFile = File(...), text: str | None = Form(None)):
    """A named voice from a reference clip (and its transcript), built by the engine."""
    from mizuoto.contracts.requests import Reference

    state = _state(request)
    check_name(name)
    worker, adapter = _route(state, model)
    request.scope["mizuoto.model"] = worker.name
    worker.submit_check()
    # the caps, before the clip is decoded or the engine builds anything (and again at save)
    await asyncio.to_thread(state.voices.check_room)
    data = await audio.read(state.config.max_upload_bytes + 1)
    if len(data) > state.config.max_upload_bytes:
        raise APIError(413, f"the audio is larger than {state.config.max_upload_bytes} bytes",
                       param="audio", code="file_too_large")
    limits = ClipLimits.for_seconds(state.config.max_upload_seconds)
    clip = await asyncio.to_thread(read_clip, data, limits)
    del data
    try:
        reference = Reference(clip, text if text and text.strip() else None)
    except Exception as exc:
        raise from_mizuoto(exc) from exc

    def build(engine, job: Job) -> None:
        job.emit(engine.build_voice(reference))

    pin = await pin_for_request(worker, request.is_disconnected)
    job = Job(build, asyncio.get_running_loop(), pin=pin, adapter=adapter)
    worker.submit(job)
    voice = await _next(job, request)
    await asyncio.to_thread(state.voices.save, name, voice)
    return {"id": name, "name": name, "model": model, "engine": voice.engine}


@router.delete("/v1/audio/voices/{name}")
async def delete_voice(request: Request, name: str):
    await asyncio.to_thread(_state(request).voices.delete, name)
    return {"id": name, "object": "voice", "deleted": True}


@router.get("/health")
async def health(request: Request):
    state = _state(request)
    models = {name: worker.state for name, worker in state.workers.items()}
    # a model the pool reloads on demand is "loading" but takes requests: still healthy
    ready = not state.closing and all(w.loaded.is_set() and w.state != "failed"
                                      for w in state.workers.values())
    status = "shutting_down" if state.closing else ("ok" if ready else "unavailable")
    return JSONResponse({"status": status, "models": models}, status_code=200 if ready else 503)


@router.get("/metrics")
async def metrics(request: Request):
    return PlainTextResponse(_state(request).metrics.render(),
                             media_type="text/plain; version=0.0.4")
