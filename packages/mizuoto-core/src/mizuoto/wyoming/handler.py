"""One Wyoming connection: ``describe``, ``synthesize`` and streamed synthesis, run on the
model workers of ``mizuoto serve`` (:mod:`mizuoto.serve.worker`).

Audio goes out as the engine makes it (``Engine.stream``, the HTTP server's job: VoxCPM's
patches, F5-TTS's text chunks; an engine that cannot stream sends its whole audio as one
chunk), 16-bit mono PCM at the model's own rate. With ``synthesize-start`` ...
``synthesize-stop`` each sentence is spoken as soon as it is complete, inside one
``audio-start`` ... ``audio-stop``, then ``synthesize-stopped``. A bad request gets an
``error`` event and the connection stays open; a client that goes away mid-stream has its
generation cancelled at the engine's next chunk or progress report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
)
from wyoming.version import __version__ as WYOMING_VERSION

from mizuoto.audio_encoding import to_int16
from mizuoto.contracts.capabilities import Capability
from mizuoto.serve.errors import APIError, bad_request, from_mizuoto
from mizuoto.serve.jobs import DONE, Job, Pin
from mizuoto.serve.routes import _speech_job
from mizuoto.wyoming.frames import BrokenStream, read_event
from mizuoto.wyoming.sentences import SentenceSplitter

log = logging.getLogger("mizuoto.wyoming")

#: Sample width of the audio sent (bytes): 16-bit PCM, what every Wyoming client plays.
WIDTH = 2


class _Stream:
    """A ``synthesize-start`` under way: its voice, the text not yet spoken, whether
    ``audio-start`` went out."""

    def __init__(self, voice) -> None:
        self.voice = voice
        self.splitter = SentenceSplitter()
        self.rate: int | None = None


class WyomingHandler:
    """Events of one admitted connection; ``service`` is the
    :class:`~mizuoto.wyoming.server.Service` shared by all. Events are read by
    :func:`~mizuoto.wyoming.frames.read_event` (shapes and lengths checked first) and answered
    in turn; every write must be taken by the client within the write timeout, else the
    connection closes and its generation stops, so that a client that stops reading cannot
    hold the model."""

    def __init__(self, reader, writer, service) -> None:
        self.reader = reader
        self.writer = writer
        self.service = service
        self._stream: _Stream | None = None

    async def run(self) -> None:
        """Answer events until the client leaves or the stream breaks (answered first)."""
        limits = self.service.config.frames
        while True:
            try:
                event = await read_event(self.reader, limits)
                if event is None:
                    return
                await self._handle(event)
            except BrokenStream as exc:
                log.info("closing a connection: %s", exc.message)
                with contextlib.suppress(ConnectionError, TimeoutError):
                    await self._error(exc)
                return
            except APIError as exc:
                self._stream = None  # a streamed text that failed starts again from its start
                await self._error(exc)

    async def write_event(self, event: Event) -> None:
        """Send ``event``; a :class:`TimeoutError` once the client has taken none of it for
        the write timeout."""
        self.writer.write(_frame(event))
        try:
            await asyncio.wait_for(self.writer.drain(), self.service.config.write_timeout)
        except TimeoutError:
            self.writer.transport.abort()  # what it did not take is dropped, not buffered
            raise TimeoutError(f"the client took no audio for "
                               f"{self.service.config.write_timeout:g} s") from None

    async def _handle(self, event: Event) -> None:
        if Describe.is_type(event.type):
            await self.write_event(await self.service.info())
        elif Synthesize.is_type(event.type):
            if self._stream is not None:
                return  # the same text sent whole for clients that do not stream: spoken once
            synthesize = Synthesize.from_event(event)
            rate = await self._speak(synthesize.text, synthesize.voice, None)
            await self.write_event(AudioStop().event())
            log.debug("synthesized at %d Hz", rate)
        elif SynthesizeStart.is_type(event.type):
            self._stream = _Stream(SynthesizeStart.from_event(event).voice)
        elif SynthesizeChunk.is_type(event.type):
            stream = self._streaming("synthesize-chunk")
            text = SynthesizeChunk.from_event(event).text
            for sentence in stream.splitter.add(text, self.service.config.max_pending_chars):
                stream.rate = await self._speak(sentence, stream.voice, stream.rate)
        elif SynthesizeStop.is_type(event.type):
            stream = self._streaming("synthesize-stop")
            rest = stream.splitter.finish()
            if rest or stream.rate is None:  # nothing spoken at all: the empty-text error
                stream.rate = await self._speak(rest, stream.voice, stream.rate)
            self._stream = None
            await self.write_event(AudioStop().event())
            await self.write_event(SynthesizeStopped().event())

    def _streaming(self, kind: str) -> _Stream:
        if self._stream is None:
            raise bad_request(f"{kind} without synthesize-start: send synthesize-start first")
        return self._stream

    async def _error(self, exc: APIError) -> None:
        await self.write_event(Error(text=exc.message, code=exc.code).event())

    async def _speak(self, text: str, wyoming_voice, rate: int | None) -> int:
        """Speak ``text``; ``rate`` None sends ``audio-start`` first. Returns the rate."""
        service = self.service
        worker, voice_name = service.worker_for(getattr(wyoming_voice, "name", None))
        text = service.checked_text(text)
        worker.submit_check()
        pin = Pin(worker)
        try:
            engine = worker.engine
            voice = await service.voices.saved(voice_name)
            planned = service.plan(engine, text, voice)  # the engine checks the voice
            stream = engine.supports(Capability.STREAM)  # else the whole audio, as one chunk
            job = Job(_speech_job(planned, stream), asyncio.get_running_loop(), pin=pin)
            worker.submit(job)
        except BaseException:
            pin.release()
            raise
        try:
            if rate is None:
                # at once, while the job waits its turn: a client that closed its socket with
                # this unread answers with a reset, which cancels the job before it runs
                rate = engine.info.sample_rate
                await self.write_event(AudioStart(rate, WIDTH, 1).event())
            item = await self._next(job)
            while item is not DONE:
                if isinstance(item, BaseException):
                    raise from_mizuoto(item)
                samples = to_int16(item.audio.numpy())
                await self.write_event(AudioChunk(rate, WIDTH, 1, samples.tobytes()).event())
                item = await self._next(job)
        finally:
            job.cancel()  # the client went away (a write failed): the engine stops and frees
        return rate

    async def _next(self, job: Job):
        """The job's next item; a :class:`ConnectionResetError` once the connection is gone
        meanwhile (seen at once, not at the next write, so that a queued job is skipped and a
        running one stops at its next chunk or progress report). A client that only closed
        its sending side (``shutdown(SHUT_WR)`` after ``synthesize``) still gets its audio."""
        getter = asyncio.ensure_future(job.get())
        while not (await asyncio.wait({getter}, timeout=0.05))[0]:
            if self.writer.is_closing() or self.reader.exception() is not None:
                getter.cancel()
                raise ConnectionResetError("the client closed the connection")
        return getter.result()


def _frame(event: Event) -> bytes:
    """``event`` as the wyoming package writes it: header line, data block, payload."""
    header: dict = {"type": event.type, "version": WYOMING_VERSION}
    data = json.dumps(event.data, ensure_ascii=False).encode() if event.data else b""
    if data:
        header["data_length"] = len(data)
    if event.payload:
        header["payload_length"] = len(event.payload)
    return b"".join((json.dumps(header, ensure_ascii=False).encode(), b"\n", data,
                     event.payload or b""))
