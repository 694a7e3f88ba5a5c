"""Mizuoto: neural text-to-speech with separately installable engines.

    import mizuoto
    tts = mizuoto.load("f5tts/v1-base")          # or a local model directory
    result = tts.synthesize(mizuoto.SynthesisRequest("Hello there.", seed=7))
    result.save("hello.wav")
"""

from __future__ import annotations

from mizuoto.catalog import CatalogEntry, HubFile
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
    Rendered,
    SynthesisRequest,
    SynthesisResult,
    Trainer,
    TrainingConfig,
    TrainingResult,
    UpstreamBaseline,
    Voice,
)
from mizuoto.errors import MizuotoError
from mizuoto.hookspecs import hookimpl
from mizuoto.loading import load, resolve_model
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
    "Rendered",
    "SynthesisRequest",
    "SynthesisResult",
    "Trainer",
    "TrainingConfig",
    "TrainingResult",
    "UpstreamBaseline",
    "Voice",
    "hookimpl",
    "load",
    "resolve_model",
]
