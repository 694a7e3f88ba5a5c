"""LoRA on VoxCPM's linear layers in upstream's format: which layers its ``LoRAConfig`` names
(per LM, local DiT and projections) and its files.

The layers, their arithmetic (``linear(x) + dropout(x Aᵀ Bᵀ) · alpha / r``, never merged), the
checks of a LoRA's numbers and tensors and the swap on a loaded model are core's
(`mizuoto.nn.lora`, `mizuoto.adapters`), which took upstream's ``voxcpm.modules.layers.lora``
layout. VoxCPM keeps upstream's files, so that its LoRAs and ours load in either:
``lora_weights.safetensors`` (upstream's key names, e.g.
``base_lm.layers.0.self_attn.q_proj.lora_A``) and ``lora_config.json``
(``{"base_model": ..., "lora_config": {...}}``), declared as :data:`ADAPTER_FORMAT` and read
into core's `Adapter` by :func:`read_adapter`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import nn

from mizuoto.adapters import (
    Adapter,
    AdapterFormat,
    LoRATargets,
    read_adapter_files,
    write_adapter_files,
)
from mizuoto.nn import lora as core
from mizuoto.nn.lora import (  # noqa: F401 (re-exported: VoxCPM's LoRA names)
    MAX_RANK,
    LoRALinear,
    LoRASettings,
    check_lora_numbers,
    kaiming_init_a,
    lora_state_dict,
    remove_lora,
)
from mizuoto.validation import check_known_keys

WEIGHTS_FILE = "lora_weights.safetensors"
CONFIG_FILE = "lora_config.json"
#: upstream VoxCPM's files (its trainer writes them, its ``VoxCPM(lora_weights_path=...)``
#: reads them): kept so that a LoRA trained by either loads in the other
ADAPTER_FORMAT = AdapterFormat(
    weights_file=WEIGHTS_FILE, config_file=CONFIG_FILE, key_prefix="", key_suffix="",
    base_model_key="base_model", settings_key="lora_config", config_required=False)
ATTENTION = ("q_proj", "v_proj", "k_proj", "o_proj")
PROJECTIONS = ("enc_to_lm_proj", "lm_to_dit_proj", "res_to_dit_proj")
# VoxCPM2's LoRAConfig adds its fusion projection to the default targets
PROJECTIONS_V2 = (*PROJECTIONS, "fusion_concat_proj")
# every name a target list can usefully hold: the linear layers of a MiniCPM block (both LMs),
# of the local DiT (its block layers plus its input, condition, output and time-MLP layers),
# and the model's own linear attributes (upstream skips a name that matches no linear layer)
LM_LINEARS = (*ATTENTION, "gate_proj", "up_proj", "down_proj")
DIT_LINEARS = (*LM_LINEARS, "in_proj", "cond_proj", "out_proj", "linear_1", "linear_2")
HEADS = ("stop_proj", "stop_head")


def target_names(is_v2: bool) -> dict[str, tuple[str, ...]]:
    """The layer names each ``LoRAConfig`` target list may name, by field."""
    return {"target_modules_lm": LM_LINEARS, "target_modules_dit": DIT_LINEARS,
            "target_proj_modules": (*(PROJECTIONS_V2 if is_v2 else PROJECTIONS), *HEADS)}


@attrs.frozen
class LoRAConfig:
    """Upstream's ``LoRAConfig`` (VoxCPM2's default ``target_proj_modules`` add
    ``fusion_concat_proj``: build it with :func:`lora_config_for`)."""

    enable_lm: bool = False
    enable_dit: bool = False
    enable_proj: bool = False
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules_lm: tuple[str, ...] = attrs.field(default=ATTENTION, converter=tuple)
    target_modules_dit: tuple[str, ...] = attrs.field(default=ATTENTION, converter=tuple)
    target_proj_modules: tuple[str, ...] = attrs.field(default=PROJECTIONS, converter=tuple)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoRAConfig:
        check_known_keys(cls, data, "lora_config")
        check_lora_numbers(data, prefix="lora_config.")  # before any layer is built
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """As pydantic's ``model_dump`` writes it (lists for the name lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.asdict(self).items()}


