"""Mizuoto: neural text-to-speech with separately installable engines.

    import mizuoto
    tts = mizuoto.load("f5tts/v1-base")          # or a local model directory
    result = tts.synthesize(mizuoto.SynthesisRequest("Hello there.", seed=7))
    result.save("hello.wav")
"""

from __future__ import annotations

from pathlib import Path

from mizuoto.catalog import CatalogEntry, HubFile, resolve_model
from mizuoto.contracts import (
    Applied,
    Audio,
    AudioChunk,
    Capability,
    ContractFixture,
    EditRequest,
    Engine,
    EngineRef,
    ModelInfo,
    Progress,
    Reference,
    SynthesisRequest,
    SynthesisResult,
    Trainer,
    TrainingConfig,
    TrainingResult,
    Voice,
)
from mizuoto.errors import MizuotoError
from mizuoto.hookspecs import hookimpl
from mizuoto.options import ComputeOptions, Options

__version__ = "0.1.0"

__all__ = [
    "Applied",
    "Audio",
    "AudioChunk",
    "Capability",
    "CatalogEntry",
    "ComputeOptions",
    "ContractFixture",
    "EditRequest",
    "Engine",
    "EngineRef",
    "HubFile",
    "MizuotoError",
    "ModelInfo",
    "Options",
    "Progress",
    "Reference",
    "SynthesisRequest",
    "SynthesisResult",
    "Trainer",
    "TrainingConfig",
    "TrainingResult",
    "Voice",
    "hookimpl",
    "load",
    "resolve_model",
]


def load(model: str | Path, *, engine: str | None = None, options: Options | None = None,
         progress=None) -> Engine:
    """Load a model (a directory or a catalog id) with the engine that owns it."""
    from mizuoto.errors import EngineNotFound
    from mizuoto.registry import engines, get_engine

    resolved = resolve_model(model, progress=progress)
    if engine is None and resolved.entry is not None:
        engine = resolved.entry.engine
    if engine is None:
        candidates = [cls for cls in engines().values() if cls.recognizes(resolved.path)]
        if len(candidates) != 1:
            names = ", ".join(sorted(c.name for c in candidates)) or "none"
            raise EngineNotFound(f"cannot tell which engine loads {resolved.path} "
                                 f"(recognized by: {names}); pass engine=...")
        engine_cls = candidates[0]
    else:
        engine_cls = get_engine(engine)
    options = options or Options()
    options.engine_options(engine_cls)
    return engine_cls.load(resolved.path, options=options, model_id=resolved.id,
                           progress=progress)
