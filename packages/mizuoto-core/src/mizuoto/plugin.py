"""The plugin API: everything an engine or trainer plugin imports, from one module.

    from mizuoto.plugin import Engine, Rendered, SynthesisRequest, read_reference

Every name in ``__all__`` is documented in ``docs/api.md`` and stable under the plugin API's
deprecation policy (docs/changelog.md): it keeps working, with a ``PluginAPIDeprecation``
warning before it changes. Anything else under ``mizuoto.*`` is internal and may move.

It holds :mod:`mizuoto`'s own names (``mizuoto.__all__``) and the plugin's tools. Importing
it does not import torch (plugin listing stays fast): the names of modules that need torch
are imported on first use.
"""

from __future__ import annotations

import importlib

import mizuoto as _mizuoto
from mizuoto import *  # noqa: F403  (mizuoto.__all__, listed once, there)
from mizuoto.contracts.api import API_VERSION, PluginAPIDeprecation
from mizuoto.contracts.engine_support import check_output_length
from mizuoto.contracts.features import SupportsBatching, SupportsLoRA, SupportsSteps
from mizuoto.contracts.progress import ProgressCallback, report
from mizuoto.contracts.request_lock import Stream
from mizuoto.contracts.requests import MAX_TEXT_CHARS
from mizuoto.contracts.results import check_finite
from mizuoto.contracts.trainer import TrainerParams, checkpoint_retention
from mizuoto.contracts.turns import Turns
from mizuoto.errors import (
    CheckpointMismatch,
    DeadlineExceeded,
    DiskFull,
    EngineBusy,
    InvalidAudio,
    InvalidOption,
    InvalidRequest,
    ModelFilesMissing,
    NonFiniteAudio,
    OutputNotWritable,
    RequestConflict,
    UnsafeCheckpoint,
    UnsupportedCapability,
    UnsupportedSetting,
    VoiceMismatch,
)
from mizuoto.loading import resolve_for_engine
from mizuoto.runtime.atomic import atomic_directory, atomic_path, save_safetensors
from mizuoto.runtime.busy_wait import busy_wait, waiting_at_most
from mizuoto.runtime.interruption import catch_interruption
from mizuoto.runtime.seeds import MAX_SEED, keyed_generator
from mizuoto.text.files import read_utf8
from mizuoto.validation.ranges import check_number, integer_in, number_in

# Names from modules that import torch, imported on first use (module -> names).
_ON_FIRST_USE = {
    "mizuoto.contracts.placement": ("Placement", "place"),
    "mizuoto.runtime.checkpoint": ("check_state_dict", "load_state_dict_file",
                                   "weights_fingerprint"),
    "mizuoto.nn.dsp.audio_io": ("check_not_silent", "read_audio", "to_mono", "write_audio"),
    "mizuoto.nn.dsp.reference": ("read_reference",),
    # the training toolkit (mizuoto.training): the parts a trainer builds on
    "mizuoto.training": (
        "Cadence", "EpochPosition", "LoopOutcome", "ManifestRow", "MetricsLog", "Precision", "ProcessWorld",
        "LossForward", "RecipeQuirks", "RunnerSession", "TrainingRunner",
        "RunDirectory", "RunIdentity", "StepLoop", "StepProgress", "StepTrainer",
        "TrainingSession", "barrier", "base_fingerprint", "data_fingerprint", "find_manifest",
        "gather", "load_training_state", "micro_batches", "numbered", "process_world",
        "read_manifest", "read_metrics", "rotate", "save_training_state",
        "tensorboard_available"),
    "mizuoto.training.trainer": ("training_device", "training_precision"),
    # LoRA adapters: an engine declares its targets (mizuoto.adapters), a trainer adds the
    # lora method (mizuoto.training.lora)
    "mizuoto.adapters": ("AdapterFormat", "AdapterHost", "LoRATargets", "read_adapter_files",
                         "write_adapter", "write_adapter_files", "write_fixture_adapter"),
    "mizuoto.training.lora": ("LoRAParams", "add_adapters"),
    "mizuoto.nn.lora": ("LoRASettings",),
    # the command toolkit: what mizuoto's commands share, for a plugin's register_commands
    "mizuoto.commands.toolkit": ("FormatChoice", "check_audio_output", "check_written",
                                 "cli_names", "command_params", "command_progress",
                                 "model_options", "options_to_load", "report_written",
                                 "server_options"),
}
_MODULE_OF = {name: module for module, names in _ON_FIRST_USE.items() for name in names}

__all__ = [
    *_mizuoto.__all__,
    # the plugin API's version and its deprecation warning
    "API_VERSION", "PluginAPIDeprecation",
    # engine helpers
    "ProgressCallback", "Stream", "busy_wait", "check_finite", "check_output_length",
    "report", "waiting_at_most", "Turns",
    # optional features an engine declares (mizuoto.contracts.features)
    "SupportsBatching", "SupportsLoRA", "SupportsSteps",
    # request limits and range validators for params and options classes
    "MAX_SEED", "MAX_TEXT_CHARS", "check_number", "integer_in", "number_in",
    # errors
    "CheckpointMismatch", "DeadlineExceeded", "DiskFull", "EngineBusy", "InvalidAudio", "InvalidOption", "InvalidRequest",
    "ModelFilesMissing", "NonFiniteAudio", "OutputNotWritable", "RequestConflict",
    "UnsafeCheckpoint", "UnsupportedCapability", "UnsupportedSetting", "VoiceMismatch",
    # files: atomic writers, text files, model directories
    "atomic_directory", "atomic_path", "read_utf8", "resolve_for_engine", "save_safetensors",
    # contract fixtures: random-init weights per state-dict key
    "keyed_generator",
    # training
    "catch_interruption", "checkpoint_retention", "TrainerParams",
    *_MODULE_OF,
]


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))
