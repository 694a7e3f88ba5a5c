"""The top of the layering: resolve a model against the installed plugins' catalog, and load it
with the engine that owns it.

Modules import downwards only (simonw/llm's layering; tests/test_import_layers.py checks it):
errors / key_values -> validation -> settings_files / json_files / regular_files /
adapter_files ->
options -> runtime -> text / audio_formats /
audio_encoders / audio_encoding -> contracts -> nn -> catalog -> hookspecs / plugins -> registry -> loading ->
adapters -> mizuoto / plugin -> the front ends (cli, serve, batch, longform, training, ...) -> the engines.
Nothing below imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mizuoto.adapter_files import adapter_base
from mizuoto.catalog import CatalogEntry, ResolvedModel, resolve_in
from mizuoto.contracts.engine import Engine, check_param_keys
from mizuoto.contracts.progress import ProgressCallback
from mizuoto.contracts.requests import SynthesisRequest
from mizuoto.errors import EngineMismatch, EngineNotFound, InvalidOption
from mizuoto.options import Options
from mizuoto.registry import catalog as registered_catalog
from mizuoto.registry import engines, get_engine
from mizuoto.runtime.startup import set_wait_policy
from mizuoto.validation.audio import check_audible_file


def resolve_model(model: str | Path, *, catalog: Mapping[str, CatalogEntry] | None = None,
                  download: bool = True, progress: ProgressCallback | None = None
                  ) -> ResolvedModel:
    """Turn a directory or a catalog id into a local directory, downloading when possible.

    ``catalog`` defaults to the entries the installed plugins register.
    """
    if catalog is None and not Path(model).expanduser().is_dir():
        catalog = registered_catalog()
    return resolve_in(model, catalog or {}, download=download, progress=progress)


def resolve_engine(model: str | Path, *, engine: str | None = None,
                   options: Options | Mapping[str, Any] | None = None,
                   progress: ProgressCallback | None = None
                   ) -> tuple[type[Engine], ResolvedModel]:
    """The engine class that loads ``model`` and where the model is, without loading it: what
    :func:`load` checks first (a bad option, a missing model, an unknown engine, a bad
    ``engines.<name>`` option raise here, in milliseconds for a local directory)."""
    options = _as_options(options)  # a bad option fails before anything is resolved
    base = _adapter_base(model)
    if base is not None:  # an adapter export: the engine and model of its base
        return resolve_engine(base[0], engine=engine or base[1], options=options,
                              progress=progress)
    resolved = resolve_model(model, progress=progress)
    if engine is None and resolved.entry is not None:
        engine = resolved.entry.engine
    if engine is None:
        candidates = [cls for cls in engines().values() if cls.recognizes(resolved.path)]
        if len(candidates) > 1:
            names = ", ".join(sorted(c.name for c in candidates))
            raise EngineNotFound(f"{resolved.path} is recognized by several engines ({names}): "
                                 "name one (-e NAME in the CLI, engine=NAME in Python)")
        if not candidates:
            raise EngineNotFound(_no_engine_for(resolved.path))
        engine_cls = candidates[0]
    else:
        engine_cls = get_engine(engine)
        check_owner(resolved, engine)
    options.engine_options(engine_cls)  # a bad engines.<name> value fails before any loading
    return engine_cls, resolved


#: Model folders of the engines Mizuoto publishes, told by their files, to name the package
#: to install when no installed engine recognizes a folder: (engine, package, files present).
_PUBLISHED_LAYOUTS = (
    ("F5-TTS", "mizuoto-f5tts", ("vocos/config.yaml", "*.safetensors|*.pt")),
    ("VoxCPM", "mizuoto-voxcpm", ("config.json", "audiovae.safetensors|audiovae.pth")),
)


def _no_engine_for(path: Path) -> str:
    """Why no engine loads ``path``, and the fix: the package to install when its files are
    a published engine's, else how to name the engine."""
    installed = sorted(engines())
    for name, package, patterns in _PUBLISHED_LAYOUTS:
        if all(any(any(path.glob(p)) for p in pattern.split("|")) for pattern in patterns):
            return (f"{path} looks like an {name} model, and no installed engine loads it"
                    f" (installed: {', '.join(installed) or 'none'}): pip install "
                    f"./packages/{package} (from a clone of Mizuoto's repository)")
    if not installed:
        return (f"no engine is installed to load {path}: install one, e.g. "
                "pip install ./packages/mizuoto-f5tts (or ./packages/mizuoto-voxcpm) from a "
                "clone of Mizuoto's repository (no release is published yet)")
    return (f"no installed engine ({', '.join(installed)}) recognizes {path} as its model: "
            "name the engine (-e NAME in the CLI, engine=NAME in Python), or check the folder")


