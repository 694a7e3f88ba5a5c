"""The server: configuration, the FastAPI application, and running it with uvicorn.

``create_app(config)`` starts one :class:`~mizuoto.serve.worker.ModelWorker` per model when
the application starts (each loads its model on its own thread; ``/health`` answers 503 until
all are ready) and stops them when it shuts down. ``run(config)`` serves until SIGINT or
SIGTERM: uvicorn stops accepting connections, lets in-flight responses finish within
``config.grace`` seconds, then the workers stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import socket
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType

import attrs

from mizuoto.contracts.features import stepping_engine
from mizuoto.errors import InvalidRequest, MizuotoError
from mizuoto.serve.adapters import load_adapters, served_adapters
from mizuoto.serve.batching import MAX_BATCH, batch_stats, options_with_max_batch
from mizuoto.serve.browser import BrowserPolicy
from mizuoto.serve.budget import ClientBudget
from mizuoto.serve.errors import APIError, ClientGone, from_mizuoto
from mizuoto.serve.gate import (
    FORM_OVERHEAD,
    MAX_SPEECH_BODY,
    Gate,
    StreamStalled,
    check_api_key,
)
from mizuoto.serve.metrics import Metrics
from mizuoto.serve.pool import ModelPool
from mizuoto.serve.voices import DEFAULT_MAX_VOICES, DEFAULT_MAX_VOICES_BYTES, VoiceStore
from mizuoto.serve.worker import ModelWorker
from mizuoto.validation.ranges import integer_in, number_in

log = logging.getLogger("mizuoto.serve")

#: Longest ``grace`` (seconds): an hour is more than any request takes; more is a typo.
MAX_GRACE = 3600.0
#: Most requests one model may have waiting (each holds its body and, once running, audio).
MAX_QUEUE_SIZE = 4096
#: Largest voice upload the server can be told to accept (bytes), and longest clip (seconds).
MAX_UPLOAD_BYTES = 1 << 30
MAX_UPLOAD_SECONDS = 3600.0
#: Seconds a request's headers may take from its first byte (slow headers: 408, closed), and
#: an idle keep-alive connection stays open between requests (uvicorn's 5)
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_KEEP_ALIVE = 5.0
#: Characters of text one client may have being spoken at once: four of the longest requests.
DEFAULT_CLIENT_CHARS = 4 * 4096


def _optional_positive(field: str):
    return integer_in(field, 1, 2**63 - 1, optional=True)


def _api_key(instance, attribute, value) -> None:
    check_api_key(value, "api_key")


@attrs.frozen
class ServeConfig:
    """What ``mizuoto serve`` serves, and how.

    ``models`` maps the name a request uses (``model``) to a catalog id or a model directory
    (:func:`model_names` builds it from ``-m`` and ``--alias``). ``queue_size`` bounds each
    model's waiting requests (more: 429). ``voices_dir`` defaults to ``$MIZUOTO_HOME/voices``.
    ``max_loaded`` (models) and ``memory_budget`` (bytes of weights) bound what stays loaded:
    the first ``max_loaded`` models load at start, the others on their first request, and
    the least recently used idle models are unloaded to make room
    (:class:`~mizuoto.serve.pool.ModelPool`).
    ``shared_lock`` runs every model's requests under one lock: the single-global-lock
    baseline of the load test, not a setting to serve with. ``max_batch`` (1 to
    :data:`~mizuoto.serve.batching.MAX_BATCH`) takes one road: into the options of the
    engines that batch (:mod:`mizuoto.serve.batching`); a model's worker then runs as many of
    its requests at once as the loaded engine says it batches. 1, or an engine that does not
    batch: one after the other.

    ``allowed_hosts`` and ``allowed_origins`` add to what a browser may reach
    (:mod:`mizuoto.serve.browser`); ``max_voices`` and ``max_voices_bytes`` cap the stored
    voices (:class:`~mizuoto.serve.voices.VoiceStore`).

    ``lora_dirs``: directories of LoRA exports, each served as a model named by its directory
    (:mod:`mizuoto.serve.adapters`: an adapter on its base model's worker, selected per
    request).

    Every value is checked here, so the CLI and the Python API refuse the same ones: ``port``
    1 to 65535, ``grace`` finite in [0, :data:`MAX_GRACE`], an ``api_key`` that is not
    empty or blank (``None``: no authentication).
    """

    models: Mapping[str, str] = attrs.field(converter=lambda v: MappingProxyType(dict(v)))
    engine: str | None = None
    options: object | None = None  # mizuoto.Options
    host: str = attrs.field(default="127.0.0.1")
    port: int = attrs.field(default=8000, validator=integer_in("port", 1, 65535))
    api_key: str | None = attrs.field(default=None, validator=_api_key)
    queue_size: int = attrs.field(default=16, validator=integer_in("queue_size", 1,
                                                                   MAX_QUEUE_SIZE))
    grace: float = attrs.field(default=30.0, validator=number_in("grace", 0.0, MAX_GRACE))
    voices_dir: Path | None = None
    max_upload_bytes: int = attrs.field(default=10 << 20, validator=integer_in(
        "max_upload_bytes", 1, MAX_UPLOAD_BYTES))
    max_upload_seconds: float = attrs.field(default=60.0, validator=number_in(
        "max_upload_seconds", 0.0, MAX_UPLOAD_SECONDS, low_open=True))
    max_loaded: int | None = attrs.field(default=None, validator=_optional_positive(
        "max_loaded"))
    memory_budget: int | None = attrs.field(default=None, validator=_optional_positive(
        "memory_budget"))
    shared_lock: bool = False
    max_batch: int = attrs.field(default=1, validator=integer_in("max_batch", 1, MAX_BATCH))
    # what a browser may reach (mizuoto.serve.browser): Host names besides loopback and
    # ``host`` (a reverse proxy's), and origins besides the page's own ("*": any)
    allowed_hosts: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    allowed_origins: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    # stored voices: how many, and their bytes together (a page or client filling the disk)
    max_voices: int = attrs.field(default=DEFAULT_MAX_VOICES, validator=integer_in(
        "max_voices", 1, 1 << 20))
    max_voices_bytes: int = attrs.field(default=DEFAULT_MAX_VOICES_BYTES, validator=integer_in(
        "max_voices_bytes", 1, 1 << 50))
    # characters of text one client may have in flight (mizuoto.serve.budget): 429 past it
    max_client_chars: int = attrs.field(default=DEFAULT_CLIENT_CHARS, validator=integer_in(
        "max_client_chars", 1, 1 << 30))
    # slow and idle connections (mizuoto.serve.connections): seconds a request's headers may
    # take, and an idle keep-alive connection may stay open between requests
    header_timeout: float = attrs.field(default=DEFAULT_HEADER_TIMEOUT, validator=number_in(
        "header_timeout", 0.0, MAX_GRACE, low_open=True))
    keep_alive: float = attrs.field(default=DEFAULT_KEEP_ALIVE, validator=number_in(
        "keep_alive", 0.0, MAX_GRACE, low_open=True))
    lora_dirs: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    @allowed_hosts.validator
    def _allowed_hosts(self, attribute, value) -> None:
        for name in value:
            if not isinstance(name, str) or not name.strip() or any(
                    c in name for c in "/ \t@"):
                raise InvalidRequest("allowed_host", f"{name!r} is not a host name",
                                     "give a name such as tts.example.com (no scheme or path)")

    @allowed_origins.validator
    def _allowed_origins(self, attribute, value) -> None:
        for origin in value:
            scheme, sep, rest = str(origin).partition("://")
            if origin != "*" and (not sep or scheme not in ("http", "https") or not rest
                                  or "/" in rest.rstrip("/")):
                raise InvalidRequest("allowed_origin", f"{origin!r} is not an origin",
                                     "give scheme://host[:port], e.g. https://app.example.com")

    @host.validator
    def _host(self, attribute, value) -> None:
        if not isinstance(value, str) or not value.strip():
            raise InvalidRequest("host", "is empty", "give an address such as 127.0.0.1")


def model_names(models: list[str] | tuple[str, ...], aliases: list[str] | tuple[str, ...] = ()
                ) -> dict[str, str]:
    """Request names for ``-m`` values (a directory by its name, a catalog id as itself) and
    ``--alias NAME=MODEL`` pairs."""
    names: dict[str, str] = {}

    def add(name: str, model: str, option: str) -> None:
        if not name:
            raise InvalidRequest(option, f"{model!r} gives an empty model name")
        if name in names and names[name] != model:
            raise InvalidRequest(option, f"two models are named {name!r}",
                                 "name one of them with --alias NAME=MODEL")
        names[name] = model

    for model in models:
        path = Path(model)
        add(path.resolve().name if path.is_dir() else model, model, "--model")
    for pair in aliases:
        name, sep, model = pair.partition("=")
        if not sep or not model:
            raise InvalidRequest("--alias", f"{pair!r} must be written NAME=MODEL")
        add(name.strip(), model.strip(), "--alias")
    if not names:
        raise InvalidRequest("--model", "is missing", "give at least one -m MODEL")
    return names


class _State:
    def __init__(self, config: ServeConfig, loader=None) -> None:
        from mizuoto.catalog import mizuoto_home

        self.config = config
        self.metrics = Metrics()
        self.voices = VoiceStore(config.voices_dir or mizuoto_home() / "voices",
                                 max_count=config.max_voices,
                                 max_bytes=config.max_voices_bytes)
        self.budget = ClientBudget(config.max_client_chars)
        self.closing = False
        self.cards: dict[str, dict] = {}  # GET /v1/models' card of each model, once loaded
        shared = threading.Lock() if config.shared_lock else None
        pool = None
        if config.max_loaded is not None or config.memory_budget is not None:
            pool = ModelPool(config.max_loaded, config.memory_budget)
        # under --ray the adapters are the Ray deployment's (mizuoto.serve.ray)
        adapters = served_adapters(config.lora_dirs if loader is None else (), config.models)
        self.workers: dict[str, ModelWorker] = {}
        models = {**config.models, **adapters.models}
        for index, (name, model) in enumerate(models.items()):
            preload = config.max_loaded is None or index < config.max_loaded
            load = _loader(model, config, name, adapters.on_base.get(name, {}))
            if loader is not None:  # mizuoto serve --ray: the model runs on its replicas
                load, preload = loader(name, model)
            worker = ModelWorker(name, model, load=load,
                                 queue_size=config.queue_size, metrics=self.metrics,
                                 shared_lock=shared, pool=pool, preload=preload)
            self.metrics.watch_queue(name, worker.depth)
            self.metrics.watch_batches(name, lambda worker=worker: batch_stats(worker.engine))
            self.workers[name] = worker
        #: what a request's ``model`` names: a model (its worker, no adapter) or an adapter
        #: (its base model's worker, the adapter's name)
        self.routes: dict[str, tuple[ModelWorker, str | None]] = {
            name: (worker, None) for name, worker in self.workers.items()}
        self.routes.update({adapter: (self.workers[base], adapter)
                            for adapter, base in adapters.base_of().items()})


_LOADING = threading.Lock()


def _loader(model: str, config: ServeConfig, name: str = "", adapters=None):
    def load():
        import mizuoto

        # one load at a time: plugin discovery and the registry are not built for concurrent
        # first use, and two loads at once would only compete for memory and cores
        options = options_with_max_batch(config.options, config.max_batch)
        with _LOADING:
            engine = mizuoto.load(model, engine=config.engine, options=options)
        if stepping_engine(engine) is not None:  # the core's scheduler batches its rows
            engine.max_rows = config.max_batch
        load_adapters(engine, name, adapters or {})
        return engine

    return load


def create_app(config: ServeConfig, *, loader=None, start_loaded: bool = False):
    """The FastAPI application serving ``config``. ``loader(name, model)``, if given, returns
    what loads each model and whether to load it at start, instead of loading it in this
    process (:mod:`mizuoto.serve.ray`: an engine whose calls run on Ray Serve replicas).
    ``start_loaded``: the application's start-up ends only once every model loaded at start
    has loaded or failed (Ray Serve counts a replica as started after it, so no request meets
    a model still loading); otherwise it serves at once and ``/health`` says 503 meanwhile."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import Response
    from pydantic import ValidationError
    from starlette.exceptions import HTTPException

    from mizuoto.serve.page import is_page_path
    from mizuoto.serve.page import router as page_router
    from mizuoto.serve.routes import router

    state = _State(config, loader)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        for worker in state.workers.values():
            worker.start()
        if start_loaded:
            await asyncio.gather(*(asyncio.to_thread(w.loaded.wait)
                                   for w in state.workers.values()))
        yield
        state.closing = True
        await asyncio.gather(*(asyncio.to_thread(w.stop, config.grace)
                               for w in state.workers.values()))

    app = FastAPI(title="Mizuoto speech server", lifespan=lifespan, docs_url=None,
                  redoc_url=None)
    app.state.mizuoto = state
    app.include_router(router)
    app.include_router(page_router)

    def respond(error: APIError) -> Response:
        # ASCII JSON: a message may echo what a client sent, which need not encode as UTF-8
        return Response(json.dumps(error.body()), status_code=error.status,
                        headers=error.headers, media_type="application/json")

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return respond(exc)

    @app.exception_handler(ValidationError)
    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc):
        return respond(_validation_error(exc.errors()))

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return respond(APIError(exc.status_code, str(exc.detail), code=code))

    @app.exception_handler(ClientGone)
    async def client_gone(request, exc):
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it

    @app.exception_handler(MizuotoError)
    async def mizuoto_error(request, exc: MizuotoError):
        # here, not under Exception: Starlette re-raises what reaches its last handler, and
        # uvicorn logs it with a traceback; a bad request is the client's, never an ERROR
        return respond(_logged(from_mizuoto(exc), exc))

    @app.exception_handler(Exception)
    async def unexpected(request, exc: Exception):
        if isinstance(exc, StreamStalled):  # the answer had begun: the gate ends it, no 500
            return Response(status_code=499)
        return respond(_logged(from_mizuoto(exc), exc))

    browser = BrowserPolicy(config.host, config.allowed_hosts, config.allowed_origins)
    return Gate(app, api_key=config.api_key, on_request=state.metrics.request,
                is_open=is_page_path, browser=browser, limits={
        # refused before the body is read, or as soon as it passes the limit; a voice's
        # multipart form holds the clip and its fields
        "/v1/audio/speech": MAX_SPEECH_BODY,
        "/v1/audio/voices": config.max_upload_bytes + FORM_OVERHEAD})


