"""The ``lora`` training method for any engine that declares
:class:`~mizuoto.adapters.LoRATargets`: its params (:class:`LoRAParams`; a run's settings,
:func:`lora_run_settings`), the adapters added to a built model with only them training
(:func:`add_adapters`), and the export (the adapter alone, pointing at its base model by id and
fingerprint: :func:`write_lora_export`). `mizuoto.training.StepTrainer` runs all of it for a
trainer that sets ``lora_targets``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import nn

from mizuoto.adapters import LoRATargets, write_adapter
from mizuoto.contracts.trainer import TrainerParams
from mizuoto.errors import InvalidRequest
from mizuoto.nn.lora import (
    LoRASettings,
    apply_lora,
    check_lora_numbers,
    freeze_all_but_lora,
    kaiming_init_a,
)


def _targets(instance, attribute, value) -> None:
    if value is not None and not (isinstance(value, (list, tuple)) and value
                                  and all(isinstance(n, str) and n for n in value)):
        raise InvalidRequest("params.lora_targets", f"must be a list of module names, got "
                             f"{value!r}")


def lora_number(instance, attribute, value) -> None:
    """An attrs validator of a params field ``lora_r``, ``lora_alpha`` or ``lora_dropout``
    (`check_lora_numbers`' ranges)."""
    check_lora_numbers({attribute.name: value}, prefix="params.",
                       names={"r": "lora_r", "alpha": "lora_alpha", "dropout": "lora_dropout"})


# unslotted: mixed into a trainer's (slotted) params class beside core's TrainerParams
@attrs.frozen(slots=False)
class LoRAParams:
    """A ``lora`` run's params, mixed into a trainer's params class: ``lora_r`` (rank),
    ``lora_alpha`` (the update is scaled by alpha / r), ``lora_dropout`` (on the update while
    training) and ``lora_targets`` (module names, peft's ``target_modules``; default the
    engine's declared targets). None: the trainer's default."""

    lora_r: int | None = attrs.field(default=None, validator=lora_number)
    lora_alpha: float | None = attrs.field(default=None, validator=lora_number)
    lora_dropout: float | None = attrs.field(default=None, validator=lora_number)
    lora_targets: list[str] | tuple[str, ...] | None = attrs.field(default=None,
                                                                   validator=_targets)

    def lora_settings(self, targets: LoRATargets, *, r: int = 8, alpha: float = 16,
                      dropout: float = 0.0) -> LoRASettings:
        """The run's settings over the trainer's defaults (``r``, ``alpha``, ``dropout``,
        the engine's default targets)."""
        return LoRASettings(r=int(self.lora_r or r),
                            alpha=alpha if self.lora_alpha is None else self.lora_alpha,
                            dropout=dropout if self.lora_dropout is None else self.lora_dropout,
                            target_modules=tuple(self.lora_targets or targets.default))

    def lora_given(self) -> list[str]:
        return [f.name for f in attrs.fields(LoRAParams) if getattr(self, f.name) is not None]


def add_adapters(root: nn.Module, settings: LoRASettings, targets: LoRATargets,
                 generator: torch.Generator) -> tuple[LoRASettings, list[nn.Parameter]]:
    """Wrap the modules of ``root`` that ``settings`` names (checked against ``targets``) with
    ``lora_A`` Kaiming-uniform from ``generator`` (peft's and upstream VoxCPM's init) and
    ``lora_B`` zero, so that the model starts as its base; freeze everything else. Returns the
    settings with the resolved module paths and the parameters that train."""
    paths = targets.paths(root, settings.target_modules, field="params.lora_targets")
    apply_lora(root, paths, settings.r, settings.alpha, settings.dropout,
               init_a=kaiming_init_a(generator))
    return attrs.evolve(settings, target_modules=tuple(paths)), freeze_all_but_lora(root)


@attrs.frozen
class LoRATrainerParams(TrainerParams, LoRAParams):
    """The shared params and a ``lora`` run's: the params of a `StepTrainer` that declares
    ``lora_targets`` and has no params of its own."""


def lora_run_settings(method: str, params: LoRAParams, targets: LoRATargets, *,
                      defaults: LoRASettings, keeps: Mapping[str, Any] | None = None
                      ) -> LoRASettings | None:
    """A run's adapters (None unless ``method`` is ``lora``): ``params``' ``lora_*`` over
    ``defaults`` (targets: the engine's declared). A ``lora_*`` param of another method's run is
    refused by name, and so is a param of ``keeps`` (name to the value a lora run must leave:
    settings that change the base model's shape or weights)."""
    if method != "lora":
        given = params.lora_given()
        if given:
            raise InvalidRequest(f"params.{given[0]}", "applies to --method lora only",
                                 "leave it out, or train with --method lora")
        return None
    for name, value in (keeps or {}).items():
        if getattr(params, name) != value:
            raise InvalidRequest(f"params.{name}", "a LoRA adapts the base model as it is: its "
                                 "vocabulary and weights stay", "leave it out, or train with "
                                 "--method full")
    return params.lora_settings(targets, r=defaults.r, alpha=defaults.alpha,
                                dropout=defaults.dropout)


def adapter_tensors(weights: Mapping[str, torch.Tensor], targets: LoRATargets
                    ) -> dict[str, torch.Tensor]:
    """The ``lora_A``/``lora_B`` tensors of a trained model's ``weights`` (its state dict), by
    their paths under the declared ``targets.module``."""
    prefix = f"{targets.module}." if targets.module else ""
    return {key[len(prefix):]: value for key, value in weights.items()
            if key.startswith(prefix) and key.rsplit(".", 1)[-1] in ("lora_A", "lora_B")}


def write_lora_export(folder: Path, weights: Mapping[str, torch.Tensor],
                      settings: LoRASettings, targets: LoRATargets, *, engine: str,
                      base_model: str, base_fingerprint: str) -> Path:
    """A lora run's export: the adapter alone (:func:`mizuoto.adapters.write_adapter`, in the
    declared format) from the trained model's ``weights``, its targets the wrapped modules'
    paths, naming its base model (a directory by its absolute path: the adapter loads from
    anywhere) and the base weights' fingerprint, which `AdapterHost.set_lora` checks."""
    tensors = adapter_tensors(weights, targets)
    if not tensors:
        raise InvalidRequest("method", "the run's checkpoint holds no adapters",
                             "export a run trained with --method lora")
    paths = list(dict.fromkeys(key.rpartition(".")[0] for key in tensors))
    model = Path(base_model)
    named = str(model.resolve()) if model.is_dir() else str(base_model)
    return write_adapter(folder, tensors, attrs.evolve(settings, target_modules=paths),
                         engine=engine, base_model=named, base_fingerprint=base_fingerprint,
                         fmt=targets.format)
