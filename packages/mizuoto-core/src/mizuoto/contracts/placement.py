"""Where and how a loaded model runs: the compute options applied at load, in one place.

Every engine's ``load`` did the same steps: set torch's threads, pick the device and the dtype,
warn when the dtype is emulated on this CPU, compile a module when asked, and repeat all of it
in ``ModelInfo`` and in every result's ``applied.compute``. :func:`place` does the first four;
the :class:`Placement` it returns compiles (:meth:`Placement.compile`), builds the
``ModelInfo`` (:meth:`Placement.model_info`), and tells the base class what to report
(``Engine.placement``). It sits beside the engine base class, below it: ``Engine`` holds a
placement, so this module names the engine class only by what it reads (:class:`PlacedEngine`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Protocol

import attrs
import torch

from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.model_info import ModelInfo
from mizuoto.options import ComputeOptions
from mizuoto.runtime.compile import Compilation, compile_module
from mizuoto.runtime.device import (
    AutoDtype,
    default_device,
    dtype_name,
    emulated_dtype_warning,
    select_device,
    select_dtype,
)
from mizuoto.runtime.threads import apply_cpu_threads

log = logging.getLogger(__name__)


class PlacedEngine(Protocol):
    """What a placement reads of the :class:`~mizuoto.contracts.engine.Engine` subclass it
    places."""

    name: ClassVar[str]
    compute_options: ClassVar[frozenset[str]]


def _frozen(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@attrs.frozen
class Placement:
    """What load applied: device, dtype, warnings to repeat in every result, the modules it
    compiled, and the engine's own compute settings in effect (``settings``)."""

    engine: type[PlacedEngine]
    device: torch.device
    dtype: torch.dtype
    oom_fallback: bool = True
    compile_requested: bool = False
    warnings: tuple[str, ...] = ()
    compilations: tuple[Compilation, ...] = ()
    settings: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen)

    def compile(self, module: torch.nn.Module, **compile_kwargs: Any) -> Placement:
        """Compile ``module`` in place when ``compute.compile`` asked for it (falling back to
        eager, said in ``fallbacks``); the placement that records it."""
        compilation = compile_module(module, self.compile_requested, **compile_kwargs)
        return attrs.evolve(self, compilations=self.compilations + (compilation,))

    def with_settings(self, **settings: Any) -> Placement:
        """Add compute settings the engine applies itself (``attention``, ``cuda_graphs``)."""
        return attrs.evolve(self, settings={**self.settings, **settings})

    @property
    def fast_profile(self) -> bool:
        """Whether an inexact fast profile is on (the engine setting ``fast``, e.g.
        ``engines.voxcpm.fast``, other than ``off``): its samples are not the exact path's, and
        its documented step count replaces the exact default where nothing sets the steps."""
        return self.settings.get("fast", "off") != "off"

    @property
    def fallbacks(self) -> tuple[str, ...]:
        """For ``applied.fallbacks``: compiling given up (read per result: it can happen on a
        later call)."""
        return tuple(note for c in self.compilations for note in c.fallbacks)

    @property
    def in_effect(self) -> dict[str, Any]:
        """The engine's part of ``applied.compute``: the options it implements, as applied."""
        implemented = self.engine.compute_options
        effect: dict[str, Any] = {}
        if "oom_fallback" in implemented:
            effect["oom_fallback"] = self.oom_fallback
        if "compile" in implemented:
            effect["compile"] = any(c.active for c in self.compilations)
        return {**effect, **self.settings}

    def model_info(self, *, model: str, variant: str, sample_rate: int,
                   capabilities: frozenset[Capability] | set[Capability],
                   license: str | None = None, non_commercial: bool = False,
                   fingerprint: str = "", dtype: torch.dtype | None = None,
                   languages: tuple[str, ...] = ()) -> ModelInfo:
        """``ModelInfo`` for the engine placed here (``dtype``: when the model's differs;
        ``languages``: what its model card says it speaks, BCP 47 tags)."""
        return ModelInfo(engine=self.engine.name, model=model, variant=variant,
                         sample_rate=sample_rate, dtype=dtype_name(dtype or self.dtype),
                         device=str(self.device), capabilities=frozenset(capabilities),
                         license=license, non_commercial=non_commercial,
                         fingerprint=fingerprint, languages=languages)


#: what float32 gains over an emulated dtype: a measured phrase, or a function giving one (or
#: ``None``: nothing to warn of), called only when the dtype is emulated
Speedup = str | Callable[[], str | None]


def place(engine: type[PlacedEngine], compute: ComputeOptions, *,
          device: Callable[[], torch.device] = default_device,
          dtype: str | None = None, auto_dtype: AutoDtype = torch.float32,
          supported: tuple[torch.dtype, ...] | None = None,
          dtype_setting: str = "compute.dtype",
          speedup: Speedup | Mapping[torch.dtype, Speedup] = "several times",
          fast_hint: str = "") -> Placement:
    """Apply ``compute`` for a model of ``engine`` about to be loaded: torch's CPU threads,
    the device (``device``: the engine's ``auto`` rule), the dtype (``dtype`` overrides
    ``compute.dtype``, e.g. an engine option; ``auto_dtype``: the engine's ``auto`` rule), and
    the warning when that dtype is emulated on this CPU (logged, and repeated in every result;
    ``dtype_setting`` names the setting to change, ``speedup`` what float32 gains, per dtype
    when a mapping, or a function asked only then, whose ``None`` means the engine runs that
    dtype faster than float32 anyway, so there is nothing to say; ``fast_hint`` an inexact,
    faster profile for such a CPU, if any)."""
    apply_cpu_threads(compute)
    selected_device = select_device(compute, auto=device)
    kwargs = {} if supported is None else {"supported": supported}
    selected_dtype = select_dtype(compute if dtype is None else dtype, selected_device,
                                  auto=auto_dtype, **kwargs)
    if isinstance(speedup, Mapping):
        speedup = speedup.get(selected_dtype, "")
    slow = emulated_dtype_warning(selected_dtype, selected_device, setting=dtype_setting,
                                  speedup=speedup, fast_hint=fast_hint)
    if slow:
        log.warning("%s", slow)
    return Placement(engine, selected_device, selected_dtype, oom_fallback=compute.oom_fallback,
                     compile_requested=compute.compile, warnings=(slow,) if slow else ())
