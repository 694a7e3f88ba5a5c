"""The docs keep up with the code (as datasette's test_docs does).

Every hookspec in :mod:`mizuoto.hookspecs` has a ``### `name(args)` `` heading in
``docs/plugins.md`` with its exact signature, and every name in ``mizuoto.__all__`` is listed
in ``docs/api.md``.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import mizuoto
from mizuoto import hookspecs

DOCS = Path(__file__).resolve().parents[3] / "docs"
_HOOK_HEADING = re.compile(r"^###\s+`(?P<name>\w+)\((?P<args>[^)]*)\)`\s*$", re.MULTILINE)


def _hookspecs() -> dict[str, str]:
    """Each hookspec's name and its signature as written in the docs: ``name(a, b)``."""
    return {
        name: f"{name}({', '.join(inspect.signature(function).parameters)})"
        for name, function in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(function, "mizuoto_spec")
    }


def _documented_hooks() -> dict[str, str]:
    text = (DOCS / "plugins.md").read_text()
    return {m["name"]: f"{m['name']}({m['args']})" for m in _HOOK_HEADING.finditer(text)}


def test_there_are_hookspecs_to_check():
    assert len(_hookspecs()) == 6


@pytest.mark.parametrize("name", sorted(_hookspecs()))
def test_hook_is_documented_with_its_signature(name):
    documented = _documented_hooks()
    signature = _hookspecs()[name]
    assert name in documented, f"docs/plugins.md has no heading ### `{signature}`"
    assert documented[name] == signature, (
        f"docs/plugins.md documents {documented[name]}, but the hookspec is {signature}")


def test_no_documented_hook_is_missing_from_the_code():
    assert set(_documented_hooks()) <= set(_hookspecs())


@pytest.mark.parametrize("name", sorted(mizuoto.__all__))
def test_public_name_is_in_the_api_docs(name):
    text = (DOCS / "api.md").read_text()
    assert re.search(rf"`{re.escape(name)}[`(]", text), f"docs/api.md does not list `{name}`"