def _logged(error: APIError, exc: BaseException) -> APIError:
    """``error``, logged with ``exc``'s traceback when it is the server's fault (5xx)."""
    if error.status >= 500:
        log.error("unexpected error", exc_info=exc)
    return error


def _validation_error(errors) -> APIError:
    first = errors[0] if errors else {}
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    # pydantic names a union member in the location (voice.str); OpenAI names the field
    location = [part for part in location if part not in ("str", "VoiceId")]
    kind = first.get("type", "")
    code = {"extra_forbidden": "unknown_parameter", "missing": "missing_required_parameter",
            "string_too_long": "string_above_max_length"}.get(kind, "invalid_value")
    param = ".".join(location) or None
    message = first.get("msg", "invalid request")
    if kind == "extra_forbidden":
        message = (f"unknown parameter {param!r}: Mizuoto's own settings go under the "
                   "'mizuoto' key (seed, steps, guidance, params, stream)")
    elif param:
        message = f"{param}: {message}"
    return APIError(400, message, param=param, code=code)


def _uvicorn_config(config: ServeConfig, app, **overrides):
    import uvicorn

    from mizuoto.serve.connections import guarded_protocol

    settings = {"host": config.host, "port": config.port, "lifespan": "on",
                "timeout_graceful_shutdown": config.grace, "log_level": "info",
                "http": guarded_protocol(config.header_timeout),
                "timeout_keep_alive": config.keep_alive, **overrides}
    return uvicorn.Config(app, **settings)


