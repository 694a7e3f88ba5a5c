"""Parsing attrs settings classes from user mappings, with errors that name the field.

The layer above :mod:`mizuoto.errors` (it imports nothing else of Mizuoto): request params,
engine options and trainer settings are all parsed here, and every number is checked by
:mod:`mizuoto.validation.ranges`, so that contracts, options and plugins can use them without
importing one another.
"""

from __future__ import annotations

from typing import Any

import attrs

from mizuoto.errors import InvalidRequest


def parse_attrs(cls: type | None, values, prefix: str) -> Any:
    """Build the attrs class ``cls`` from a mapping, naming unknown keys and bad values."""
    values = dict(values or {})
    if cls is None:
        check_known_keys(None, values, prefix)
        return None
    check_known_keys(cls, values, prefix)
    try:
        return cls(**values)
    except InvalidRequest:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        # a validator or a converter (converter=int on inf raises OverflowError) refused a
        # value: name the field as <prefix>.<name> so that the caller knows which one to fix
        raise InvalidRequest(_failing_field(cls, values, prefix, str(exc)), str(exc)) from exc


def check_known_keys(cls: type | None, values, prefix: str) -> None:
    """Name the first key of ``values`` that is not a field of the attrs class ``cls`` (every
    key, for ``None``), with the closest field as a suggestion: a mistyped setting fails
    before anything is loaded or parsed."""
    import difflib

    known = {a.name for a in attrs.fields(cls)} if cls is not None else set()
    for key in values or {}:
        if key in known:
            continue
        if not known:
            raise InvalidRequest(f"{prefix}.{key}", "is not a known setting",
                                 "this engine takes none")
        near = difflib.get_close_matches(str(key), sorted(known), 1, 0.6)
        hint = f"did you mean {near[0]}? " if near else ""
        raise InvalidRequest(f"{prefix}.{key}", "is not a known setting",
                             f"{hint}known: {', '.join(sorted(known))}")


def _failing_field(cls: type, values: dict, prefix: str, message: str) -> str:
    """``<prefix>.<name>`` of the value that fails alone (a converter's message does not name
    it; attrs' validators quote it: "'speed' must be > 0"), else ``prefix``."""
    named = [key for key in values if f"'{key}'" in message]
    if len(named) == 1:
        return f"{prefix}.{named[0]}"
    for key, value in values.items():
        try:
            cls(**{key: value})
        except Exception:  # any failure names this key
            return f"{prefix}.{key}"
    return prefix
