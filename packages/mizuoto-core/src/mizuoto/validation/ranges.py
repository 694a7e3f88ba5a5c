"""Validators for every number a caller can pass: an integer or a finite number in a range.

Requests, engine params, options and training configs use these as attrs validators, so a
value out of range (or NaN, infinite, a bool, a string) raises the given error naming the field
and the allowed range before any model runs. ``None`` is accepted only with ``optional=True``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from pathlib import PurePath

from mizuoto.errors import InvalidRequest


def shown(value, limit: int = 60) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters (a huge int has no
    decimal repr past 4300 digits, a 1 MB string should not fill the terminal)."""
    try:
        text = repr(value)
    except ValueError:
        return f"an integer of {value.bit_length()} bits"
    return text if len(text) <= limit else text[:limit - 1] + "…"


def plain_number(value):
    """An attrs converter: a NumPy (or other registered) integer as ``int`` and real number as
    ``float``, so ``seed=np.int64(3)`` from ``np.arange`` means 3; anything else, bools (NumPy's
    too) and strings included, is left for the validator to refuse."""
    if value is None or type(value) in (bool, int, float):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


def _interval(low: float, high: float, *, low_open: bool = False) -> str:
    return f"{'(' if low_open else '['}{low:g}, {high:g}]"


def integer_in(field: str | None, low: int, high: int, *, optional: bool = False,
               error: type[Exception] = InvalidRequest) -> Callable:
    """An attrs validator: an ``int`` (not a bool) in ``[low, high]``.

    ``field`` names the value in the error; ``None`` uses the attribute's name."""

    def check(instance, attribute, value):
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            name = field or attribute.name
            raise error(name, f"must be an integer in [{low}, {high}], got {shown(value)}")

    return check


def boolean(field: str | None = None, *, prefix: str = "", optional: bool = False,
            error: type[Exception] = InvalidRequest) -> Callable:
    """An attrs validator: ``True`` or ``False`` (not 1, not "yes"). ``field`` names the value
    in the error; ``None`` uses ``prefix`` + the attribute's name (e.g. ``params.``)."""

    def check(instance, attribute, value):
        if value is None and optional:
            return
        if not isinstance(value, bool):
            name = field or prefix + attribute.name
            raise error(name, f"must be true or false, got {value!r}")

    return check


def one_of(choices: tuple, field: str | None = None, *, prefix: str = "",
           optional: bool = False, error: type[Exception] = InvalidRequest) -> Callable:
    """An attrs validator: one of ``choices``, named as `boolean` names it."""

    def check(instance, attribute, value):
        if value is None and optional:
            return
        if value not in choices:
            shown_choices = ", ".join(repr(c) for c in choices)
            raise error(field or prefix + attribute.name,
                        f"must be one of {shown_choices}, got {value!r}")

    return check


def number_at_least(low: float = 0, *, whole: bool = False, prefix: str = "",
                    optional: bool = False, error: type[Exception] = InvalidRequest) -> Callable:
    """An attrs validator: a number (not a bool) ``>= low``; with ``whole`` a whole one, an
    integral float included (``8192.0``, as a YAML recipe may give it). Named as `boolean`
    names it."""

    def check(instance, attribute, value):
        if value is None and optional:
            return
        name = prefix + attribute.name
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low:
            raise error(name, f"must be a number >= {low:g}, got {shown(value)}")
        if whole and value != int(value):
            raise error(name, f"must be a whole number, got {shown(value)}")

    return check


def path_like(*, prefix: str = "", optional: bool = False,
              error: type[Exception] = InvalidRequest) -> Callable:
    """An attrs validator: a path (``str`` or ``Path``). Named as `boolean` names it."""

    def check(instance, attribute, value):
        if not (value is None and optional) and not isinstance(value, (str, PurePath)):
            raise error(prefix + attribute.name, f"must be a path, got {shown(value)}")

    return check


def check_names(field: str, value, allowed: tuple[str, ...], what: str = "names",
                error: type[Exception] = InvalidRequest) -> tuple[str, ...]:
    """``value`` as a tuple: a non-empty list of distinct ``what`` from ``allowed``; else
    ``error(field, ...)`` naming the ones it may hold."""
    if (not isinstance(value, (list, tuple)) or not value
            or not all(isinstance(name, str) for name in value)):
        raise error(field, f"must be a non-empty list of {what} from {', '.join(allowed)}; "
                    f"got {shown(value)}")
    unknown = [name for name in value if name not in allowed]
    if unknown:
        raise error(field, f"unknown {what} {unknown}; known: {', '.join(allowed)}")
    twice = sorted({name for name in value if value.count(name) > 1})
    if twice:
        raise error(field, f"lists {twice} twice: {list(value)}")
    return tuple(value)


def number_in(field: str | None, low: float, high: float, *, low_open: bool = False,
              optional: bool = False, error: type[Exception] = InvalidRequest) -> Callable:
    """An attrs validator: a finite ``int`` or ``float`` (not a bool) in ``[low, high]``, or
    ``(low, high]`` with ``low_open``. ``field`` names the value; ``None`` uses the attribute's
    name."""

    def check(instance, attribute, value):
        if value is None and optional:
            return
        name = field or attribute.name
        check_number(name, value, low, high, low_open=low_open, error=error)

    return check


def check_number(field: str, value, low: float, high: float, *, low_open: bool = False,
                 error: type[Exception] = InvalidRequest) -> None:
    """Raise ``error(field, ...)`` unless ``value`` is a finite number in the range."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            ok = False
        else:
            ok = math.isfinite(number) and (low < number if low_open else low <= number) \
                and number <= high
    if not ok:
        raise error(field, f"must be a finite number in {_interval(low, high, low_open=low_open)}"
                    f", got {shown(value)}")
