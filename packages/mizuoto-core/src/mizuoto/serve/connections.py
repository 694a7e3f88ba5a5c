"""HTTP connections that cannot be held open for free: uvicorn's HTTP/1.1 protocol with a
deadline on request headers, and 431 for headers that never end.

uvicorn closes a keep-alive connection that stays idle *between* requests, but a connection
that sends nothing, or trickles a header line every few seconds, is held until the client
leaves: 400 such sockets hold 400 descriptors, and past the process's descriptor limit every
other client (``/health`` included) is refused. Here a request's headers must be complete
within ``header_timeout`` seconds of its first byte (of the connection, for the first
request): a connection that sent nothing is closed, one that sent part of a request gets a
408. Headers longer than h11's buffer get 431 (uvicorn answers 400 to any protocol error),
and other protocol errors a JSON 400 naming h11's reason (a second ``Host``...).
"""

from __future__ import annotations

import asyncio
import json
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("mizuoto.serve")


def guarded_protocol(header_timeout: float) -> type[H11Protocol]:
    """The protocol class to give ``uvicorn.Config(http=...)``."""
    return type("GuardedH11Protocol", (_GuardedH11Protocol,),
                {"header_timeout": header_timeout})


class _GuardedH11Protocol(H11Protocol):
    header_timeout = 10.0  # guarded_protocol's

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._received_any = False
        self._error_status, self._error = 400, ""
        next_event = self.conn.next_event

        def remembering_next_event():  # h11's hint (431) is lost by uvicorn's handler
            try:
                return next_event()
            except h11.RemoteProtocolError as exc:
                self._error_status, self._error = exc.error_status_hint, str(exc)
                raise

        self.conn.next_event = remembering_next_event

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm_header_deadline()

    def connection_lost(self, exc) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._received_any = True
        if self._header_deadline is None and self.conn.their_state is h11.IDLE:
            self._arm_header_deadline()  # the next request on a keep-alive connection
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # its headers are in
            self._disarm_header_deadline()

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:
            self._disarm_header_deadline()

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self) -> None:
        self._header_deadline = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a response is under way (the gate's own timeouts cover its body)
        if self._received_any:
            self._respond(408, "request_timeout", f"the request's headers did not come "
                          f"within {self.header_timeout:g} s")
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        if self._error_status == 431:
            self._respond(431, "request_header_fields_too_large", "the request's headers "
                          "are too large: send fewer or shorter headers")
            self.transport.close()
            return
        # h11's reason (a second Host, a bad header line), as this server's errors are shaped
        self._respond(400, "invalid_http", f"not a valid HTTP request: {self._error[:200]}")
        self.transport.close()

    def _respond(self, status: int, code: str, message: str) -> None:
        """Written as bytes: h11 has no request to answer (its headers never came whole)."""
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                     "param": None, "code": code}}).encode()
        reason = {400: "Bad Request", 408: "Request Timeout",
                  431: "Request Header Fields Too Large"}[status]
        self.transport.write(f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json"
                             f"\r\nconnection: close\r\ncontent-length: {len(body)}\r\n\r\n"
                             .encode() + body)
        log.info("HTTP %d: %s", status, message)
