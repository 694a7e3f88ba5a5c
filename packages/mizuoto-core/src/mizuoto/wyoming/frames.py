"""Wyoming events read off a connection, each checked against the protocol's shapes before
anything it declares is read.

A frame is a JSON header line (``{"type": ..., "data": {...}, "data_length": N,
"payload_length": M}``), then ``N`` bytes of JSON data merged into ``data``, then ``M`` bytes
of payload. The wyoming package's reader trusts all of it: a 2 GB ``data_length`` is buffered,
``[1]`` or ``"x"`` ends in a traceback, a string length in a ``TypeError``. Here the line is
bounded (:attr:`FrameLimits.line_bytes`), the header must be an object with a string
``type``, the lengths non-negative integers within :class:`FrameLimits` (checked before a byte
of them is read), ``data`` an object, and the fields of the events this server answers of
the right types (:func:`check_fields`).

A frame refused while the stream can still be followed (its line was whole) raises
:class:`BadEvent`: the client gets an ``error`` event and the connection stays open. One
after which it cannot (a line too long, a length refused, the client gone mid-frame) raises
:class:`BrokenStream`: the ``error`` goes out, then the connection closes.
"""

from __future__ import annotations

import asyncio

import attrs
from wyoming.event import Event

from mizuoto.json_files import JSONFileError, parse_json, type_name
from mizuoto.serve.errors import APIError
from mizuoto.validation.ranges import integer_in, number_in

#: A synthesize of the longest text (4,096 characters, each escaped as ``\\uXXXX\\uXXXX``)
#: fits in a line or a data block with room to spare.
DEFAULT_LINE_BYTES = 256 << 10
DEFAULT_DATA_BYTES = 256 << 10
#: A TTS server is sent no audio; a payload is read (bounded) and dropped.
DEFAULT_PAYLOAD_BYTES = 1 << 20


@attrs.frozen
class FrameLimits:
    """Bounds of one frame (bytes), and how long a client may take (seconds): ``idle`` to
    begin and send a header line (a connection that sends nothing is closed after it),
    ``read`` to send the data and payload the line declared."""

    line_bytes: int = attrs.field(default=DEFAULT_LINE_BYTES, validator=integer_in(
        "line_bytes", 1024, 1 << 30))
    data_bytes: int = attrs.field(default=DEFAULT_DATA_BYTES, validator=integer_in(
        "data_bytes", 0, 1 << 30))
    payload_bytes: int = attrs.field(default=DEFAULT_PAYLOAD_BYTES, validator=integer_in(
        "payload_bytes", 0, 1 << 30))
    idle: float = attrs.field(default=60.0, validator=number_in("idle_timeout", 0.0, 86400.0,
                                                                 low_open=True))
    read: float = attrs.field(default=10.0, validator=number_in("read_timeout", 0.0, 3600.0,
                                                                 low_open=True))


class BadEvent(APIError):
    """An event refused; the stream can be followed: the connection stays open."""

    def __init__(self, message: str) -> None:
        super().__init__(400, message, code="invalid_event")


class BrokenStream(APIError):
    """A frame after which the stream cannot be followed: answered, then closed."""

    def __init__(self, message: str, code: str = "invalid_event") -> None:
        super().__init__(400, message, code=code)


async def read_event(reader: asyncio.StreamReader, limits: FrameLimits) -> Event | None:
    """The next event (None: the client closed the connection between events)."""
    try:
        line = await asyncio.wait_for(reader.readuntil(b"\n"), limits.idle)
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise BrokenStream("the connection closed in the middle of an event") from None
        return None
    except asyncio.LimitOverrunError:
        raise BrokenStream(f"an event's header line is longer than {limits.line_bytes:,} "
                           "bytes", "frame_too_large") from None
    except TimeoutError:
        raise BrokenStream(f"no event for {limits.idle:g} s: closing the idle connection",
                           "idle_timeout") from None
    if not line.strip():
        return Event("")  # a blank line: nothing to answer
    header = _json(line, "the event's header line")
    data_length = _length(header, "data_length", limits.data_bytes)
    payload_length = _length(header, "payload_length", limits.payload_bytes)
    event_type = header.get("type")
    data = header.get("data", {})
    try:
        block = await asyncio.wait_for(_declared(reader, data_length, payload_length),
                                       limits.read)
    except asyncio.IncompleteReadError:
        raise BrokenStream("the connection closed before the data or payload the event "
                           "declared") from None
    except TimeoutError:
        raise BrokenStream(f"the data and payload the event declared did not come within "
                           f"{limits.read:g} s", "read_timeout") from None
    if not isinstance(event_type, str) or not event_type:
        raise BadEvent(f"an event needs a \"type\" (a string), not {type_name(event_type)}")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadEvent(f"{event_type}: \"data\" must be an object, not {type_name(data)}")
    if block:
        more = _json(block, f"{event_type}: the data block")
        data = {**data, **more}
    check_fields(event_type, data)
    return Event(event_type, data)


async def _declared(reader: asyncio.StreamReader, data_length: int, payload_length: int
                    ) -> bytes:
    """The data block; the payload is read and dropped (a TTS server plays no audio)."""
    block = await reader.readexactly(data_length) if data_length else b""
    left = payload_length
    while left:
        left -= len(await reader.readexactly(min(left, 64 << 10)))
    return block


def _json(text: bytes, what: str) -> dict:
    try:
        return parse_json(text, what)
    except JSONFileError as exc:
        raise BadEvent(str(exc)) from None


def _length(header: dict, key: str, limit: int) -> int:
    value = header.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BrokenStream(f"{key} must be a non-negative integer, not {str(value)[:40]!r}")
    if value > limit:
        raise BrokenStream(f"{key} {value:,} is more than this server reads ({limit:,} "
                           "bytes)", "frame_too_large")
    return value


#: The fields of the events this server answers: (name, JSON types allowed, required).
_VOICE = ("voice", (dict, type(None)), False)
_FIELDS: dict[str, tuple[tuple[str, tuple[type, ...], bool], ...]] = {
    "synthesize": (("text", (str,), True), _VOICE),
    "synthesize-start": (_VOICE,),
    "synthesize-chunk": (("text", (str,), True),),
}
_VOICE_FIELDS = ("name", "language", "speaker")


def check_fields(event_type: str, data: dict) -> None:
    """Refuse an event whose fields are not the types Wyoming gives them (a ``synthesize``
    without ``text``, a ``voice`` that is a string, a numeric ``text``...), naming the field."""
    for name, kinds, required in _FIELDS.get(event_type, ()):
        if name not in data:
            if required:
                raise BadEvent(f"{event_type}: data.{name} is missing")
            continue
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, kinds):
            wanted = " or ".join(type_name(k()) for k in kinds)
            raise BadEvent(f"{event_type}: data.{name} must be {wanted}, not "
                           f"{type_name(value)}")
        if name == "voice" and value is not None:
            for key in _VOICE_FIELDS:
                part = value.get(key)
                if part is not None and not isinstance(part, str):
                    raise BadEvent(f"{event_type}: data.voice.{key} must be a string, not "
                                   f"{type_name(part)}")
