"""The public contracts every engine and trainer implements, and the objects they exchange.

``__all__`` is the list :mod:`mizuoto` exports them by, kept here only: ``mizuoto.__all__`` adds
this list to its own names. What only plugins use (``API_VERSION``, ``PluginAPIDeprecation``,
``ProgressCallback``) is :mod:`mizuoto.plugin`'s, still importable from here for plugins
written before it (docs/changelog.md, plugin API 1.1).
"""

from mizuoto.contracts.api import API_VERSION, PluginAPIDeprecation  # noqa: F401
from mizuoto.contracts.audio import Audio
from mizuoto.contracts.baselines import UpstreamBaseline
from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.engine import Engine, ModelInfo
from mizuoto.contracts.engine_ref import EngineRef
from mizuoto.contracts.fixtures import ContractFixture
from mizuoto.contracts.plan import RequestPlan
from mizuoto.contracts.progress import Progress, ProgressCallback  # noqa: F401
from mizuoto.contracts.requests import EditRequest, Reference, SynthesisRequest
from mizuoto.contracts.results import Applied, AudioChunk, Rendered, SynthesisResult
from mizuoto.contracts.trainer import Trainer, TrainingConfig, TrainingResult
from mizuoto.contracts.voice import Voice

__all__ = [
    "Applied",
    "Audio",
    "AudioChunk",
    "Capability",
    "ContractFixture",
    "EditRequest",
    "Engine",
    "EngineRef",
    "ModelInfo",
    "Progress",
    "Reference",
    "Rendered",
    "RequestPlan",
    "SynthesisRequest",
    "SynthesisResult",
    "Trainer",
    "TrainingConfig",
    "TrainingResult",
    "UpstreamBaseline",
    "Voice",
]
