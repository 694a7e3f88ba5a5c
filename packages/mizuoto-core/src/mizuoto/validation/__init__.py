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
        if values:
            raise InvalidRequest(f"{prefix}.{next(iter(values))}", "is not a known setting")
        return None
    known = {a.name for a in attrs.fields(cls)}
    for key in values:
        if key not in known:
            raise InvalidRequest(f"{prefix}.{key}", "is not a known setting",
                                 f"known: {', '.join(sorted(known))}")
    try:
        return cls(**values)
    except InvalidRequest:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        # a validator or a converter (converter=int on inf raises OverflowError) refused a
        # value: name the field as <prefix>.<name> so that the caller knows which one to fix
        raise InvalidRequest(_failing_field(cls, values, prefix, str(exc)), str(exc)) from exc


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
