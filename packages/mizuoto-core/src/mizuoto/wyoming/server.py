"""The Wyoming server: configuration, the state its connections share, and running it.

It is ``mizuoto serve``'s machinery behind another protocol: the same model workers and
bounded queues (:class:`~mizuoto.serve.worker.ModelWorker`), the same voice store (a voice
made on the page of ``mizuoto serve`` is spoken here), the same port binding and errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator

import attrs
from wyoming.error import Error

from mizuoto.serve.app import ServeConfig, _loopback, _State, bind
from mizuoto.serve.errors import APIError, bad_request, from_mizuoto, not_found, quoted
from mizuoto.serve.routes import MAX_INPUT_CHARS
from mizuoto.serve.voices import DEFAULT_VOICE, check_name
from mizuoto.validation.ranges import integer_in, number_in
from mizuoto.wyoming.frames import FrameLimits
from mizuoto.wyoming.info import describe, split_voice, voice_name

log = logging.getLogger("mizuoto.wyoming")

#: Longest text one synthesis takes (characters): the HTTP server's.
MAX_TEXT_CHARS = MAX_INPUT_CHARS
#: Wyoming's customary TTS port (wyoming-piper's).
DEFAULT_PORT = 10200
#: The mDNS service type Home Assistant's Wyoming integration browses.
ZEROCONF_TYPE = "_wyoming._tcp.local."
MDNS_GROUP = "224.0.0.251"


@attrs.frozen
class WyomingConfig:
    """What ``mizuoto wyoming`` serves: ``serve`` (its models, options, queue size, voice
    directory and grace; its host and port are this server's), ``max_connections`` clients
    at once (more are answered ``too_many_connections`` and closed before anything they
    send is read), ``seed`` and ``steps`` (sampling steps) for every synthesis (None: each draws a
    seed; the engine's steps), ``languages`` to announce
    instead of the engine's, ``zeroconf`` to announce the server on the network."""

    serve: ServeConfig
    max_connections: int = attrs.field(default=32, validator=integer_in(
        "max_connections", 1, 4096))
    seed: int | None = attrs.field(default=None, validator=integer_in(
        "seed", 0, 2**32 - 1, optional=True))
    steps: int | None = attrs.field(default=None, validator=integer_in(
        "steps", 1, 10_000, optional=True))
    languages: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    zeroconf: bool = False
    #: what one event may hold and how long a client may take to send it (idle, read)
    frames: FrameLimits = attrs.field(factory=FrameLimits)
    #: seconds a client may take none of an answer before it is disconnected (its generation
    #: stops: a client that stops reading cannot hold the model)
    write_timeout: float = attrs.field(default=10.0, validator=number_in(
        "write_timeout", 0.0, 3600.0, low_open=True))
    #: characters of streamed text (synthesize-chunk) waiting for a sentence end
    max_pending_chars: int = attrs.field(default=MAX_TEXT_CHARS, validator=integer_in(
        "max_pending_chars", 1, MAX_TEXT_CHARS))


class Connections:
    """How many clients are connected, at most ``limit`` (the event loop's thread only)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    def admit(self) -> bool:
        if self.count >= self.limit:
            return False
        self.count += 1
        return True

    def release(self) -> None:
        self.count -= 1


class Service:
    """What every connection shares: the workers, the voice store, the limits."""

    def __init__(self, config: WyomingConfig) -> None:
        from importlib.metadata import version

        self.config = config
        self.state = _State(config.serve)
        self.voices = self.state.voices
        self.workers = self.state.workers
        self.connections = Connections(config.max_connections)
        self.version = version("mizuoto-core")

    async def info(self):
        saved = await asyncio.to_thread(self.voices.list)
        return describe(self.workers, saved, version=self.version,
                        language_override=self.config.languages).event()

    def worker_for(self, name: str | None):
        """``(worker, voice)`` for a Wyoming voice name (None: the first model's default)."""
        if not name:
            return next(iter(self.workers.values())), DEFAULT_VOICE
        model, voice = split_voice(name)
        if model is None:  # a bare voice name: the first model it fits, else the first model
            model, voice = (name, DEFAULT_VOICE) if name in self.workers else \
                (next(iter(self.workers)), name)
        worker = self.workers.get(model)
        if worker is None:
            raise not_found(f"no model named {quoted(model)} (voice {quoted(name)}): served are "
                            f"{', '.join(self.workers)}; describe lists the voices",
                            "voice", "voice_not_found")
        if voice != DEFAULT_VOICE:
            check_name(voice, "voice")
            if not self.voices.path(voice).is_file():
                raise not_found(f"no voice named {quoted(voice_name(model, voice))}: describe "
                                "lists the voices", "voice", "voice_not_found")
        return worker, voice

    def checked_text(self, text: str) -> str:
        if not isinstance(text, str) or not text.strip():
            raise bad_request("the text is empty: send something to say", param="text")
        if len(text) > MAX_TEXT_CHARS:
            raise bad_request(f"the text has {len(text)} characters, more than "
                              f"{MAX_TEXT_CHARS}: send it in parts", param="text",
                              code="string_above_max_length")
        return text

    def plan(self, engine, text: str, voice):
        """The speech service's plan of ``text`` in ``voice`` on ``engine``, with the
        configured seed (unset: the engine's plan draws one) and steps."""
        from mizuoto.service import plan_speech, speech_order

        try:
            order = speech_order(text, voice=voice, seed=self.config.seed,
                                 steps=self.config.steps)
            return plan_speech(engine, order)
        except Exception as exc:
            raise from_mizuoto(exc) from exc

    def start(self) -> None:
        for worker in self.workers.values():
            worker.start()

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.stop(self.config.serve.grace)


async def _serve(service: Service, sock, stop: asyncio.Event) -> None:
    from mizuoto.wyoming.handler import WyomingHandler

    handlers: set[asyncio.Task] = set()

    async def connected(reader, writer) -> None:
        task = asyncio.current_task()
        handlers.add(task)
        admitted = service.connections.admit()
        try:
            if not admitted:  # refused before a byte is read: it buffers nothing
                writer.write(_too_many(service.config.max_connections))
                with contextlib.suppress(ConnectionError, TimeoutError):
                    await asyncio.wait_for(writer.drain(), 1.0)
                return
            await WyomingHandler(reader, writer, service).run()
        except (ConnectionError, TimeoutError, APIError) as exc:  # the client left or stalled
            log.info("client disconnected: %s", exc)
        except Exception:  # the server's fault: logged, and the others are served on
            log.exception("unexpected error on a Wyoming connection")
        finally:
            if admitted:
                service.connections.release()
            writer.close()
            handlers.discard(task)

    server = await asyncio.start_server(connected, sock=sock,
                                        limit=service.config.frames.line_bytes)
    async with server:
        await stop.wait()
        server.close()
        for task in list(handlers):
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)


def _too_many(limit: int) -> bytes:
    from mizuoto.wyoming.handler import _frame

    error = Error(text=f"{limit} clients are connected: try again shortly",
                  code="too_many_connections")
    return _frame(error.event())


def zeroconf_service(port: int, host: str, name: str | None = None):
    """The mDNS service Home Assistant discovers (``zeroconf.asyncio.AsyncServiceInfo``): type
    ``_wyoming._tcp.local.`` (wyoming's ``HomeAssistantZeroconf``), instance ``name`` (default
    ``mizuoto-<hostname>-<port>``), ``port``, and the address clients reach: ``host``, or for a
    wildcard host the address of the interface that routes to the mDNS group."""
    import socket

    from zeroconf.asyncio import AsyncServiceInfo

    if host in ("", "0.0.0.0", "::"):
        # as wyoming's: a UDP socket "connected" to the mDNS group sends nothing, it only
        # picks the interface (and its address) that route there
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((MDNS_GROUP, 1))
            address = probe.getsockname()[0]
    else:
        address = socket.gethostbyname(host)
    # an mDNS instance name is one DNS label: 63 bytes at most
    name = name or f"mizuoto-{socket.gethostname()}"[:50] + f"-{port}"
    return AsyncServiceInfo(ZEROCONF_TYPE, f"{name}.{ZEROCONF_TYPE}",
                            addresses=[socket.inet_aton(address)], port=port)


async def _announce(port: int, host: str):
    """Register the service on the network; the ``AsyncZeroconf`` to close at shutdown."""
    from zeroconf.asyncio import AsyncZeroconf

    service = zeroconf_service(port, host)
    announcer = AsyncZeroconf()
    await announcer.async_register_service(service)
    log.info("announced on the network (zeroconf) as %s at %s:%d", service.name,
             service.parsed_addresses()[0], port)
    return announcer


def run(config: WyomingConfig) -> None:
    """Serve until SIGINT or SIGTERM. The port is bound before any model loads."""
    import signal

    serve = config.serve
    sock = bind(serve.host, serve.port)
    service = Service(config)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        service.start()
        # describe answers once the models are in: Home Assistant keeps what the first one
        # says (connections wait in the listening socket's backlog meanwhile)
        for worker in service.workers.values():
            await asyncio.to_thread(worker.loaded.wait)
        announcer = await _announce(serve.port, serve.host) if config.zeroconf else None
        # said louder when anyone on the network can use it: Wyoming has no authentication
        log.log(logging.INFO if _loopback(serve.host) else logging.WARNING,
                "listening on tcp://%s:%d (Wyoming; no authentication: anyone who can reach "
                "it can use it)", serve.host, serve.port)
        try:
            await _serve(service, sock, stop)
        finally:
            if announcer is not None:  # withdrawn, so that Home Assistant forgets it now
                await announcer.async_close()

    try:
        asyncio.run(main())
    finally:
        service.stop()
        sock.close()


@contextlib.contextmanager
def serve_in_thread(config: WyomingConfig, *, ready_timeout: float = 120.0
                    ) -> Iterator[tuple[str, int]]:
    """Run the server on a free loopback port in a thread; yields ``(host, port)`` once every
    model has loaded, and stops it on exit. For tests."""
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    service = Service(config)
    service.start()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete,
                              args=(_serve(service, sock, stop),), name="mizuoto-wyoming",
                              daemon=True)
    try:
        for worker in service.workers.values():
            if not worker.loaded.wait(ready_timeout):
                raise TimeoutError(f"model {worker.name} did not load in {ready_timeout} s")
        thread.start()
        yield "127.0.0.1", port
    finally:
        if thread.is_alive():
            loop.call_soon_threadsafe(stop.set)
            thread.join(30)
        service.stop()
        loop.close()
        sock.close()
