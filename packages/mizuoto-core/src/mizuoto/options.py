"""Options: ``compute.*`` for every engine and ``engines.<name>.*`` for one.

Settable from Python (:meth:`Options.from_mapping`), the CLI (``--option compute.device=cpu``)
and a TOML file (:meth:`Options.from_toml`). Unknown keys and bad values raise
:class:`~mizuoto.errors.InvalidOption` naming the key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from mizuoto.errors import InvalidOption, InvalidRequest
from mizuoto.key_values import parse_pairs
from mizuoto.settings_files import name_some
from mizuoto.validation import parse_attrs
from mizuoto.validation.ranges import integer_in, shown

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "float16", "bfloat16")
# exact: the arithmetic of upstream (on GPU the whole static cache, as upstream attends);
# fast: attend to the filled part of the cache only (or FlashAttention), not bit-identical
ATTENTION = ("exact", "fast")
ALLOCATORS = ("default", "jemalloc", "tcmalloc")
WAIT_POLICIES = ("auto", "passive", "active")
PREPACK_MODES = ("auto", "off")
MAX_CPU_THREADS = 1024
MAX_DEVICE_INDEX = 1023


def _choice(key: str, choices: tuple[str, ...], *, index_ok: bool = False):
    def check(instance, attribute, value):
        if isinstance(value, str) and value in choices:
            return
        if index_ok and isinstance(value, str) and _device_index(value, choices):
            return
        raise InvalidOption(key, f"must be one of {', '.join(choices)}, got {shown(value)}")

    return check


def _device_index(value: str, choices: tuple[str, ...]) -> bool:
    """``cuda:1``: a device type and a device index."""
    kind, _, index = value.partition(":")
    return kind in choices and kind != "auto" and index.isascii() and index.isdigit() \
        and int(index) <= MAX_DEVICE_INDEX


def _bool(key: str):
    def check(instance, attribute, value):
        if not isinstance(value, bool):
            raise InvalidOption(key, f"must be true or false, got {shown(value)}")

    return check


_threads = integer_in("compute.cpu_threads", 1, MAX_CPU_THREADS, optional=True,
                      error=InvalidOption)


@attrs.frozen
class ComputeOptions:
    """Where and how models run. ``auto`` lets each engine choose as its upstream does."""

    device: str = attrs.field(default="auto", validator=_choice("compute.device", DEVICES,
                                                                index_ok=True))
    dtype: str = attrs.field(default="auto", validator=_choice("compute.dtype", DTYPES))
    compile: bool = attrs.field(default=False, validator=_bool("compute.compile"))
    oom_fallback: bool = attrs.field(default=True, validator=_bool("compute.oom_fallback"))
    cpu_threads: int | None = attrs.field(default=None, validator=_threads)
    cpu_allocator: str = attrs.field(default="default",
                                     validator=_choice("compute.cpu_allocator", ALLOCATORS))
    # bind torch's threads to cores (OMP_PROC_BIND=close, OMP_PLACES=cores at process start)
    cpu_pinning: bool = attrs.field(default=False, validator=_bool("compute.cpu_pinning"))
    # how idle OpenMP threads wait (OMP_WAIT_POLICY, read when torch is imported): "auto" is
    # passive in the mizuoto command and server unless the user set OMP_WAIT_POLICY, and
    # whatever the process started with elsewhere
    cpu_wait_policy: str = attrs.field(default="auto", validator=_choice("compute.cpu_wait_policy",
                                                                         WAIT_POLICIES))
    attention: str = attrs.field(default="exact",
                                 validator=_choice("compute.attention", ATTENTION))
    cuda_graphs: bool = attrs.field(default=False, validator=_bool("compute.cuda_graphs"))
    # linear weights packed once for the CPU's matrix kernel, used only where that gives
    # F.linear's bits (proven per layer, row count and thread count: mizuoto.runtime.prepack)
    prepack: str = attrs.field(default="auto", validator=_choice("compute.prepack",
                                                                 PREPACK_MODES))


@attrs.frozen
class Options:
    compute: ComputeOptions = attrs.field(factory=ComputeOptions)
    engines: Mapping[str, Mapping[str, Any]] = attrs.field(
        factory=dict,
        converter=lambda v: MappingProxyType({k: MappingProxyType(dict(x)) for k, x in v.items()}),
    )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Options:
        """Build from nested (``{"compute": {"device": "cpu"}}``) or dotted keys."""
        nested = _nest(values)
        unknown = set(nested) - {"compute", "engines"}
        if unknown:
            raise InvalidOption(sorted(unknown)[0], "is not an option section (compute, engines)")
        compute = nested.get("compute", {})
        if not isinstance(compute, Mapping):
            raise InvalidOption("compute", "must be a table of options, e.g. compute.device=cpu")
        known = {a.name for a in attrs.fields(ComputeOptions)}
        for key in compute:
            if key not in known:
                raise InvalidOption(f"compute.{key}", f"is not an option; known: {name_some(known)}")
        engines = nested.get("engines", {})
        if not isinstance(engines, Mapping):
            raise InvalidOption("engines", "must be a table of engine sections, "
                                "e.g. engines.f5tts.<option>=...")
        for name, section in engines.items():
            if not isinstance(section, Mapping):
                raise InvalidOption(f"engines.{name}", "must be a table of options")
        # engines.<name> sections are checked by each engine's options class when that engine
        # loads (or by mizuoto.registry.validate_engine_options): parsing options imports no
        # plugin
        return cls(ComputeOptions(**compute), engines)

    @classmethod
    def from_toml(cls, path: str | Path) -> Options:
        from mizuoto.settings_files import SettingsFileError, parse_settings

        path = Path(path)
        try:
            data = parse_settings(path.read_text(encoding="utf-8"), "toml", str(path))
        except (OSError, UnicodeDecodeError, SettingsFileError) as exc:
            raise InvalidOption(str(path), f"cannot read options file: {exc}") from None
        return cls.from_mapping(data)

    def with_overrides(self, pairs: Iterable[str]) -> Options:
        """Apply ``key=value`` strings (values parsed as TOML scalars, else taken as text)."""
        merged = _flatten({"compute": attrs.asdict(self.compute),
                           "engines": {k: dict(v) for k, v in self.engines.items()}})
        merged.update(parse_pairs(pairs, lambda pair: InvalidOption(
            pair, "must be written key=value")))
        return Options.from_mapping(merged)

    def engine(self, name: str) -> Mapping[str, Any]:
        return self.engines.get(name, MappingProxyType({}))

    def engine_options(self, engine_cls) -> Any:
        """The ``engines.<name>`` section parsed into the engine's ``options_class``."""
        try:
            return parse_attrs(engine_cls.options_class, self.engine(engine_cls.name),
                               f"engines.{engine_cls.name}")
        except InvalidRequest as exc:
            problem = f"{exc.problem} ({exc.fix})" if exc.fix else exc.problem
            raise InvalidOption(exc.field, problem) from exc


def _nest(values: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in values.items():
        if not isinstance(key, str):
            raise InvalidOption(shown(key), "option names are strings, e.g. compute.device")
        parts = key.split(".")
        target = nested
        for part in parts[:-1]:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise InvalidOption(key, "conflicts with another key")
        if isinstance(value, Mapping):
            value = _nest(value)
            existing = target.get(parts[-1])
            if isinstance(existing, dict):
                existing.update(value)
                continue
        target[parts[-1]] = value
    return nested


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        elif not isinstance(value, Mapping):
            flat[f"{prefix}{key}"] = value
    return flat
