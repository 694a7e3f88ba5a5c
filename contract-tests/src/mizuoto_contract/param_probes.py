"""The values the suite tries for each request param an engine declares, by the param's type and
the range or choices its params class accepts.

- a switch (``bool``): flipped;
- a choice (a ``Literal[...]``, an ``Enum``, an attrs ``in_`` validator, or a string whose
  refusal lists the values it accepts): every declared value other than the fixture's;
- an ``int``: the smallest and the largest of ``0, 1, 2, base/4, base/2, base*2, base*4,
  base+8`` that the params class accepts (values far apart: ``top_k`` 1 and 200, not 49 and 51);
- a ``float``: the smallest and the largest accepted of ``base*0.25, base*0.5, base*2,
  base*4`` (from ``0.5, 1, 2, -0.5`` where the base is 0 or None);
- anything else (a tuple, a path): not probed.

"Accepted" is asked of the engine's own validation (``Engine.parse_params``), before any
synthesis: a value outside the declared range is never sent.
"""

from __future__ import annotations

import enum
import re
import types
import typing
from typing import Any

import attrs

from mizuoto.errors import InvalidRequest

#: the most declared values of a choice that are tried
MAX_CHOICES = 8
_SENTINEL = "\x00mizuoto-probe"


def probe_values(engine, field: attrs.Attribute, params: dict[str, Any]) -> list:
    """The values to try for ``field`` (see the module), given the fixture's ``params``."""
    base = params.get(field.name, field.default)
    if isinstance(base, attrs.Factory):  # type: ignore[arg-type]
        return []
    kind = _kind(engine.params_class, field)
    if kind is bool or isinstance(base, bool):
        return [not base] if isinstance(base, bool) else [True, False]
    choices = _choices(engine, field, params, kind)
    if choices is not None:
        return [value for value in choices if value != base][:MAX_CHOICES]
    if kind is int or (kind is None and isinstance(base, int)):
        number = base if isinstance(base, int) else 0
        candidates = [0, 1, 2, number // 4, number // 2, number * 2, number * 4, number + 8]
    elif kind is float or (kind is None and isinstance(base, float)):
        number = float(base) if isinstance(base, (int, float)) else 0.0
        candidates = ([number * 0.25, number * 0.5, number * 2, number * 4] if number
                      else [0.5, 1.0, 2.0, -0.5])
    else:
        return []
    accepted = sorted({v for v in candidates if v != base and _accepts(engine, field, params, v)})
    return [accepted[0], accepted[-1]] if len(accepted) > 1 else accepted


def _kind(params_class: type, field: attrs.Attribute) -> Any:
    """``bool``, ``int``, ``float``, ``str``, a ``Literal`` / ``Enum`` type, or None."""
    try:
        hint = typing.get_type_hints(params_class).get(field.name, field.type)
    except Exception:  # an annotation that does not resolve: read it as written
        hint = field.type
    if isinstance(hint, str):
        for name, kind in (("Literal[", "literal"), ("bool", bool), ("int", int),
                           ("float", float), ("str", str)):
            if name in hint:
                return kind
        return None
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Literal:
        return hint
    if args and typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = args[0]
    return hint if hint in (bool, int, float, str) or isinstance(hint, type) else None


def _choices(engine, field: attrs.Attribute, params: dict, kind: Any) -> list | None:
    """The declared values of a choice, or None for a param that is not one."""
    if typing.get_origin(kind) is typing.Literal:
        return list(typing.get_args(kind))
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return list(kind)
    options = getattr(field.validator, "options", None)  # attrs.validators.in_
    if options is not None:
        return list(options)
    if kind in ("literal", str):
        # a validator that lists what it accepts, as mizuoto's one_of does: ask it
        try:
            _parse(engine, {**params, field.name: _SENTINEL})
        except InvalidRequest as exc:
            listed = [v for v in re.findall(r"'([^']*)'", str(exc)) if v != _SENTINEL]
            accepted = [v for v in dict.fromkeys(listed) if _accepts(engine, field, params, v)]
            return accepted or None
        return None
    return None


def _accepts(engine, field: attrs.Attribute, params: dict, value) -> bool:
    try:
        _parse(engine, {**params, field.name: value})
    except InvalidRequest:
        return False
    except (TypeError, ValueError):  # a params class without mizuoto's validators
        return False
    return True


def _parse(engine, params: dict) -> None:
    parse = getattr(engine, "parse_params", None)
    if parse is not None:
        parse(params)
    else:
        engine.params_class(**params)