def raise_descriptor_limit() -> None:
    """Raise the soft limit on open files to the hard one (systemd's soft default is 1,024:
    a thousand idle sockets would refuse every other client), and say what it is."""
    try:
        import resource
    except ImportError:  # Windows: no such limit
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    log.info("open files: at most %s (raise LimitNOFILE in the service unit for more)",
             "unlimited" if soft == resource.RLIM_INFINITY else f"{soft:,}")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (0: a free port); a port in use, one that needs
    privileges or an address this machine does not have is an :class:`InvalidRequest` naming
    ``port`` or ``host`` (not uvicorn's exit 3, which the CLI keeps for "not found")."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidRequest("host", f"{host!r} is not an address of this machine ({exc})",
                             "use 127.0.0.1, 0.0.0.0 or a local interface's address") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # uvicorn's default backlog
    except OSError as exc:
        sock.close()
        where = f"{host}:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise InvalidRequest("port", f"{where} is already in use",
                                 "stop the other server or pick another port") from None
        if exc.errno == errno.EACCES:
            raise InvalidRequest("port", f"binding {where} is not permitted (ports below 1024 "
                                 "need privileges)", "pick a port from 1024 up") from None
        raise InvalidRequest("host", f"cannot listen on {where}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def auth_line(config: ServeConfig) -> str:
    """The start-up line saying whether requests need the API key."""
    if config.api_key is not None:
        return ("authentication: on (every path but /health and the page needs "
                "Authorization: Bearer <key>)")
    return (f"authentication: off (anyone who can reach {config.host}:{config.port} can use "
            "every route; set --api-key or MIZUOTO_API_KEY to require a key)")


def run(config: ServeConfig) -> None:
    """Serve until SIGINT or SIGTERM (graceful: see the module's docstring). The port is bound
    before any model loads, so a port in use is reported at once."""
    import uvicorn

    sock = bind(config.host, config.port)
    raise_descriptor_limit()
    try:
        app = create_app(config)
        server = uvicorn.Server(_uvicorn_config(config, app))
        # said louder when anyone on the network could use the server without a key
        open_door = config.api_key is None and not _loopback(config.host)
        log.log(logging.WARNING if open_door else logging.INFO, "listening on http://%s:%d; %s",
                config.host, config.port, auth_line(config))
        server.run(sockets=[sock])
    finally:
        sock.close()


@contextlib.contextmanager
def serve_in_thread(config: ServeConfig, *, ready_timeout: float = 120.0) -> Iterator[str]:
    """Run the server on a free loopback port in a thread; yields its base URL
    (``http://127.0.0.1:PORT``) once every model has loaded, and stops it on exit.
    For tests and benchmarks."""
    import uvicorn

    app = create_app(config)
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(_uvicorn_config(config, app, log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])),
                              name="mizuoto-serve", daemon=True)
    thread.start()
    try:
        for worker in app.app.state.mizuoto.workers.values():  # the FastAPI app in the gate
            if not worker.loaded.wait(ready_timeout):
                raise TimeoutError(f"model {worker.name} did not load in {ready_timeout} s")
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server stopped while starting")
            threading.Event().wait(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(config.grace + 10)
        sock.close()


def wait_healthy(url: str, process=None, timeout: float = 90.0) -> None:
    """Wait until ``url``'s ``/health`` answers 200 (a server started as a process: raise as
    soon as ``process``, a ``subprocess.Popen``, has exited). For tests and benchmarks."""
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):  # refused, or 503 while loading
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} was not healthy within {timeout} s")
