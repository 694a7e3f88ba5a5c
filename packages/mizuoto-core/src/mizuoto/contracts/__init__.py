"""The public contracts every engine and trainer implements, and the objects they exchange."""

from mizuoto.contracts.api import API_VERSION, PluginAPIDeprecation
from mizuoto.contracts.audio import Audio
from mizuoto.contracts.baselines import UpstreamBaseline
from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.engine import Engine, ModelInfo
from mizuoto.contracts.engine_ref import EngineRef
from mizuoto.contracts.fixtures import ContractFixture
from mizuoto.contracts.progress import Progress, ProgressCallback
from mizuoto.contracts.requests import EditRequest, Reference, SynthesisRequest
from mizuoto.contracts.results import Applied, AudioChunk, Rendered, SynthesisResult
from mizuoto.contracts.trainer import Trainer, TrainingConfig, TrainingResult
from mizuoto.contracts.voice import Voice

__all__ = [
    "API_VERSION",
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
    "PluginAPIDeprecation",
    "ProgressCallback",
    "Reference",
    "Rendered",
    "SynthesisRequest",
    "SynthesisResult",
    "Trainer",
    "TrainingConfig",
    "TrainingResult",
    "UpstreamBaseline",
    "Voice",
]
