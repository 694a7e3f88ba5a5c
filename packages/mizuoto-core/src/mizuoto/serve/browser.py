"""What a web page in the user's browser can make the server do: nothing, unless it is the
server's own page (the class of Ollama's and Jupyter's DNS-rebinding advisories).

- **Host**: a request whose ``Host`` is not a name this server answers for is refused (403,
  ``host_not_allowed``) on every route. A rebinding page reaches 127.0.0.1 under its own
  name (``evil.example``), so its requests carry that name. Answered: loopback addresses,
  ``localhost``, the ``--host`` value (bound to every interface: any IP address), and the
  names given with ``--allowed-host`` (a reverse proxy's public name; ``*``: any).
- **Origin**: a request that changes state or speaks (any method but GET, HEAD and OPTIONS)
  from a foreign ``Origin`` is refused (403, ``origin_not_allowed``). The page's own origin
  (the ``Host`` it was sent to) and requests without ``Origin`` (the SDK, curl) pass, as do
  the origins given with ``--allowed-origin``.
- **Content type**: a route reading JSON refuses anything but ``application/json`` (415,
  ``unsupported_media_type``), a missing type included: ``text/plain`` is what a cross-site
  form sends without a CORS preflight. The voice upload requires ``multipart/form-data``.
- **One of each**: a ``Host``, ``Origin`` or ``Content-Type`` given twice is refused (400,
  ``duplicate_header``): a proxy that checked the first must not let the server act on
  another. A ``Host`` that is not a name or address with an optional port
  (``localhost:8000@evil.example``) is refused as a foreign one.
"""

from __future__ import annotations

import ipaddress
import re

from mizuoto.serve.errors import APIError

#: Media type each (method, path) requires; other routes read no body.
CONTENT_TYPES = {("POST", "/v1/audio/speech"): "application/json",
                 ("POST", "/v1/audio/voices"): "multipart/form-data"}
#: Methods a browser may send cross-site that change nothing here.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})
#: Headers a request may hold once: each decides whether it is refused.
SINGLE_HEADERS = (b"host", b"origin", b"content-type")
# RFC 9110's Host: a registered name or an IP literal, then an optional port; no user info
_HOST_SYNTAX = re.compile(r"(?:\[[0-9a-f:.]+\]|[a-z0-9._~-]+)(?::[0-9]{1,5})?", re.I)


def _split_host(value: str) -> str:
    """The name of a ``Host`` value (or an origin's authority) without its port, lower case,
    an IPv6 address without its brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class BrowserPolicy:
    """The Host, Origin and content-type rules for a server bound to ``host``;
    ``allowed_hosts`` and ``allowed_origins`` are the operator's additions."""

    def __init__(self, host: str = "127.0.0.1", allowed_hosts=(), allowed_origins=()) -> None:
        self._any_host = "*" in allowed_hosts
        self._any_ip = host.strip() in _WILDCARDS  # every interface: its addresses are names
        self._hosts = {"localhost", _split_host(host)} | {
            _split_host(name) for name in allowed_hosts if name != "*"}
        self._any_origin = "*" in allowed_origins
        self._origins = {origin.strip().lower().rstrip("/") for origin in allowed_origins}

    def host_allowed(self, host: str | None) -> bool:
        if self._any_host:
            return True
        if not host or not _HOST_SYNTAX.fullmatch(host.strip()):
            return False  # every browser sends Host (HTTP/1.1 requires it), as a name
        name = _split_host(host)
        if name in self._hosts:
            return True
        if _is_ip(name):
            return self._any_ip or ipaddress.ip_address(name).is_loopback
        return False

    def origin_allowed(self, origin: str | None, host: str | None) -> bool:
        if origin is None:
            return True  # not a browser's cross-site request: the SDK, curl, a proxy's probe
        origin = origin.strip().lower().rstrip("/")
        if self._any_origin or origin in self._origins:
            return True
        scheme, sep, authority = origin.partition("://")
        if not sep or scheme not in ("http", "https") or host is None:
            return False  # "null" (a sandboxed frame, a file), or another scheme
        # the page's own origin: the authority its requests are sent to (the scheme may
        # differ behind a TLS proxy); a default port may be left out of either
        default = "443" if scheme == "https" else "80"
        return _with_port(authority, default) in (_with_port(host.strip().lower(), "80"),
                                                  _with_port(host.strip().lower(), "443"),
                                                  _with_port(host.strip().lower(), default))

    def refusal(self, method: str, path: str, headers: list[tuple[bytes, bytes]]
                ) -> APIError | None:
        """Why this request is refused, or None."""
        for name in SINGLE_HEADERS:
            if sum(key.lower() == name for key, _ in headers) > 1:
                header = name.decode().title()
                return APIError(400, f"the {header} header is given more than once: send "
                                "it once", param=header, code="duplicate_header")
        host = _header(headers, b"host")
        if not self.host_allowed(host):
            name = host or "(none)"
            return APIError(403, f"the Host header {name!r} is not a name this server answers "
                            "for (127.0.0.1, localhost, [::1], --host): a web page may be "
                            "trying to reach it; behind a reverse proxy, start the server "
                            f"with --allowed-host {_split_host(name) or 'NAME'}",
                            code="host_not_allowed")
        if method in SAFE_METHODS:
            return None
        origin = _header(headers, b"origin")
        if not self.origin_allowed(origin, host):
            return APIError(403, f"requests from the web page at {origin!r} are refused: only "
                            "this server's own page may change state or speak; to allow "
                            f"that origin, start the server with --allowed-origin {origin}",
                            code="origin_not_allowed")
        wanted = CONTENT_TYPES.get((method, path))
        if wanted is not None:
            given = _header(headers, b"content-type")
            media = (given or "").split(";", 1)[0].strip().lower()
            if media != wanted:
                said = f"Content-Type {given!r}" if given else "no Content-Type"
                return APIError(415, f"{method} {path} takes {wanted}, not {said}: send "
                                f"Content-Type: {wanted}", code="unsupported_media_type")
        return None


def _with_port(authority: str, default: str) -> str:
    name = _split_host(authority)
    rest = authority[authority.find("]") + 1:] if authority.startswith("[") else (
        authority[len(name):] if authority.count(":") == 1 else "")
    port = rest.removeprefix(":") or default
    return f"{name}:{port}"


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None
