"""``mizuoto serve --lora-dir`` in one process: the LoRA exports under the directories, each
served as a model named by its directory (a request names the adapter as its ``model``).

An adapter in the core format (peft's files: ``mizuoto train --method lora``) is served on the
model its config names as its base, which must be served too: the base model's worker loads
every adapter of it once, checked (another base, other shapes: refused by name, the model then
fails to load), and keeps them in memory on the one loaded model
(:meth:`~mizuoto.adapters.AdapterHost.load_adapter`); each job then runs with exactly its
adapter applied (:meth:`~mizuoto.adapters.AdapterHost.set_adapter`, by the worker, between
jobs: requests of one adapter run together, never beside another's). An export in an engine's
own format (VoxCPM's: the base model's files and upstream's LoRA files) is a model directory
of its own, served as a model.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

import attrs

from mizuoto.errors import InvalidRequest


@attrs.frozen
class ServedAdapters:
    """``on_base``: served model name to its adapters (name to directory); ``models``: exports
    served as models of their own (name to directory)."""

    on_base: Mapping[str, Mapping[str, Path]] = MappingProxyType({})
    models: Mapping[str, str] = MappingProxyType({})

    def base_of(self) -> dict[str, str]:
        """Adapter name to the name of the model it is served on."""
        return {adapter: base for base, adapters in self.on_base.items() for adapter in adapters}


def _same_model(served: str, base: str) -> bool:
    """Whether ``served`` (a ``-m`` value) is ``base`` (an adapter's base model): the same
    catalog id, or the same directory."""
    if served == base:
        return True
    served_path, base_path = Path(served).expanduser(), Path(base).expanduser()
    return served_path.is_dir() and base_path.is_dir() and \
        served_path.resolve() == base_path.resolve()


def served_adapters(lora_dirs: Iterable[str | Path], models: Mapping[str, str]
                    ) -> ServedAdapters:
    """The exports under ``lora_dirs`` (found by the formats installed engines declare),
    each assigned to the served model (of ``models``, name to ``-m`` value) it adapts. An
    export named like a model, or a core-format adapter whose base is not served, is refused
    by name (``lora_dirs``)."""
    lora_dirs = tuple(lora_dirs)
    if not lora_dirs:
        return ServedAdapters()
    from mizuoto.adapter_files import PEFT_FORMAT, adapter_base
    from mizuoto.adapters import engine_adapter_formats, find_adapters

    on_base: dict[str, dict[str, Path]] = {}
    own: dict[str, str] = {}
    for name, path in find_adapters(lora_dirs, engine_adapter_formats()).items():
        if name in models:
            raise InvalidRequest("lora_dirs", f"a LoRA export and a model are both named "
                                 f"{name!r}", "rename the export's directory, or name the "
                                 "model otherwise with --alias NAME=MODEL")
        base = adapter_base(path) if PEFT_FORMAT.holds(path) else None
        if base is None:  # an engine's own format: a whole model directory (VoxCPM's)
            own[name] = str(path)
            continue
        served = next((n for n, model in models.items() if _same_model(model, base[0])), None)
        if served is None:
            raise InvalidRequest("lora_dirs", f"{path} is an adapter for {base[0]}, which is "
                                 "not served", f"serve its base model too: -m {base[0]}")
        on_base.setdefault(served, {})[name] = path
    return ServedAdapters(MappingProxyType(on_base), MappingProxyType(own))


def load_adapters(engine, name: str, adapters: Mapping[str, Path]) -> None:
    """Load ``adapters`` onto model ``name``'s freshly loaded ``engine``, each checked (by
    :meth:`~mizuoto.adapters.AdapterHost.load_adapter`): the first that does not fit is
    raised, naming it."""
    if not adapters:
        return
    from mizuoto.adapters import AdapterHost

    if not isinstance(engine, AdapterHost):
        raise InvalidRequest("lora_dirs", f"model {name!r} ({getattr(engine, 'name', '?')}) "
                             "cannot hold several LoRA adapters at once",
                             "serve each export as a model of its own (-m EXPORT), or use "
                             "--ray")
    for adapter, path in adapters.items():
        engine.load_adapter(adapter, path)


def holds_adapters(engine) -> bool:
    """Whether ``engine`` holds adapters it selects per request (an ``AdapterHost`` with some
    loaded); asked of the engine's class first, so that a remote engine (``--ray``) is not
    called."""
    # not imported yet: no engine in this process is an AdapterHost (and torch stays unloaded)
    adapters = sys.modules.get("mizuoto.adapters")
    return adapters is not None and isinstance(engine, adapters.AdapterHost) \
        and bool(engine.adapters)
