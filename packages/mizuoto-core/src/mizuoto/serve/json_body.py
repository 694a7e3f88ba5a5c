"""Request bodies as JSON, refused with a 400 (``invalid_json``) when a parser could be made to
misbehave or two readers could disagree on them:

- nesting deeper than :data:`MAX_JSON_DEPTH` (Python's parser raises ``RecursionError`` near
  a thousand levels; pydantic and ``repr`` recurse too);
- integer literals over Python's 4300 digits (a ``ValueError`` in ``int()``);
- a key given twice in one object (``json`` keeps the last, other readers the first: a proxy
  that checked one value must not let the server act on another);
- lone surrogates (``"\\ud800"``): not text, and no UTF-8 encoder takes them (an error
  message echoing one could not even be sent).
"""

from __future__ import annotations

import json

from mizuoto.serve.errors import APIError, bad_request

#: Deepest nesting of a JSON body (a speech request needs 4: body, mizuoto, params, a list).
MAX_JSON_DEPTH = 32


class _Refused(ValueError):
    """Raised from the parser's hooks: the body is refused with this message."""


def _object(pairs: list[tuple[str, object]]) -> dict:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise _Refused(f"the key {twice!r} is given twice in one object")
    return value


def parse_json(body: bytes) -> object:
    """``body`` parsed, or an :class:`APIError` (400, ``invalid_json``) saying what is wrong."""
    try:
        value = json.loads(body, object_pairs_hook=_object)
    except RecursionError:
        raise _invalid(f"the JSON body is nested more than {MAX_JSON_DEPTH} levels deep") \
            from None
    except _Refused as exc:
        raise _invalid(f"the JSON body is refused: {exc}") from None
    except (ValueError, UnicodeDecodeError):  # huge integer literals are ValueErrors too
        raise _invalid("the body is not valid JSON") from None
    _check(value)
    return value


def _invalid(message: str) -> APIError:
    return bad_request(message, code="invalid_json")


def _check(value) -> None:
    """Depth and lone surrogates, walked without recursion (any depth is safe to walk)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _text(item)
            continue
        if not isinstance(item, (list, dict)):
            continue
        if depth > MAX_JSON_DEPTH:
            raise _invalid(f"the JSON body is nested more than {MAX_JSON_DEPTH} levels deep")
        if isinstance(item, dict):
            for key, child in item.items():
                _text(key)
                stack.append((child, depth + 1))
        else:
            stack.extend((child, depth + 1) for child in item)


def _text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _invalid(f"the JSON body holds a lone surrogate (U+{ord(text[exc.start]):04X}): "
                       "not text; send UTF-8") from None
