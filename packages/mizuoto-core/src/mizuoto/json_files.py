"""Reading JSON someone else wrote: a downloaded voice's header, a model's ``config.json`` and
``tokenizer.json``, a training manifest's rows, a recipe, a Wyoming event.

Python's ``json`` lets such text cost much or mean two things: 30,000 nested brackets end in
a ``RecursionError`` traceback (and whatever walks the value next recurses too), a 5,000-digit
integer in a ``ValueError`` or a slow ``int()``, a key given twice silently keeps the last (a
second ``architecture`` loads another model; a second ``audio`` another file), a UTF-8 BOM
is a decode error, and ``[]`` where an object belongs fails later as an ``AttributeError``.
:func:`parse_json` and :func:`read_json` bound all of these and raise :class:`JSONFileError`
(a ``ValueError``) naming the source and the problem; each caller turns it into its own named
error (the voice, the model folder's file, the manifest's line).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from mizuoto.regular_files import NotARegularFile, open_regular

#: containers nested deeper than this are refused (configs, tokenizers and manifests nest
#: 3 to 6 levels)
MAX_DEPTH = 32
#: digits of the longest integer literal: room for the 31 digits of transformers'
#: ``VERY_LARGE_INTEGER`` (``int(1e30)``, the ``model_max_length`` of many a
#: tokenizer_config.json); each reader range-checks its own fields
MAX_INT_DIGITS = 40
#: largest JSON file read whole (a real tokenizer.json is a few MB)
MAX_FILE_BYTES = 256 << 20

_TYPE_NAMES = {dict: "an object", list: "an array", str: "a string", int: "a number",
               float: "a number", bool: "true or false", type(None): "null"}


class JSONFileError(ValueError):
    """JSON refused before its content is used; ``str`` names the source."""


class _Refused(ValueError):
    """Raised from the parser's hooks; :func:`parse_json` adds the source."""


def type_name(value: Any) -> str:
    """What ``value`` is in JSON's words: ``"an array"``, ``"a string"``..."""
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def parse_json(text: str | bytes, source: str, *, expect: type | None = dict,
               allow_duplicate_keys: bool = False, max_int_digits: int = MAX_INT_DIGITS
               ) -> Any:
    """``text`` parsed, bounded in nesting (:data:`MAX_DEPTH`) and integer size
    (:data:`MAX_INT_DIGITS`), a leading UTF-8 BOM skipped, a key given twice in one object
    refused unless ``allow_duplicate_keys`` (then the last wins, as ``json``'s). ``expect`` (default ``dict``; None: any) is the top-level type.
    ``source`` names the text in errors (``"voice.safetensors: texts"``); ``max_int_digits``
    may be raised where a longer integer is the reader's to name (at most Python's 4300)."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise JSONFileError(f"{source} is not UTF-8 text (byte {exc.start})") from None
    text = text.removeprefix("\ufeff")
    pairs = _keep_last if allow_duplicate_keys else _refuse_duplicates
    try:
        value = json.loads(text, object_pairs_hook=pairs,
                           parse_int=functools.partial(_integer, limit=max_int_digits))
    except RecursionError:
        raise JSONFileError(f"{source} nests deeper than {MAX_DEPTH} levels") from None
    except _Refused as exc:
        raise JSONFileError(f"{source}: {exc}") from None
    except ValueError as exc:  # JSONDecodeError
        raise JSONFileError(f"{source} is not valid JSON: {exc}") from None
    _check_depth(value, source)
    if expect is not None and not isinstance(value, expect):
        raise JSONFileError(f"{source} holds {type_name(value)} where {_TYPE_NAMES[expect]} "
                            "belongs")
    return value


def read_json(path: str | Path, source: str | None = None, *, expect: type | None = dict,
              allow_duplicate_keys: bool = False, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """The file at ``path`` parsed as :func:`parse_json` does; a file that is not a regular
    file (:func:`~mizuoto.regular_files.check_regular`) or is larger than ``max_bytes`` is refused
    before it is read. ``source`` names it in errors (default: the path)."""
    path = Path(path)
    source = source or str(path)
    try:
        with open_regular(path, source) as handle:
            data = handle.read(max_bytes + 1)
    except NotARegularFile as exc:
        raise JSONFileError(str(exc)) from None
    if len(data) > max_bytes:
        raise JSONFileError(f"{source} is larger than {max_bytes:,} bytes; refused")
    return parse_json(data, source, expect=expect, allow_duplicate_keys=allow_duplicate_keys)


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise _Refused(f"the key {twice[:80]!r} is given twice in one object (which one is "
                       "meant?)")
    return value


def _keep_last(pairs: list[tuple[str, Any]]) -> dict:
    return dict(pairs)


def _integer(literal: str, limit: int) -> int:
    if len(literal.lstrip("-")) > limit:
        raise _Refused(f"an integer of {len(literal):,} digits ({literal[:12]}...): more "
                       f"than {limit} digits")
    return int(literal)


def _check_depth(value: Any, source: str) -> None:
    """Refuse containers nested deeper than :data:`MAX_DEPTH`; iterative, over containers
    only (a 150,000-entry vocabulary costs one pass over its values)."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise JSONFileError(f"{source} nests deeper than {MAX_DEPTH} levels")
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, (dict, list)))
