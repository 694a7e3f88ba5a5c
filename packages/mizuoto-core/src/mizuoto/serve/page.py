"""The page at ``GET /``: a studio to listen to the served models (speak, voices, A/B compare,
history), plain HTML, CSS and JavaScript modules (no bundler) shipped in ``mizuoto/serve/web``.

The page holds no data: it is served without the API key, and asks for the key in the
browser when the API refuses a call (every API call carries it). Its content security policy
allows nothing but this server, so the page cannot reach anywhere else.
"""

from __future__ import annotations

import functools
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from mizuoto.serve.errors import not_found, quoted

#: The media type of each kind of file the page is made of.
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
               ".js": "text/javascript; charset=utf-8"}


def _suffix(name: str) -> str:
    return "." + name.rpartition(".")[2]


#: The page's files, as its folder holds them (a module added there is served; nothing else
#: is), with their media types.
FILES = {item.name: MEDIA_TYPES[_suffix(item.name)]
         for item in resources.files("mizuoto.serve").joinpath("web").iterdir()
         if item.is_file() and _suffix(item.name) in MEDIA_TYPES}
#: Where the page's files are served (and served without the API key, with ``/``).
PREFIX = "/web/"

# the waveform and recordings are drawn and played from blob: URLs; nothing leaves the server
POLICY = ("default-src 'self'; img-src 'self' data: blob:; media-src 'self' blob:; "
          "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": POLICY, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}

router = APIRouter()


def is_page_path(path: str) -> bool:
    """Whether ``path`` is the page or one of its files (open without the API key)."""
    return path == "/" or path.startswith(PREFIX)


def page_url(host: str, port: int) -> str:
    """The page's address for ``--host`` and ``--port`` (a wildcard host: this machine)."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return f"http://{host}:{port}/"


@functools.cache
def _content(name: str) -> bytes:
    return resources.files("mizuoto.serve").joinpath("web", name).read_bytes()


def _file(name: str) -> Response:
    return Response(_content(name), media_type=FILES[name], headers=HEADERS)


@router.get("/", include_in_schema=False)
async def index():
    return _file("index.html")


@router.get(PREFIX + "{name}", include_in_schema=False)
async def page_file(name: str):
    if name not in FILES or name == "index.html":
        raise not_found(f"the page has no file {quoted(name)}", None, "not_found")
    return _file(name)
