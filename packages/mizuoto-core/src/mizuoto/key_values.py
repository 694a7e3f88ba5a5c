"""``KEY=VALUE`` pairs as a command line writes them (``--option``, ``--param``, a training
recipe's ``--param``): one parser for all of them. A value is read as a TOML value (``3``,
``1e-4``, ``true``, ``["q_proj"]``, ``"quoted text"``), else taken as the text itself
(``cpu``, ``fast``).

Below every other layer: it imports only the standard library, so options, requests and
recipes can all use it.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable
from typing import Any


def parse_value(text: str) -> Any:
    """``text`` as a TOML value, else the text itself."""
    try:
        table = tomllib.loads(f"value = {text}")
    except tomllib.TOMLDecodeError:
        return text
    # a "value" with a line break could set other keys too ("1\nother = 2"): that is text
    return table["value"] if len(table) == 1 else text


def parse_pairs(pairs: Iterable[str], malformed: Callable[[str], Exception]) -> dict[str, Any]:
    """``{key: value}`` of ``KEY=VALUE`` strings, white space around the key and the value
    dropped and each value read by :func:`parse_value` (a later key wins); a pair without ``=``
    or without a key raises ``malformed(pair)``, the caller's error naming its flag."""
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, equals, raw = pair.partition("=")
        key = key.strip()
        if not equals or not key:
            raise malformed(pair)
        parsed[key] = parse_value(raw.strip())
    return parsed
