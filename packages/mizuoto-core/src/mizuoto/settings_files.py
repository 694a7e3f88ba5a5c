"""Reading settings files someone else wrote (TOML, YAML, JSON) without letting them cost much.

A downloaded recipe, options file or ``mizuoto-defaults.json`` is hostile input: a YAML alias
bomb expands a few hundred bytes into gigabytes, 20,000 nested brackets end in a
``RecursionError`` traceback, a 10,000-digit integer in a ``ValueError``. `parse_settings`
bounds all three and raises `SettingsFileError` (a ``ValueError``) naming the file and the
problem; each caller turns it into its own named error (``--config``, an option, the model
folder's file). `name_some` lists unknown keys without printing 300,000 of them.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from typing import Any

from mizuoto.json_files import JSONFileError, parse_json

#: containers nested deeper than this are refused (real recipes nest 3 or 4 levels)
MAX_DEPTH = 32
#: values counted over the whole file, aliases counted once per use: bounds an alias bomb
MAX_VALUES = 100_000
#: YAML alias uses (``*name``) allowed in one file
MAX_ALIASES = 64
#: integers beyond 64 bits are no step count, seed or size anyone means
MAX_INT = 2**63 - 1


class SettingsFileError(ValueError):
    """A settings file refused before its content is used; ``str`` names the file."""


def parse_settings(text: str, kind: str, source: str) -> Any:
    """The data of ``text`` read as ``kind`` (``"toml"``, ``"yaml"`` or ``"json"``), bounded
    in depth, size, aliases and integers; ``source`` names the file in errors."""
    try:
        if kind == "toml":
            data = tomllib.loads(text)
        elif kind == "json":  # a key given twice refused, a BOM skipped
            data = parse_json(text, source, expect=None)
        elif kind == "yaml":
            data = _load_yaml(text, source)
        else:
            raise ValueError(f"unknown settings kind {kind!r}")
    except RecursionError:
        raise SettingsFileError(f"{source} nests deeper than {MAX_DEPTH} levels") from None
    except SettingsFileError:
        raise
    except JSONFileError as exc:
        raise SettingsFileError(str(exc)) from None
    except ValueError as exc:  # TOMLDecodeError, JSONDecodeError, int digit limit
        raise SettingsFileError(f"{source} is not valid {kind.upper()}: {exc}") from None
    check_settings(data, source)
    return data


def check_settings(data: Any, source: str) -> None:
    """Refuse data nested deeper than `MAX_DEPTH`, larger than `MAX_VALUES` (shared YAML
    nodes counted at each use) or holding integers beyond `MAX_INT`; iterative, so depth
    itself cannot overflow the stack."""
    stack: list[tuple[Any, int, str]] = [(data, 0, "")]
    seen = 0
    while stack:
        value, depth, where = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise SettingsFileError(f"{source} holds more than {MAX_VALUES:,} values (a YAML "
                                    "alias bomb or a generated file); refused")
        if depth > MAX_DEPTH:
            raise SettingsFileError(f"{source} nests deeper than {MAX_DEPTH} levels at "
                                    f"{where[:80] or 'the top'}")
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and abs(value) > MAX_INT:
            raise SettingsFileError(f"{source}: {where or 'value'} is an integer beyond 64 bits")
        if isinstance(value, Mapping):
            stack.extend((v, depth + 1, f"{where}.{k}" if where else str(k))
                         for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((v, depth + 1, f"{where}[{i}]") for i, v in enumerate(value))


def name_some(names: Iterable[Any], limit: int = 8) -> str:
    """``"a, b, c"``, or the first ``limit`` names and how many more: an error about 300,000
    unknown keys stays one line."""
    names = sorted(map(str, names))
    shown = ", ".join(name[:60] for name in names[:limit])
    rest = len(names) - limit
    return f"{shown} and {rest:,} more" if rest > 0 else shown


def _load_yaml(text: str, source: str) -> Any:
    import yaml

    class _BoundedLoader(yaml.SafeLoader):
        aliases = 0

        def construct_mapping(self, node, deep=False):
            # a key given twice: YAML keeps the last silently; which one did the author mean?
            keys = [self.construct_object(key, deep=True) for key, _ in node.value
                    if key.tag != "tag:yaml.org,2002:merge"]  # "<<: *base" may override
            seen: set = set()
            twice = next((k for k in keys if isinstance(k, str | int)
                          and (k in seen or seen.add(k))), None)
            if twice is not None:
                raise SettingsFileError(f"{source}: the key {str(twice)[:80]!r} is given twice "
                                        "in one mapping")
            return super().construct_mapping(node, deep=deep)

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_ALIASES:
                    raise SettingsFileError(f"{source} uses more than {MAX_ALIASES} YAML "
                                            "aliases; refused (an alias bomb?)")
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader subclass: no python tags
    except yaml.YAMLError as exc:
        raise SettingsFileError(f"{source} is not valid YAML: {exc}") from None
