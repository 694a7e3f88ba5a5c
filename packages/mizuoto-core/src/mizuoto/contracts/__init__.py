"""The public contracts every engine and trainer implements, and the objects they exchange.

``__all__`` is the list :mod:`mizuoto` exports them by, kept here only: ``mizuoto.__all__`` adds
this list to its own names. (What only plugins use, such as ``API_VERSION``, comes from
:mod:`mizuoto.plugin`.)
"""

from mizuoto.contracts.audio import Audio
from mizuoto.contracts.baselines import UpstreamBaseline
from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.engine import Engine, ModelInfo
from mizuoto.contracts.engine_ref import EngineRef
from mizuoto.contracts.fixtures import ContractFixture
from mizuoto.contracts.progress import Progress
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
    "SynthesisRequest",
    "SynthesisResult",
    "Trainer",
    "TrainingConfig",
    "TrainingResult",
    "UpstreamBaseline",
    "Voice",
]
