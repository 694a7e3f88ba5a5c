"""LoRA adapters on a loaded model: what an engine declares, what an adapter file holds, and
applying one (at load time or over the one applied now) after every check has passed.

An engine declares :class:`LoRATargets` (its default target modules, the modules that may take
adapters, the module adapters attach under and its :class:`AdapterFormat`) and subclasses
:class:`AdapterHost` with ``lora_targets`` set: it then has ``lora``/``set_lora``
(:class:`~mizuoto.contracts.features.SupportsLoRA`), and ``mizuoto train --method lora`` (a
trainer built on :mod:`mizuoto.training.lora`) writes adapters it loads.

The core format is peft's: ``adapter_config.json`` (``peft_type: LORA``, ``r``,
``lora_alpha``, ``lora_dropout``, ``target_modules``, ``base_model_name_or_path``) and
``adapter_model.safetensors`` (keys ``base_model.model.<module>.lora_A.weight``), plus a
``mizuoto`` object naming the engine and the base model's fingerprint
(``ModelInfo.fingerprint``). An adapter for another base model, of another shape, naming a
module the engine does not offer, or holding NaN/Inf is refused by name before any layer is
touched. An engine with a format of its own (VoxCPM: upstream's ``lora_weights.safetensors``
+ ``lora_config.json``) declares its file names in its ``AdapterFormat``; no core module
names them.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import attrs
import torch
from torch import nn

from mizuoto.adapter_files import PEFT_FORMAT, AdapterFormat, adapter_base
from mizuoto.contracts.features import SupportsLoRA
from mizuoto.errors import CheckpointMismatch, InvalidRequest, ModelFilesMissing
from mizuoto.nn.lora import (
    LoRASettings,
    apply_lora,
    check_lora_numbers,
    check_lora_tensors,
    expected_shapes,
    matches,
    remove_lora,
    target_paths,
)

PEFT_PREFIX = PEFT_FORMAT.key_prefix
T = TypeVar("T")


@attrs.frozen
class LoRATargets:
    """What an engine declares about LoRA on its model: ``default`` target module patterns (a
    run's ``lora_targets`` when not given), ``allowed`` patterns a target must match (the
    modules the engine stands behind), ``module`` the attribute path adapters attach under
    (module names are relative to it), and the file ``format``."""

    default: tuple[str, ...] = attrs.field(converter=tuple)
    allowed: tuple[str, ...] = attrs.field(converter=tuple)
    module: str = ""
    format: AdapterFormat = PEFT_FORMAT

    def paths(self, root: nn.Module, patterns: Iterable[str] | None = None,
              field: str = "lora.target_modules") -> list[str]:
        """The module paths under ``root`` that ``patterns`` (default ``default``) name: each
        pattern must name a linear layer, and each layer must be ``allowed``."""
        patterns = tuple(self.default if patterns is None else patterns)
        paths = target_paths(root, patterns)
        for pattern in patterns:
            if not any(matches(p, pattern) for p in paths):
                raise InvalidRequest(field, f"{pattern!r} names no linear layer of the model",
                                     f"name modules the engine offers: {list(self.allowed)}")
        refused = [p for p in paths if not any(matches(p, a) for a in self.allowed)]
        if refused:
            raise InvalidRequest(field, f"{refused[:3]} may not take adapters",
                                 f"the engine offers {list(self.allowed)}")
        return paths


@attrs.frozen
class Adapter:
    """An adapter read from disk: its settings (``target_modules`` are module paths), tensors
    by the model's keys (``<path>.lora_A``), the base model it was trained on and a digest."""

    path: str
    settings: LoRASettings
    tensors: Mapping[str, torch.Tensor] = attrs.field(repr=False, eq=False)
    base_model: str | None = None
    base_fingerprint: str | None = None
    engine: str | None = None
    #: what identifies it (default: of its settings and tensors, `adapter_digest`)
    digest: str = attrs.field(default=attrs.Factory(
        lambda self: _digest(self.settings, self.tensors), takes_self=True))


