"""What one client may have the server working on at once, counted in what it costs:
characters of text (``input`` and ``instructions``), not requests or bytes. A client is its
API key when the server has one (every caller with the key shares its budget), else its
address. Past its budget a request gets 429 (``client_busy``) with ``Retry-After``, before
it is queued: one client cannot fill every model's queue with the longest texts while
others wait."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable

from mizuoto.serve.errors import APIError


class ClientBudget:
    """Characters in flight per client, at most ``limit`` each (thread-safe: a job releases
    its share on the worker's thread when it ends)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._used: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, client: str, cost: int) -> Callable[[], None]:
        """Hold ``cost`` characters for ``client`` (a 429 when they do not fit); returns
        what gives them back (once; later calls do nothing)."""
        with self._lock:
            used = self._used.get(client, 0)
            if used and used + cost > self.limit:
                raise APIError(429, f"this client has {used:,} characters of text being "
                               f"spoken, and this request's {cost:,} would pass the "
                               f"{self.limit:,} one client may have at once: wait for an "
                               "answer first", type="rate_limit_error", code="client_busy",
                               headers={"Retry-After": "1"})
            self._used[client] = used + cost
        given_back = threading.Event()

        def give_back() -> None:
            if given_back.is_set():
                return
            given_back.set()
            with self._lock:
                left = self._used.get(client, 0) - cost
                if left > 0:
                    self._used[client] = left
                else:
                    self._used.pop(client, None)

        return give_back

    def in_flight(self, client: str) -> int:
        with self._lock:
            return self._used.get(client, 0)


def client_of(headers: list[tuple[bytes, bytes]], address: str | None) -> str:
    """Who a request counts against: its bearer token (hashed: never kept in memory as
    sent), else its address."""
    for name, value in headers:
        if name.lower() == b"authorization":
            return "key:" + hashlib.sha256(value.strip()).hexdigest()[:32]
    return f"address:{address or '?'}"
