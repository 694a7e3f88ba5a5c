"""A lazy reference to an engine: what listing and option checks need, without importing it.

An engine module imports torch and its model code, which takes seconds. A plugin registers
``EngineRef("hum", "mizuoto_hum.engine:HumEngine", ...)`` instead of the class, so that
``mizuoto plugins``, ``mizuoto models`` and ``import mizuoto`` stay fast; the class is imported
the first time a model is loaded (or :meth:`EngineRef.load` is called).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import attrs

from mizuoto.contracts.capabilities import Capability
from mizuoto.errors import EngineNotFound, MizuotoError

if TYPE_CHECKING:
    from mizuoto.contracts.engine import Engine


def _check_target(instance, attribute, value):
    if value is None:
        return
    module, _, qualname = value.partition(":")
    if not module or not qualname:
        raise MizuotoError(f"EngineRef.{attribute.name} must be written 'module:Class', "
                           f"got {value!r}")


def import_object(target: str):
    """The object a ``"module:attribute"`` path names (``attribute`` may be dotted)."""
    module_name, _, qualname = target.partition(":")
    found = importlib.import_module(module_name)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


@attrs.frozen
class EngineRef:
    """An engine class by location, with the metadata listed before it is imported.

    ``target`` is ``"module:Class"``; ``capabilities`` are what the engine's models can do (a
    model may lack some); ``options`` is ``"module:Class"`` of the engine's ``options_class``
    (``None``: it has none), imported only to check ``engines.<name>.*`` options, so put it in
    a module that does not import torch. :meth:`load` checks that the class matches.
    """

    name: str
    target: str = attrs.field(validator=_check_target)
    capabilities: frozenset[Capability] = attrs.field(default=frozenset(), converter=frozenset)
    options: str | None = attrs.field(default=None, validator=_check_target)
    description: str = ""
    # The class itself, for an engine registered as a class (see :meth:`of`).
    _engine: type[Engine] | None = attrs.field(default=None, init=False, repr=False)

    @classmethod
    def of(cls, engine: type[Engine]) -> EngineRef:
        """The reference of an engine class registered directly (already imported)."""
        options = engine.options_class
        ref = cls(engine.name, f"{engine.__module__}:{engine.__qualname__}",
                  options=None if options is None else
                  f"{options.__module__}:{options.__qualname__}")
        object.__setattr__(ref, "_engine", engine)
        return ref

    @property
    def options_class(self) -> type | None:
        """The ``engines.<name>.*`` options class, imported from :attr:`options`."""
        if self._engine is not None:
            return self._engine.options_class
        return None if self.options is None else import_object(self.options)

    def load(self) -> type[Engine]:
        """Import the engine class (once; Python caches the module)."""
        if self._engine is not None:
            return self._engine
        from mizuoto.contracts.engine import Engine

        try:
            engine = import_object(self.target)
        except (ImportError, AttributeError) as exc:
            raise EngineNotFound(f"engine {self.name!r} could not be imported from "
                                 f"{self.target}: {exc}") from exc
        if not (isinstance(engine, type) and issubclass(engine, Engine)):
            raise MizuotoError(f"engine {self.name!r}: {self.target} is not an Engine subclass")
        if engine.name != self.name:
            raise MizuotoError(f"engine {self.name!r}: {self.target} is named {engine.name!r}")
        if engine.options_class is not self.options_class:
            raise MizuotoError(f"engine {self.name!r}: registered with options={self.options!r} "
                               f"but its options_class is {engine.options_class!r}")
        return engine
