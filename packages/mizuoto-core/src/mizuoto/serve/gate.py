"""The server's front door, a pure ASGI wrapper around the application: the API key, the body
limits and the request counter. Pure ASGI, so streaming responses and disconnects pass through
untouched.

- **API key**: ``Authorization: Bearer KEY`` on every path but ``/health`` and those the
  application declares open (the page, which holds no data and asks for the key itself)
  (websockets too), compared in constant time (both sides hashed first, so not even the length
  leaks).
- **Body limits**: counted as the bytes arrive, on every route and whatever the framing
  (``Content-Length`` or chunked): a declared length over the limit is refused before anything
  is read; a body that grows past it is cut off there with 413, whatever the handler was doing.
- **Browsers**: the ``Host``, ``Origin`` and content-type rules of
  :mod:`mizuoto.serve.browser`, checked first, on every route.
- **Slow bodies**: a body whose next bytes take longer than :data:`BODY_IDLE_SECONDS` to come
  (one byte a minute holds a connection and its handler forever) is cut off with 408.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from collections.abc import Callable

from mizuoto.errors import InvalidRequest
from mizuoto.serve.browser import BrowserPolicy
from mizuoto.serve.errors import APIError

log = logging.getLogger("mizuoto.serve")
#: Paths open without the API key (a load balancer's probe has no key).
OPEN_PATHS = frozenset({"/health"})
#: Largest JSON body of a speech request (bytes).
MAX_SPEECH_BODY = 1 << 20
#: Largest body of any route without a limit of its own (none takes one: a stray upload to a
#: GET route, or to a path that does not exist, is cut off here).
MAX_OTHER_BODY = 64 << 10
#: Longest wait for a request body's next bytes (seconds) before a 408: far above any real
#: client's pause, far below holding a worker slot forever.
BODY_IDLE_SECONDS = 30.0
#: The metric label of a request no route took (an unknown path).
UNMATCHED = "unmatched"
#: Longest wait for a client to take the next bytes of an answer (seconds): a stream whose
#: client stopped reading is then ended, its generation stopped and its model freed.
STREAM_WRITE_SECONDS = 30.0
#: Most bytes of a refused body read and dropped after its 413, and the longest time spent
#: so: most clients send their whole body before they read, and a connection closed on
#: unread bytes is reset, losing the 413 the client has not read yet.
DRAIN_BYTES = 32 << 20
DRAIN_SECONDS = 10.0
#: Room for a voice upload's form fields and multipart framing, beyond the clip itself.
FORM_OVERHEAD = 64 << 10


def check_api_key(key: str | None, field: str = "api_key") -> str | None:
    """``key`` if it can be sent in a header and matched: printable ASCII without spaces.
    An empty or blank key is refused: it must never mean "no authentication"."""
    if key is None:
        return None
    if not isinstance(key, str) or not key.strip():
        raise InvalidRequest(field, "is empty", "give a key, or leave it unset to serve "
                             "without authentication")
    if not all("!" <= c <= "~" for c in key):
        raise InvalidRequest(field, "must be printable ASCII without spaces (a header carries "
                             "it: Authorization: Bearer KEY)")
    return key


class BodyTooLarge(APIError):
    """The body passed its limit while it was being read."""

    def __init__(self, limit: int, received: int | None = None) -> None:
        told = f"has {received} bytes" if received is not None else "is"
        # the connection closes after the answer: else the server would go on reading (and
        # dropping) the rest of the body, however long, to keep the connection alive
        super().__init__(413, f"the request body {told} more than {limit} bytes",
                         code="request_too_large", headers={"Connection": "close"})


class BodyStalled(APIError):
    """The body's next bytes did not come within :data:`BODY_IDLE_SECONDS`."""

    def __init__(self, seconds: float) -> None:
        super().__init__(408, f"the request body stalled: no bytes for {seconds:g} s",
                         code="request_timeout", headers={"Connection": "close"})


class StreamStalled(Exception):
    """The client took no bytes of the answer for :data:`STREAM_WRITE_SECONDS`."""