def _digest(settings: LoRASettings, tensors: Mapping[str, torch.Tensor]) -> str:
    digest = hashlib.sha256(json.dumps(attrs.asdict(settings), sort_keys=True).encode())
    for key in sorted(tensors):
        digest.update(key.encode())
        digest.update(tensors[key].to(torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def adapter_digest(settings: LoRASettings, tensors: Mapping[str, torch.Tensor]) -> str:
    """What identifies an adapter (`Adapter.digest`), for a reader of a format of its own."""
    return _digest(settings, tensors)


def read_adapter_files(path: str | Path, fmt: AdapterFormat,
                       settings: Callable[[dict[str, Any] | None], T]
                       ) -> tuple[T, dict[str, Any], dict[str, torch.Tensor]]:
    """``(settings, config, tensors)`` of the adapter in ``path`` (its directory or its weights
    file) in the declared format ``fmt``: ``settings`` turns the config's settings object
    (None: no config file, where ``fmt`` allows none) into the reader's, its ``ValueError``
    reported as a :class:`CheckpointMismatch` naming the config file; the tensors are by the
    model's keys. A :class:`ModelFilesMissing` naming the files otherwise."""
    from safetensors.torch import load_file

    from mizuoto.settings_files import parse_settings

    path = Path(path)
    directory = path if path.is_dir() else path.parent
    weights = directory / fmt.weights_file if path.is_dir() else path
    config_file = directory / fmt.config_file
    missing = [f.name for f in (weights, config_file)
               if not f.is_file() and (f is weights or fmt.config_required)]
    if missing:
        raise ModelFilesMissing(str(directory), missing, f"an adapter directory holds "
                                f"{fmt.weights_file} and {fmt.config_file}")
    info: dict[str, Any] = {}
    try:
        if config_file.is_file():
            info = parse_settings(config_file.read_text(encoding="utf-8"), "json",
                                  fmt.config_file)
            if not isinstance(info, dict):
                raise ValueError(f"must hold a JSON object, not {type(info).__name__}")
        table = info.get(fmt.settings_key, {}) if fmt.settings_key else info
        if not isinstance(table, dict):
            raise ValueError(f"{fmt.settings_key} must be an object")
        parsed = settings(table if config_file.is_file() else None)
    except (KeyError, ValueError, TypeError) as exc:
        raise CheckpointMismatch(str(config_file), detail=str(exc)) from exc
    try:
        raw = load_file(str(weights), device="cpu")
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointMismatch(str(weights), detail=f"cannot read it: {exc}") from exc
    return parsed, info, {fmt.model_key(k, str(weights)): v for k, v in raw.items()}


def write_adapter_files(directory: str | Path, tensors: Mapping[str, torch.Tensor],
                        info: Mapping[str, Any], fmt: AdapterFormat) -> Path:
    """Write adapter ``tensors`` (by the model's keys: `lora_state_dict`) and the config
    ``info`` in the declared format ``fmt``, each file atomically. Returns the directory."""
    from mizuoto.runtime.atomic import atomic_path, save_safetensors

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_safetensors({fmt.file_key(k): v.detach().contiguous() for k, v in tensors.items()},
                     directory / fmt.weights_file)
    with atomic_path(directory / fmt.config_file) as tmp:
        tmp.write_text(json.dumps(info, indent=2, ensure_ascii=False), encoding="utf-8")
    return directory


def _peft_settings(info: dict[str, Any] | None) -> LoRASettings:
    info = info or {}
    if info.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"peft_type {info['peft_type']!r} is not LORA")
    check_lora_numbers(info, prefix=f"{PEFT_FORMAT.config_file}:",
                       names={"r": "r", "alpha": "lora_alpha", "dropout": "lora_dropout"})
    targets = info.get("target_modules")
    if not (isinstance(targets, list) and targets):
        raise ValueError("target_modules must be a list of module names")
    return LoRASettings(r=int(info["r"]), alpha=info.get("lora_alpha", 8),
                        dropout=info.get("lora_dropout", 0.0), target_modules=targets)


def read_adapter(path: str | Path, fmt: AdapterFormat = PEFT_FORMAT) -> Adapter:
    """The adapter in directory ``path`` in the peft format: its config checked (rank, alpha,
    dropout, targets) and its tensors read; a :class:`ModelFilesMissing` or
    :class:`CheckpointMismatch` naming the file otherwise."""
    settings, info, tensors = read_adapter_files(path, fmt, _peft_settings)
    own = info.get("mizuoto") if isinstance(info.get("mizuoto"), dict) else {}
    return Adapter(str(path), settings, tensors, info.get(fmt.base_model_key),
                   own.get("base_model_fingerprint"), own.get("engine"),
                   _digest(settings, tensors))


def write_adapter(directory: str | Path, tensors: Mapping[str, torch.Tensor],
                  settings: LoRASettings, *, engine: str, base_model: str | None,
                  base_fingerprint: str | None, fmt: AdapterFormat = PEFT_FORMAT) -> Path:
    """Write adapter ``tensors`` (by the model's keys, ``<path>.lora_A``: `lora_state_dict`;
    ``settings.target_modules`` their paths) in the peft format, each file atomically.
    Returns the directory."""
    info = {"peft_type": "LORA", "r": settings.r, "lora_alpha": settings.alpha,
            "lora_dropout": settings.dropout, "target_modules": list(settings.target_modules),
            "bias": "none", fmt.base_model_key: base_model,
            "mizuoto": {"engine": engine, "base_model_fingerprint": base_fingerprint}}
    return write_adapter_files(directory, tensors, info, fmt)


def check_adapter(adapter: Adapter, root: nn.Module, targets: LoRATargets, *,
                  engine: str, base_fingerprint: str) -> list[str]:
    """Everything about ``adapter`` that could fail, before a layer changes: its base model
    (engine and fingerprint), its modules (present, linear, allowed) and its tensors (names,
    shapes, finite). Returns the module paths it wraps."""
    if adapter.engine is not None and adapter.engine != engine:
        raise InvalidRequest("lora", f"{adapter.path} is an adapter for engine "
                             f"{adapter.engine!r}, not {engine!r}")
    if adapter.base_fingerprint is not None and adapter.base_fingerprint != base_fingerprint:
        raise InvalidRequest("lora", f"{adapter.path} was trained on another base model "
                             f"({adapter.base_model or 'unnamed'}, fingerprint "
                             f"{adapter.base_fingerprint[:12]}…), not this one "
                             f"({base_fingerprint[:12]}…)", "load the base model it names")
    paths = targets.paths(root, adapter.settings.target_modules, field="lora.target_modules")
    check_lora_tensors(adapter.tensors, expected_shapes(root, paths, adapter.settings.r),
                       adapter.path)
    return paths


def attach_adapter(root: nn.Module, adapter: Adapter, paths: list[str]) -> None:
    """Replace the adapters on ``root`` by ``adapter`` (checked: :func:`check_adapter`); its
    tensors copied into the base layers' dtype and device, never merged."""
    remove_lora(root)
    settings = adapter.settings
    layers = apply_lora(root, paths, settings.r, settings.alpha, settings.dropout)
    with torch.no_grad():
        for path, layer in zip(paths, layers, strict=True):
            layer.lora_A.copy_(adapter.tensors[f"{path}.lora_A"])
            layer.lora_B.copy_(adapter.tensors[f"{path}.lora_B"])


def find_adapters(roots: Iterable[str | Path],
                  formats: Iterable[AdapterFormat | ClaimedExports],
                  field: str = "lora_dirs") -> dict[str, Path]:
    """The adapter directories directly under ``roots`` (any of ``formats``): name (the
    subdirectory's) to directory; two of one name refused by ``field``."""
    formats = tuple(formats)
    found: dict[str, Path] = {}
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            raise InvalidRequest(field, f"{root} is not a directory",
                                 "give directories holding LoRA exports")
        for path in sorted(p for p in root.iterdir() if p.is_dir()):
            if any(fmt.holds(path) for fmt in formats):
                if path.name in found:
                    raise InvalidRequest(field, f"two LoRA exports are named {path.name!r}: "
                                         f"{found[path.name]} and {path}",
                                         "rename one of the directories")
                found[path.name] = path
    return found


@attrs.frozen
class ClaimedExports:
    """The exports of a :class:`SupportsLoRA` engine that declares no ``lora_targets``, told
    by its own ``is_lora_export`` (an API 1.1 plugin's way): found as a format's are."""

    engine: type[SupportsLoRA]

    def holds(self, directory: Path) -> bool:
        return bool(self.engine.is_lora_export(Path(directory)))


def engine_adapter_formats() -> list[AdapterFormat | ClaimedExports]:
    """The adapter formats of every registered engine that declares LoRA targets (peft's
    first), then the exports other LoRA engines claim (:class:`ClaimedExports`)."""
    from mizuoto import registry

    formats: list[AdapterFormat | ClaimedExports] = [PEFT_FORMAT]
    for engine in registry.engines().values():
        declared = getattr(engine, "lora_targets", None)  # a declared ClassVar of AdapterHost
        if isinstance(declared, LoRATargets):
            if declared.format not in formats:
                formats.append(declared.format)
        elif isinstance(engine, type) and issubclass(engine, SupportsLoRA):
            formats.append(ClaimedExports(engine))
    return formats


class AdapterHost(SupportsLoRA):
    """:class:`SupportsLoRA` for an engine that declares ``lora_targets``: ``set_lora`` reads
    the adapter in the declared format, checks it (:func:`check_adapter`) and only then swaps
    it in under :meth:`adapter_turn`; ``lora`` is the :class:`Adapter` applied.

    Several adapters may be known to one loaded model, as peft's ``load_adapter`` /
    ``set_adapter`` / ``delete_adapter``: :meth:`load_adapter` reads and checks one and keeps
    it in memory by name (nothing applied), :meth:`set_adapter` applies a known one (or none)
    in place of the one applied. ``mizuoto serve --lora-dir`` selects each request's this way.

    The engine gives :meth:`lora_root` (its model's module the targets are under) and
    :meth:`base_fingerprint` (its weights' identity without an adapter), and may override
    :meth:`adapter_changed` (e.g. to name the adapter in its ``info.fingerprint``)."""

    lora_targets: ClassVar[LoRATargets]
    _adapter: Adapter | None = None
    _adapter_name: str | None = None

    @abc.abstractmethod
    def lora_root(self) -> nn.Module:
        """The module adapters attach under (module paths are relative to it)."""

    @abc.abstractmethod
    def base_fingerprint(self) -> str:
        """The identity of the loaded base weights, as the trainer writes it in an adapter."""

    @classmethod
    def is_lora_export(cls, directory: Path) -> bool:
        """A directory holding an adapter in the format this engine declares (``mizuoto.load``
        applies it to the base model its config names): ``serve --ray --lora-dir`` serves it."""
        targets = getattr(cls, "lora_targets", None)  # None: a subclass that opts out
        return targets is not None and targets.format.holds(Path(directory))

    def adapter_turn(self) -> contextlib.AbstractContextManager:
        """Held while an adapter is swapped: the engine's compute turn, so that no request runs
        on half-swapped layers."""
        return contextlib.nullcontext()

    def adapter_changed(self, adapter: Adapter | None) -> None:
        """Called after an adapter was applied (or removed, ``None``)."""

    def read_adapter(self, path: str | Path) -> Adapter:
        """The adapter in ``path`` in this engine's format (override for a format of its own)."""
        return read_adapter(path, self.lora_targets.format)

    @classmethod
    def load_adapter_export(cls, directory: str | Path, **load_kwargs: Any):
        """The engine loaded from the base model an adapter export in ``directory`` names,
        with the adapter applied; None when ``directory`` is not one. Call it first in
        ``load`` (``mizuoto.load`` does the same for any engine), so that the export of a
        ``lora`` run loads wherever a model directory does."""
        base = adapter_base(directory)
        if base is None:
            return None
        from mizuoto.loading import resolve_for_engine

        load_kwargs.pop("model_id", None)
        resolved = resolve_for_engine(base[0], cls.name)
        engine = cls.load(resolved.path, model_id=resolved.id, **load_kwargs)
        engine.set_lora(directory)
        return engine

    @property
    def lora(self) -> Adapter | None:
        return self._adapter

    def set_lora(self, path: str | Path | None) -> None:
        self._apply(None if path is None else self._checked(path), None)

    def _checked(self, path: str | Path) -> tuple[Adapter, list[str]]:
        adapter = self.read_adapter(path)
        return adapter, check_adapter(adapter, self.lora_root(), self.lora_targets,
                                      engine=self.name, base_fingerprint=self.base_fingerprint())

    def _apply(self, checked: tuple[Adapter, list[str]] | None, name: str | None) -> None:
        root = self.lora_root()
        with self.adapter_turn():
            if checked is None:
                remove_lora(root)
            else:
                attach_adapter(root, *checked)
            self._adapter = None if checked is None else checked[0]
            self._adapter_name = name
            self.adapter_changed(self._adapter)

    # -- several adapters on one model (peft's load_adapter / set_adapter) ------------------

    @property
    def adapters(self) -> dict[str, tuple[Adapter, list[str]]]:
        """The adapters :meth:`load_adapter` keeps, by name, each with the paths it wraps."""
        return self.__dict__.setdefault("_known_adapters", {})

    @property
    def active_adapter(self) -> str | None:
        """The name of the known adapter applied (:meth:`set_adapter`); None: none is, or one
        was applied by ``set_lora``."""
        return self._adapter_name

    def load_adapter(self, name: str, path: str | Path) -> Adapter:
        """Read the adapter in ``path`` and check it against this model (base, modules,
        shapes, finite values: refused by name otherwise) and keep it as ``name``; nothing is
        applied."""
        try:
            checked = self._checked(path)
        except (InvalidRequest, CheckpointMismatch, ModelFilesMissing) as exc:
            raise InvalidRequest("lora", f"adapter {name!r} does not fit model "
                                 f"{self.info.model!r}: {exc}") from exc
        self.adapters[name] = checked
        return checked[0]

    def set_adapter(self, name: str | None) -> None:
        """Apply the known adapter ``name`` (None: none) in place of the one applied; nothing
        changes when it is applied already."""
        if name is not None and name not in self.adapters:
            raise InvalidRequest("lora", f"no adapter named {name!r} is loaded",
                                 f"load it first (load_adapter); loaded: {sorted(self.adapters)}")
        if name == self._adapter_name and (name is not None or self._adapter is None):
            return
        self._apply(None if name is None else self.adapters[name], name)

    def delete_adapter(self, name: str) -> None:
        """Forget the known adapter ``name`` (removed from the model first if applied)."""
        if name == self._adapter_name:
            self.set_adapter(None)
        self.adapters.pop(name, None)


def write_random_adapter(engine: AdapterHost, directory: str | Path, seed: int | None, *,
                         r: int = 2, base_fingerprint: str | None = None) -> Path:
    """An adapter for the loaded ``engine`` on its declared default targets, in peft's format:
    ``lora_A`` and ``lora_B`` normal from ``seed`` (large enough to change any output), or
    ``lora_B`` all zeros for ``seed=None`` (an adapter that changes nothing). For tests and
    contract fixtures."""
    root = engine.lora_root()
    paths = engine.lora_targets.paths(root)
    generator = torch.Generator().manual_seed(0 if seed is None else seed)
    tensors = {}
    for path in paths:
        layer = root.get_submodule(path)
        tensors[f"{path}.lora_A"] = torch.randn(r, layer.in_features, generator=generator)
        up = torch.randn(layer.out_features, r, generator=generator)
        tensors[f"{path}.lora_B"] = torch.zeros_like(up) if seed is None else up
    return write_adapter(directory, tensors, LoRASettings(r=r, alpha=2 * r, target_modules=paths),
                         engine=engine.name, base_model=engine.info.model,
                         base_fingerprint=base_fingerprint or engine.base_fingerprint())


def write_fixture_adapter(engine_name: str, model_dir: Path, lora_dir: Path,
                          seed: int | None) -> None:
    """``ContractFixture.make_lora`` for an engine that declares ``lora_targets`` (call it from
    the plugin's own function, so that the plugin module imports no torch): loads the
    fixture's model on the CPU and writes :func:`write_random_adapter` from ``seed``."""
    from mizuoto.options import ComputeOptions, Options
    from mizuoto.registry import get_engine

    engine = get_engine(engine_name).load(
        Path(model_dir), options=Options(compute=ComputeOptions(device="cpu", cpu_threads=1)))
    write_random_adapter(engine, lora_dir, seed)