def lora_config_for(is_v2: bool, **values: Any) -> LoRAConfig:
    """A LoRAConfig with the defaults of the generation's upstream class."""
    if is_v2:
        values.setdefault("target_proj_modules", PROJECTIONS_V2)
    return LoRAConfig(**values)


# upstream's 2.0.3 `VoxCPM(lora_weights_path=...)` builds this when no config is passed
INFERENCE_DEFAULT = dict(enable_lm=True, enable_dit=True, enable_proj=False)

#: VoxCPM's declaration (`mizuoto.adapters.LoRATargets`): upstream's default targets (the
#: attention of both LMs and the local DiT), the modules its ``LoRAConfig`` can name, its files
LORA_TARGETS = LoRATargets(
    default=tuple(f"{root}.*.{name}" for root in ("base_lm", "residual_lm",
                                                  "feat_decoder.estimator")
                  for name in ATTENTION),
    allowed=("base_lm.*", "residual_lm.*", "feat_decoder.estimator.*", *PROJECTIONS_V2,
             *HEADS),
    format=ADAPTER_FORMAT)


def target_paths(model: nn.Module, config: LoRAConfig) -> list[str]:
    """The module paths of the layers ``config`` wraps, in upstream's order of construction
    (the order of the trainer's Kaiming draws)."""
    roots = []
    if config.enable_lm:
        roots += [("base_lm", config.target_modules_lm),
                  ("residual_lm", config.target_modules_lm)]
    if config.enable_dit:
        roots.append(("feat_decoder.estimator", config.target_modules_dit))
    paths = [f"{root}.{path}" for root, names in roots
             for path, module in model.get_submodule(root).named_modules()
             if isinstance(module, (nn.Linear, LoRALinear)) and path.split(".")[-1] in names]
    if config.enable_proj:  # upstream skips a name that is no linear layer of the model
        paths += [name for name in config.target_proj_modules
                  if isinstance(getattr(model, name, None), (nn.Linear, LoRALinear))]
    return paths


def settings_of(model: nn.Module, config: LoRAConfig) -> LoRASettings:
    """Core's `LoRASettings` of ``config`` on ``model`` (its targets as module paths)."""
    return LoRASettings(r=config.r, alpha=config.alpha, dropout=config.dropout,
                        target_modules=target_paths(model, config))


def apply_lora(model: nn.Module, config: LoRAConfig,
               init_a: Callable[[torch.Tensor], None] | None = None) -> list[LoRALinear]:
    """Wrap the configured layers of ``model`` in place (core's `apply_lora`; ``init_a``: the
    trainer's Kaiming draw, in upstream's order). Returns the new layers."""
    return core.apply_lora(model, target_paths(model, config), config.r, config.alpha,
                           config.dropout, init_a=init_a)


def read_lora_dir(path: str | Path, *, is_v2: bool
                  ) -> tuple[LoRAConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """``(config, tensors, lora_config.json)`` of a LoRA directory (or a weights file beside its
    config; core reads the declared format). Without ``lora_config.json`` the config is
    upstream's inference default."""
    def config_of(values: dict[str, Any] | None) -> LoRAConfig:
        if values is None:
            return lora_config_for(is_v2, **INFERENCE_DEFAULT)
        LoRAConfig.from_dict(values)  # names the unknown keys
        return lora_config_for(is_v2, **values)

    config, info, tensors = read_adapter_files(path, ADAPTER_FORMAT, config_of)
    return config, tensors, info


def write_lora_dir(directory: Path, model: nn.Module, config: LoRAConfig,
                   base_model: str | None) -> None:
    """Write ``lora_weights.safetensors`` and ``lora_config.json`` as upstream's trainer does."""
    write_adapter_files(directory, lora_state_dict(model),
                        {"base_model": base_model, "lora_config": config.to_dict()},
                        ADAPTER_FORMAT)


def read_adapter(path: str | Path, model: nn.Module, *, is_v2: bool) -> Adapter:
    """The LoRA in ``path`` (upstream's files, :func:`read_lora_dir`) as core's `Adapter` on
    ``model``; core checks and swaps it in (`mizuoto.adapters.AdapterHost.set_lora`)."""
    config, tensors, info = read_lora_dir(path, is_v2=is_v2)
    settings = settings_of(model, config)
    return Adapter(str(path), settings, tensors, info.get(ADAPTER_FORMAT.base_model_key))