def _adapter_base(model: str | Path) -> tuple[str, str | None] | None:
    """The base model and engine an adapter export names (`mizuoto.adapter_files.adapter_base`,
    which reads JSON only: a bad request still fails before torch)."""
    return adapter_base(model)


def load(model: str | Path, *, engine: str | None = None,
         options: Options | Mapping[str, Any] | None = None,
         progress: ProgressCallback | None = None,
         request: SynthesisRequest | None = None) -> Engine:
    """Load a model (a directory or a catalog id) with the engine that owns it.

    ``options``: :class:`~mizuoto.options.Options`, or a plain mapping of the same sections
    (``{"compute": {"device": "cpu"}}`` or dotted keys), read by ``Options.from_mapping``.
    ``request``: a request to check first (its ``params`` keys against the engine's settings,
    with the closest one; :meth:`~mizuoto.contracts.engine.Engine.check_request`; a silent
    reference recording), so that one the engine would refuse fails before the weights load.
    An adapter directory (peft's files, as ``mizuoto train --method lora`` exports them) loads
    the base model it names and applies it.

    The first load in a process that has not imported torch yet sets OpenMP's wait policy
    (``compute.cpu_wait_policy``, as the ``mizuoto`` command does): OpenMP reads it once,
    when torch is imported.
    """
    options = _as_options(options)
    set_wait_policy(options.compute, serving=False)  # before the engine imports torch
    base = _adapter_base(model)
    if base is not None:
        from mizuoto.contracts.features import lora_engine

        loaded = load(base[0], engine=engine or base[1], options=options, progress=progress,
                      request=request)
        lora_engine(loaded, "model").set_lora(model)
        return loaded
    engine_cls, resolved = resolve_engine(model, engine=engine, options=options,
                                          progress=progress)
    if request is not None:
        check_param_keys(engine_cls, request.params)
        engine_cls.check_request(request, resolved.path)
        check_audible_reference(request)
    return engine_cls.load(resolved.path, options=options, model_id=resolved.id,
                           progress=progress)


def check_params_before_load(model: str | Path, params: Mapping[str, Any] | None, *,
                             engine: str | None = None,
                             options: Options | Mapping[str, Any] | None = None) -> None:
    """Raise :class:`~mizuoto.errors.InvalidRequest` for a key of ``params`` that the engine
    loading ``model`` does not declare (naming the closest one), without loading it."""
    if not params:
        return
    engine_cls, _ = resolve_engine(model, engine=engine, options=options)
    check_param_keys(engine_cls, params)


def check_audible_reference(request: SynthesisRequest) -> None:
    """Refuse, before the weights load, a reference recording that is silent: no sample
    above :data:`~mizuoto.validation.audio.SILENCE_PEAK` (what every engine refuses, whatever
    its own checks)."""
    reference = request.reference
    if request.voice is None and reference is not None and isinstance(reference.audio, Path):
        check_audible_file(reference.audio, "reference.audio")


def _as_options(options: Options | Mapping[str, Any] | None) -> Options:
    if options is None:
        return Options()
    if isinstance(options, Options):
        return options
    if isinstance(options, Mapping):
        return Options.from_mapping(options)
    raise InvalidOption("options", f"must be mizuoto.Options or a mapping such as "
                        f"{{'compute': {{'device': 'cpu'}}}}, got {type(options).__name__}")


def check_owner(resolved: ResolvedModel, engine: str) -> None:
    """Raise `EngineMismatch` when ``engine`` is named for a model another engine owns: a
    catalog entry of another engine, or a directory that another installed engine recognizes
    and ``engine`` does not (an engine that recognizes nothing is never contradicted)."""
    if resolved.entry is not None:
        if resolved.entry.engine != engine:
            raise EngineMismatch(resolved.id, engine, [resolved.entry.engine])
        return
    if get_engine(engine).recognizes(resolved.path):
        return
    owners = sorted(name for name, cls in engines().items()
                    if name != engine and cls.recognizes(resolved.path))
    if owners:
        raise EngineMismatch(str(resolved.path), engine, owners)


def resolve_for_engine(model: str | Path, engine: str, *,
                       progress: ProgressCallback | None = None) -> ResolvedModel:
    """`resolve_model`, then `check_owner`: what a trainer of ``engine`` starts from."""
    resolved = resolve_model(model, progress=progress)
    check_owner(resolved, engine)
    return resolved
