"""The trainer contract: fine-tune an engine's model in three stages (prepare, train, export)."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import attrs

from mizuoto.contracts.progress import ProgressCallback
from mizuoto.contracts.requests import MAX_SEED
from mizuoto.errors import InvalidOption, InvalidRequest
from mizuoto.options import ComputeOptions, Options
from mizuoto.validation.ranges import boolean, integer_in, number_in

MEMORY_LEVELS = ("default", "low", "lowest")
#: ``auto``: the trainer's upstream default (`mizuoto.training.precision`)
MIXED_PRECISION = ("auto", "no", "fp16", "bf16")
#: Bounds of a run's numbers: steps (and save_every) and batch size.
MAX_STEPS = 10_000_000
MAX_BATCH_SIZE = 4096


@attrs.frozen
class Setting:
    """A setting the ``train`` command sets: ``--config`` key ``name``, option ``flag``
    (``kind``: its type, or the tuple of its choices), the resume command, the help.
    ``param``: a `TrainerParams` field (a ``params`` key), else a `TrainingConfig` field."""

    name: str
    flag: str
    kind: Any
    help: str
    param: bool = False


def _flag(flag: str, kind: Any, what: str, note: str = "", *,
          default: str = "upstream's for the engine and method") -> dict[str, Any]:
    return {"setting": (flag, kind, f"{what} (default: {default}{note}).")}


@attrs.frozen
class TrainingConfig:
    """One fine-tuning run.

    ``method`` is one of the trainer's ``methods`` (``full``, ``lora``); ``memory`` is the
    ``training.memory`` level (``default``; ``low`` trades speed for memory, e.g. gradient
    checkpointing; ``lowest`` adds 8-bit optimiser state or CPU offload where the trainer can).
    A run in ``output_dir`` that was interrupted resumes from its last checkpoint.
    Numbers are checked on construction: ``steps`` and ``save_every`` in [1, 10 000 000],
    ``learning_rate`` in (0, 1], ``batch_size`` in [1, 4096], ``seed`` in [0, 2**32 - 1].
    ``compute`` is where it trains (``compute.device``: ``auto``, ``cpu``, ``cuda[:n]``; a
    `ComputeOptions` or a mapping of ``compute.*`` keys); ``mixed_precision`` is ``no``,
    ``fp16`` or ``bf16`` (the forward under autocast; fp16 with loss scaling), ``auto`` the
    trainer's upstream default (`mizuoto.training.precision`).
    """

    method: str
    model: str
    dataset: Path = attrs.field(converter=Path)
    output_dir: Path = attrs.field(converter=Path)
    steps: int = attrs.field(default=1000, validator=integer_in("training.steps", 1, MAX_STEPS),
                             metadata=_flag("--steps", int, "Optimiser updates to run"))
    learning_rate: float = attrs.field(
        default=1e-5, validator=number_in("training.learning_rate", 0.0, 1.0, low_open=True),
        metadata=_flag("--learning-rate", float, "Peak learning rate"))
    batch_size: int = attrs.field(
        default=1, validator=integer_in("training.batch_size", 1, MAX_BATCH_SIZE),
        metadata=_flag("--batch-size", int, "Clips per batch, where the recipe batches by "
                       "clips", "; refused under F5 frame batching: use --param batch_frames=N"))
    seed: int = attrs.field(default=0, validator=integer_in("training.seed", 0, MAX_SEED),
                            metadata=_flag("--seed", int, "Seed of every random draw",
                                           "; VoxCPM 42"))
    memory: str = attrs.field(default="default", metadata=_flag(
        "--memory", str, "training.memory: default, low or lowest", default="default"))
    save_every: int = attrs.field(
        default=500, validator=integer_in("training.save_every", 1, MAX_STEPS),
        metadata=_flag("--save-every", int, "Updates between resumable checkpoints"))
    params: Mapping[str, Any] = attrs.field(factory=dict,
                                            converter=lambda v: MappingProxyType(dict(v)))
    compute: ComputeOptions = attrs.field(factory=lambda: _compute({}),
                                          converter=lambda v: _compute(v))
    mixed_precision: str = attrs.field(default="auto", metadata=_flag(
        "--mixed-precision", MIXED_PRECISION, "Forward under autocast (fp16 "
        "with loss scaling)", default="auto: the engine's upstream default"))

    @mixed_precision.validator
    def _mixed_precision(self, attribute, value):
        if value not in MIXED_PRECISION:
            raise InvalidRequest("training.mixed_precision",
                                 f"must be one of {', '.join(MIXED_PRECISION)}, got {value!r}")

    @memory.validator
    def _memory(self, attribute, value):
        if value not in MEMORY_LEVELS:
            raise InvalidRequest("training.memory", f"must be one of {MEMORY_LEVELS}, got {value!r}")


LOGGERS = ("tensorboard", "none")


def _shared(flag: str, kind: Any, what: str, *, upstream: tuple[str, ...] = (),
            default: str = "upstream's for the engine and method") -> dict[str, Any]:
    return {"setting": (flag, kind, f"{what} (default: {default}).", True), "upstream": upstream}


def _optional(check):
    def validate(instance, attribute, value):
        if value is not None:
            check(instance, attribute, value)
    return validate


@attrs.frozen
class TrainerParams:
    """The settings every trainer shares, each declared once here under one name: its check,
    its ``train`` option, its ``--config`` / ``--param`` key and the upstream names it is also
    read under (``upstream``: a recipe file's or script's key, e.g. VoxCPM's
    ``grad_accum_steps``, f5-tts's ``num_warmup_updates``). None: the trainer's upstream
    value (its `Trainer.defaults`). Read from a run's ``params`` with `TrainerParams.of`.
    """

    warmup_updates: int | None = attrs.field(
        default=None, validator=_optional(integer_in("params.warmup_updates", 0, MAX_STEPS)),
        metadata=_shared("--warmup-updates", int, "Learning-rate warm-up, in updates",
                         upstream=("warmup_steps", "num_warmup_updates")))
    grad_accumulation: int | None = attrs.field(
        default=None, validator=_optional(integer_in("params.grad_accumulation", 1, 65536)),
        metadata=_shared("--grad-accumulation", int, "Micro-batches per update",
                         upstream=("grad_accum_steps", "grad_accumulation_steps")))
    max_grad_norm: float | None = attrs.field(
        default=None, validator=_optional(number_in("params.max_grad_norm", 0.0, 1e12)),
        metadata=_shared("--max-grad-norm", float, "Gradient-norm clipping; 0: none"))
    lr_schedule: str | None = attrs.field(
        default=None, validator=_optional(attrs.validators.instance_of(str)),
        metadata=_shared("--lr-schedule", str, "Learning-rate schedule by name "
                         "(mizuoto.training.schedules: linear, cosine, constant, ...)"))
    checkpoint_every: int | None = attrs.field(
        default=None, validator=_optional(integer_in("params.checkpoint_every", 1, MAX_STEPS)),
        metadata=_shared("--checkpoint-every", int, "Updates between numbered checkpoints",
                         upstream=("save_per_updates",), default="--save-every"))
    keep_last_n_checkpoints: int = attrs.field(
        default=0, validator=integer_in("params.keep_last_n_checkpoints", -1, MAX_STEPS),
        metadata=_shared("--keep-last-n-checkpoints", int, "Numbered checkpoints kept; -1: all",
                         default="upstream's for the engine; 0, none, in the Python API"))
    logger: str | None = attrs.field(
        default=None, metadata=_shared("--logger", LOGGERS, "Metrics logger besides "
                                       "metrics.jsonl", default="tensorboard when installed"))
    samples: bool | None = attrs.field(
        default=None, validator=boolean("params.samples", optional=True), metadata=_shared("--samples", bool, "Audio samples during training "
                                       "(F5: every --checkpoint-every; VoxCPM: at validation)",
                                       upstream=("log_samples",)))

    @logger.validator
    def _logger(self, attribute, value):
        if value is not None and value not in LOGGERS:
            raise InvalidRequest("params.logger", f"must be one of {', '.join(LOGGERS)}, got "
                                 f"{value!r}", "metrics.jsonl is always written")

    @property
    def tensorboard(self) -> bool | None:
        """`mizuoto.training.MetricsLog`'s ``tensorboard`` for ``logger``."""
        return None if self.logger is None else self.logger == "tensorboard"

    @classmethod
    def names(cls) -> dict[str, str]:
        """Every key the shared settings are read under (their names and upstream's) to its
        name."""
        names = {}
        for field in attrs.fields(cls):
            names[field.name] = field.name
            names.update(dict.fromkeys(field.metadata.get("upstream", ()), field.name))
        return names

    @classmethod
    def canonical(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with upstream's names of shared settings under the shared names (one
        setting named twice is refused)."""
        names, out, given = cls.names(), {}, {}
        for key, value in params.items():
            name = names.get(key, key)
            if name in given:
                raise InvalidRequest(f"params.{key}", f"sets {name} again (given as "
                                     f"{given[name]} too)", "give it once")
            given[name] = key
            out[name] = value
        return out

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> tuple[TrainerParams, dict[str, Any]]:
        """``(the shared settings, the trainer's own params)`` of a run's ``params``."""
        names = cls.names()
        given = {names[key]: key for key in params if key in names}
        params = cls.canonical(params)
        shared = {f.name for f in attrs.fields(cls)}
        try:
            settings = cls(**{k: v for k, v in params.items() if k in shared})
        except InvalidRequest as exc:  # named as the user gave it (upstream's name, maybe)
            name = exc.field.removeprefix("params.")
            if given.get(name, name) == name:
                raise
            raise InvalidRequest(f"params.{given[name]}", f"{exc.problem} (the shared "
                                 f"{name})", exc.fix) from None
        return settings, {k: v for k, v in params.items() if k not in shared}

    @classmethod
    def parse(cls, params: Mapping[str, Any], *, trainer: str) -> TrainerParams:
        """All of a run's ``params`` read into this class (a trainer's subclass adds its own
        fields); a key no field declares is refused, naming the ones that exist."""
        settings, unknown = cls.of(params)
        if unknown:
            raise InvalidRequest("params", f"unknown {trainer} training settings: "
                                 f"{', '.join(sorted(unknown))}",
                                 f"known: {', '.join(cls.names())}")
        return settings


def training_settings() -> tuple[Setting, ...]:
    """The settings a command-line run sets by name, each declared once with its default and
    check: `TrainingConfig` fields, then the `TrainerParams` every trainer shares (params):
    the ``train`` options, ``--config`` keys and resume command."""
    return tuple(Setting(field.name, *field.metadata["setting"])
                 for cls in (TrainingConfig, TrainerParams)
                 for field in attrs.fields(cls) if "setting" in field.metadata)


def _compute(value) -> ComputeOptions:
    if isinstance(value, ComputeOptions):
        return value
    if not isinstance(value, Mapping):
        raise InvalidOption("compute", "must be compute options, e.g. {\"device\": \"cuda\"}")
    return Options.from_mapping({"compute": dict(value)}).compute


def checkpoint_retention(config: TrainingConfig) -> tuple[int, int]:
    """The numbered-checkpoint params every trainer shares (`TrainerParams`), checked:
    ``(keep, every)`` from ``params.keep_last_n_checkpoints`` (default 0: none; -1: all; N: the
    newest N, rotated by number) and ``params.checkpoint_every`` (default ``save_every``)."""
    shared, _ = TrainerParams.of(config.params)
    every = config.save_every if shared.checkpoint_every is None else shared.checkpoint_every
    return shared.keep_last_n_checkpoints, every


@attrs.frozen
class TrainingResult:
    """What `Trainer.train` did. ``interrupted``: the name of the signal (``"SIGINT"``,
    ``"SIGTERM"``) that stopped the run early, its checkpoint saved after update
    ``steps_done`` (train again on the same ``output_dir`` to resume); None when the run
    finished."""

    output_dir: Path
    steps_done: int
    resumed_from: int | None
    exported: Path | None = None
    metrics: Mapping[str, float] = attrs.field(factory=dict,
                                               converter=lambda v: MappingProxyType(dict(v)))
    interrupted: str | None = None


class Trainer(abc.ABC):
    """Fine-tunes models of one engine. ``methods`` lists what it supports.

    ``graceful_stop``: `train` stops on SIGINT or SIGTERM after the current update, saves its
    checkpoint and returns a result with ``interrupted`` set
    (:mod:`mizuoto.runtime.interruption`); the contract suite tests it where it is true.
    """

    engine: ClassVar[str]
    methods: ClassVar[frozenset[str]]
    memory_levels: ClassVar[tuple[str, ...]] = ("default",)
    graceful_stop: ClassVar[bool] = False
    #: the shared settings this trainer reads from ``params`` (`TrainerParams`): a command
    #: line's upstream names for them reach it under the shared names. None (trainers written
    #: before it): ``params`` reach it as given.
    params_class: ClassVar[type[TrainerParams] | None] = None

    def check(self, config: TrainingConfig) -> None:
        if config.method not in self.methods:
            raise InvalidRequest("method", f"{self.engine} supports {sorted(self.methods)}, "
                                 f"not {config.method!r}")
        if config.memory not in self.memory_levels:
            raise InvalidRequest("training.memory",
                                 f"{self.engine} supports {self.memory_levels}")

    def defaults(self, method: str, model: str) -> Mapping[str, Any]:
        """The recipe a command-line run of ``method`` on ``model`` (an id or a directory, as
        given) starts from: upstream's
        defaults for this engine, method and model generation, as `TrainingConfig` fields
        (``steps``, ``learning_rate``, ``batch_size``, ``seed``, ``save_every``) and params.
        Default: none (`TrainingConfig`'s own defaults)."""
        return {}

    def upstream_recipe(self, settings: Mapping[str, Any]) -> Mapping[str, Any]:
        """``settings`` (a ``--config`` file) with upstream's names (its config file keys or
        command-line flags) translated to this trainer's: fields, params and ``model``,
        ``dataset``, ``method``. Keys it does not know pass through unchanged (the trainer's
        validation names them). Default: unchanged."""
        return dict(settings)

    @abc.abstractmethod
    def prepare(self, config: TrainingConfig, *, progress: ProgressCallback | None = None) -> Any:
        """Validate the data set and model, build manifests/features; returns a run handle."""

    @abc.abstractmethod
    def train(self, run: Any, *, progress: ProgressCallback | None = None) -> TrainingResult:
        """Train, checkpointing atomically every ``save_every`` steps; resumes if interrupted.
        With ``graceful_stop``, a SIGINT or SIGTERM ends it early, checkpoint saved."""

    @abc.abstractmethod
    def export(self, run: Any, destination: Path) -> Path:
        """Write a model directory (atomically) that the engine can load."""
