"""`VoxCPMTrainingParams`: what a run's ``config.params`` may set for the VoxCPM trainer — the
settings every trainer shares (core's `TrainerParams`; upstream's ``warmup_steps`` and
``grad_accum_steps`` are read as ``warmup_updates`` and ``grad_accumulation``) and VoxCPM's
own, each declared and checked once.

None means the recipe of the model's generation (`mizuoto_voxcpm.training.recipe.RECIPES`), as
upstream's yaml: that default depends on the model, so it is applied by ``build_recipe``.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from mizuoto.contracts.trainer import TrainerParams
from mizuoto.training.lora import lora_number
from mizuoto.validation.ranges import boolean, number_at_least, path_like

_flag = boolean(prefix="params.", optional=True)


def _number(*, whole: bool = False, low: float = 0):
    return number_at_least(low, whole=whole, prefix="params.", optional=True)


@attrs.frozen
class VoxCPMTrainingParams(TrainerParams):
    """VoxCPM's own params, besides the shared ones.

    - ``weight_decay``, ``max_batch_tokens``, ``lambda_diff``, ``lambda_stop`` (the yaml's
      ``lambdas``): upstream's recipe keys.
    - ``max_steps``: the cosine schedule's length (default the run's ``steps``, as every
      recipe).
    - ``val_manifest`` (a path; none: no validation, unless the data set's folder holds one)
      and ``valid_interval`` (upstream's script default 1000): upstream's validation.
    - ``sample_rate``: checked, not tuned: upstream's yaml key must be the model's VAE rate.
    - ``preview`` (default true): after a LoRA or full export, speak ``preview.wav`` with the
      new model (its directory's defaults applied); false skips it.
    - ``lora_r``, ``lora_alpha``, ``lora_dropout`` (0), ``lora_enable_lm`` (true),
      ``lora_enable_dit`` (true), ``lora_enable_proj`` (false) and the target lists
      ``lora_target_modules_lm``, ``lora_target_modules_dit``, ``lora_target_proj_modules``
      (layer names of the model's generation, checked against it by ``build_recipe``).
    """

    weight_decay: float | None = attrs.field(default=None, validator=_number())
    max_steps: int | None = attrs.field(default=None, validator=_number(whole=True))
    max_batch_tokens: int | None = attrs.field(default=None, validator=_number(whole=True))
    lambda_diff: float | None = attrs.field(default=None, validator=_number())
    lambda_stop: float | None = attrs.field(default=None, validator=_number())
    val_manifest: str | Path | None = attrs.field(default=None, validator=path_like(prefix="params.", optional=True))
    valid_interval: int | None = attrs.field(default=None,
                                             validator=_number(whole=True, low=1))
    sample_rate: int | None = attrs.field(default=None, validator=_number(whole=True, low=1))
    preview: bool = attrs.field(default=True, validator=boolean(prefix="params."))
    lora_r: int | None = attrs.field(default=None, validator=_number(whole=True, low=1))
    lora_alpha: int | None = attrs.field(default=None, validator=_number(whole=True))
    lora_dropout: float | None = attrs.field(default=None, validator=lora_number)
    lora_enable_lm: bool | None = attrs.field(default=None, validator=_flag)
    lora_enable_dit: bool | None = attrs.field(default=None, validator=_flag)
    lora_enable_proj: bool | None = attrs.field(default=None, validator=_flag)
    lora_target_modules_lm: list[str] | tuple[str, ...] | None = None
    lora_target_modules_dit: list[str] | tuple[str, ...] | None = None
    lora_target_proj_modules: list[str] | tuple[str, ...] | None = None

    def lora_given(self) -> list[str]:
        """The LoRA settings this run sets."""
        return [f.name for f in attrs.fields(type(self))
                if f.name.startswith("lora_") and getattr(self, f.name) is not None]