class _QuietStalls(logging.Filter):
    """uvicorn logs what escapes an application as an ERROR with its traceback; a client
    that stopped reading is the client's doing, logged once at INFO by the gate."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], StreamStalled))


def _quiet_stalls() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietStalls) for f in logger.filters):
        logger.addFilter(_QuietStalls())


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


class Gate:
    """Wraps the ASGI ``app``. ``limits`` maps a path to its body limit (others get
    :data:`MAX_OTHER_BODY`); ``on_request(model, path, status)`` counts each ``/v1/`` request;
    ``is_open(path)`` names paths served without the key besides :data:`OPEN_PATHS`."""

    def __init__(self, app, *, api_key: str | None, limits: dict[str, int], on_request,
                 is_open: Callable[[str], bool] = lambda path: False,
                 browser: BrowserPolicy | None = None) -> None:
        self.app = app
        self._browser = browser if browser is not None else BrowserPolicy()
        _quiet_stalls()
        self._is_open = is_open
        self._key = _digest(check_api_key(api_key).encode()) if api_key is not None else None
        self._limits = dict(limits)
        self._on_request = on_request

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        given = [value for name, value in headers if name.lower() == b"authorization"]
        scheme, _, token = given[0].strip().partition(b" ") if len(given) == 1 else (b"", b"",
                                                                                      b"")
        # the scheme is case-insensitive (RFC 9110); one Authorization header, no more
        matched = hmac.compare_digest(_digest(token.strip()), self._key)
        return matched and scheme.lower() == b"bearer"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        refusal = self._browser.refusal(scope.get("method", "GET"), path, scope["headers"])
        if refusal is not None:  # before the key: a foreign page never learns which is wrong
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await _send_error(send, refusal)
            return
        if self._key is not None and path not in OPEN_PATHS and not self._is_open(path) \
                and not self._authorized(scope["headers"]):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await _send_error(send, APIError(
                401, "missing or wrong API key: send Authorization: Bearer <key>",
                code="invalid_api_key"))
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self._limits.get(path, MAX_OTHER_BODY)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await _send_refusal(send, receive, BodyTooLarge(limit, int(declared)))
            return
        await _Limited(self.app, limit, path, self._on_request)(scope, receive, send)


class _Limited:
    """One request under a body limit: the bytes are counted as the server reads them; past
    the limit the read raises :class:`BodyTooLarge` (a stalled body, :class:`BodyStalled`),
    and whatever the application answers instead (a handler may turn a failed read into a
    400) is replaced by that refusal."""

    def __init__(self, app, limit: int, path: str, on_request) -> None:
        self.app = app
        self.limit = limit
        self.path = path
        self.on_request = on_request
        self.received = 0
        self.refusal: APIError | None = None
        self.body_open = True  # until a message says there is no more body
        self.started = False
        self.status = 500

    async def receive(self, receive):
        if not self.body_open:  # a wait for the client to leave (streams) has no deadline
            return await receive()
        seconds = BODY_IDLE_SECONDS
        try:
            message = await asyncio.wait_for(receive(), seconds)
        except TimeoutError:
            self.refusal = BodyStalled(seconds)
            raise self.refusal from None
        if message["type"] == "http.request":
            self.body_open = message.get("more_body", False)
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                self.refusal = BodyTooLarge(self.limit)
                raise self.refusal
        else:
            self.body_open = False
        return message

    async def send(self, send, message) -> None:
        if self.refusal is not None and not self.started:
            self.started = True
            if isinstance(self.refusal, BodyTooLarge):
                await _send_refusal(send, self._receive, self.refusal)
            else:
                await _send_error(send, self.refusal)
            self.status = self.refusal.status
            return
        if self.refusal is not None:
            return  # the refusal has been sent in place of the application's answer
        if message["type"] == "http.response.start":
            self.started = True
            self.status = message["status"]
            await send(message)
            return
        seconds = STREAM_WRITE_SECONDS
        try:  # the server's send waits while the client's socket is full
            await asyncio.wait_for(send(message), seconds)
        except TimeoutError:
            raise StreamStalled(f"the client took no bytes for {seconds:g} s") from None

    async def __call__(self, scope, receive, send) -> None:
        self._receive = receive
        try:
            await self.app(scope, lambda: self.receive(receive),
                           lambda message: self.send(send, message))
        except StreamStalled:
            cancel = scope.get("mizuoto.cancel")
            if cancel is not None:
                cancel()  # at once: the response's generator may be closed only later
            log.info("%s: the client took no bytes for %g s: answer ended", self.path,
                     STREAM_WRITE_SECONDS)
            raise  # uvicorn then closes the connection (its log is quieted: _QuietStalls)
        except Exception:
            # the application has answered (Starlette's last handler sends its 500, logged,
            # then re-raises it); an over-long body is a 413 whatever the handler raised
            if self.refusal is not None and not self.started:
                await self.send(send, None)
            elif not self.started:
                raise
        finally:
            endpoint = route_template(scope)
            if endpoint.startswith("/v1/") or endpoint == UNMATCHED and \
                    self.path.startswith("/v1/"):
                self.on_request(scope.get("mizuoto.model", ""), endpoint, self.status)


def route_template(scope) -> str:
    """The route ``scope`` was routed to, as written (``/v1/audio/voices/{name}``), or
    :data:`UNMATCHED`: a metric label per raw path would let any page's ``<img>`` tags grow
    the server's memory and ``/metrics`` without bound."""
    return getattr(scope.get("route"), "path_format", None) or UNMATCHED


async def _send_error(send, error: APIError, *, more: bool = False) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    for name, value in error.headers.items():
        headers.append((name.lower().encode(), value.encode()))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": more})


async def _send_refusal(send, receive, error: APIError) -> None:
    """``error`` (a 413) sent whole, then the rest of the body read and dropped (up to
    :data:`DRAIN_BYTES` and :data:`DRAIN_SECONDS`) before the answer ends and the
    connection closes: a client still sending reads the 413 instead of a reset."""
    await _send_error(send, error, more=True)
    loop = asyncio.get_running_loop()
    deadline, dropped = loop.time() + DRAIN_SECONDS, 0
    while dropped <= DRAIN_BYTES:
        try:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            break
        if message["type"] != "http.request":
            break  # the client left
        dropped += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.body", "body": b"", "more_body": False})
