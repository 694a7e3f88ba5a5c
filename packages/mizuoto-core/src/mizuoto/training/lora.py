"""The ``lora`` training method for any engine that declares
:class:`~mizuoto.adapters.LoRATargets`: its params (:class:`LoRAParams`), the adapters added to
a built model with only them training (:func:`add_adapters`), and the export (the adapter
alone, pointing at its base model by id and fingerprint: :func:`mizuoto.adapters.write_adapter`).
"""

from __future__ import annotations

import attrs
import torch
from torch import nn

from mizuoto.adapters import LoRATargets
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


def _numbers(instance, attribute, value) -> None:
    check_lora_numbers({attribute.name: value}, prefix="params.",
                       names={"r": "lora_r", "alpha": "lora_alpha", "dropout": "lora_dropout"})


# unslotted: mixed into a trainer's (slotted) params class beside core's TrainerParams
@attrs.frozen(slots=False)
class LoRAParams:
    """A ``lora`` run's params, mixed into a trainer's params class: ``lora_r`` (rank),
    ``lora_alpha`` (the update is scaled by alpha / r), ``lora_dropout`` (on the update while
    training) and ``lora_targets`` (module names, peft's ``target_modules``; default the
    engine's declared targets). None: the trainer's default."""

    lora_r: int | None = attrs.field(default=None, validator=_numbers)
    lora_alpha: float | None = attrs.field(default=None, validator=_numbers)
    lora_dropout: float | None = attrs.field(default=None, validator=_numbers)
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
