"""LoRA on VoxCPM's linear layers in upstream's format: which layers its ``LoRAConfig`` names
(per LM, local DiT and projections) and its files.

The layers, their arithmetic (``linear(x) + dropout(x Aᵀ Bᵀ) · alpha / r``, never merged) and
the checks of a LoRA's tensors are core's (`mizuoto.nn.lora`), which took upstream's
``voxcpm.modules.layers.lora`` layout. VoxCPM keeps upstream's files, so that its LoRAs and
ours load in either: ``lora_weights.safetensors`` (upstream's key names, e.g.
``base_lm.layers.0.self_attn.q_proj.lora_A``) and ``lora_config.json``
(``{"base_model": ..., "lora_config": {...}}``), declared as :data:`ADAPTER_FORMAT`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import nn

from mizuoto.adapters import AdapterFormat, LoRATargets
from mizuoto.errors import CheckpointMismatch, InvalidRequest, ModelFilesMissing
from mizuoto.nn.lora import (  # noqa: F401 (re-exported: VoxCPM's LoRA names)
    MAX_RANK,
    LoRALinear,
    check_lora_numbers,
    kaiming_init_a,
    load_lora_tensors,
    lora_state_dict,
    remove_lora,
)

WEIGHTS_FILE = "lora_weights.safetensors"
CONFIG_FILE = "lora_config.json"
#: upstream VoxCPM's files (its trainer writes them, its ``VoxCPM(lora_weights_path=...)``
#: reads them): kept so that a LoRA trained by either loads in the other
ADAPTER_FORMAT = AdapterFormat(weights_file=WEIGHTS_FILE, config_file=CONFIG_FILE)
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
        known = {f.name for f in attrs.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidRequest("lora_config", f"unknown keys {unknown}")
        _check_numbers(data)
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """As pydantic's ``model_dump`` writes it (lists for the name lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.asdict(self).items()}


def _check_numbers(data: dict[str, Any]) -> None:
    """``r``, ``alpha`` and ``dropout`` of a (possibly downloaded) lora_config, typed and in range
    before any layer is built."""
    check_lora_numbers(data, prefix="lora_config.")


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


def _targets(model: nn.Module, config: LoRAConfig) -> Iterator[tuple[nn.Module, str]]:
    """(parent, attribute) of each layer to wrap, in upstream's order of construction."""
    roots = []
    if config.enable_lm:
        roots += [(model.base_lm, config.target_modules_lm),
                  (model.residual_lm, config.target_modules_lm)]
    if config.enable_dit:
        roots.append((model.feat_decoder.estimator, config.target_modules_dit))
    for root, names in roots:
        for full_name, module in list(root.named_modules()):
            short = full_name.split(".")[-1]
            if isinstance(module, nn.Linear) and short in names:
                parent = root.get_submodule(full_name.rpartition(".")[0])
                yield parent, short
    if config.enable_proj:
        for name in config.target_proj_modules:
            if isinstance(getattr(model, name, None), nn.Linear):
                yield model, name


def apply_lora(model: nn.Module, config: LoRAConfig,
               init_a: Callable[[torch.Tensor], None] | None = None) -> list[LoRALinear]:
    """Wrap the configured layers of ``model`` in place; ``lora_B`` starts at zero, ``lora_A``
    at zero unless ``init_a`` fills it (the trainer's Kaiming draw). Returns the new layers."""
    if config.r <= 0:
        raise InvalidRequest("lora.r", f"must be positive, got {config.r}")
    layers = []
    for parent, name in list(_targets(model, config)):
        layer = LoRALinear(getattr(parent, name), config.r, config.alpha, config.dropout)
        if init_a is not None:
            init_a(layer.lora_A)
        setattr(parent, name, layer)
        layers.append(layer)
    return layers


def lora_layers(model: nn.Module) -> list[LoRALinear]:
    return [m for m in model.modules() if isinstance(m, LoRALinear)]


def read_lora_dir(path: str | Path, *, is_v2: bool
                  ) -> tuple[LoRAConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """``(config, tensors, lora_config.json)`` of a LoRA directory (or a weights file beside its
    config). Without ``lora_config.json`` the config is upstream's inference default."""
    from safetensors.torch import load_file

    path = Path(path)
    directory = path if path.is_dir() else path.parent
    weights = path / WEIGHTS_FILE if path.is_dir() else path
    if not weights.is_file():
        raise ModelFilesMissing(str(directory), [WEIGHTS_FILE], "a LoRA directory holds the "
                                "LoRA weights and lora_config.json")
    info: dict[str, Any] = {}
    config = lora_config_for(is_v2, **INFERENCE_DEFAULT)
    if (directory / CONFIG_FILE).is_file():
        try:
            from mizuoto.settings_files import parse_settings

            info = parse_settings((directory / CONFIG_FILE).read_text(encoding="utf-8"),
                                  "json", CONFIG_FILE)
            if not isinstance(info, dict):
                raise ValueError(f"must hold a JSON object, not {type(info).__name__}")
            values = info.get("lora_config", {})
            if not isinstance(values, dict):
                raise ValueError("lora_config must be an object")
            LoRAConfig.from_dict(values)  # names the unknown keys
            config = lora_config_for(is_v2, **values)
        except (ValueError, TypeError) as exc:
            raise CheckpointMismatch(str(directory / CONFIG_FILE), detail=str(exc)) from exc
    try:
        tensors = load_file(str(weights), device="cpu")
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointMismatch(str(weights), detail=f"cannot read it: {exc}") from exc
    return config, tensors, info


def write_lora_dir(directory: Path, model: nn.Module, config: LoRAConfig,
                   base_model: str | None) -> None:
    """Write ``lora_weights.safetensors`` and ``lora_config.json`` as upstream's trainer does."""
    from mizuoto.runtime.atomic import atomic_path, save_safetensors

    directory.mkdir(parents=True, exist_ok=True)
    save_safetensors(lora_state_dict(model), directory / WEIGHTS_FILE)
    info = {"base_model": base_model, "lora_config": config.to_dict()}
    with atomic_path(directory / CONFIG_FILE) as tmp:
        tmp.write_text(json.dumps(info, indent=2, ensure_ascii=False), encoding="utf-8")


@attrs.frozen
class AttachedLoRA:
    """A LoRA applied to a loaded model: where it came from and what identifies it."""

    path: str
    config: LoRAConfig
    digest: str


def _digest(directory: Path, tensors: dict[str, torch.Tensor], config: LoRAConfig) -> str:
    import hashlib

    digest = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode())
    for key in sorted(tensors):
        digest.update(key.encode())
        digest.update(tensors[key].to(torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def attach_lora(model: nn.Module, path: str | Path, *, is_v2: bool,
                current: AttachedLoRA | None = None) -> AttachedLoRA:
    """Apply the LoRA in ``path`` to ``model`` (replacing ``current``), as upstream's
    ``VoxCPM(lora_config=<its lora_config.json>, lora_weights_path=path)`` applies it: the
    layers wrapped, never merged, the tensors copied into the model's dtype. On failure the
    model is left as it was."""
    config, tensors, _ = read_lora_dir(path, is_v2=is_v2)
    if current is not None and current.config == config:
        snapshot = lora_state_dict(model)
        try:
            load_lora_tensors(model, tensors, str(path))
        except Exception:
            load_lora_tensors(model, snapshot, current.path)
            raise
        return AttachedLoRA(str(path), config, _digest(Path(path), tensors, config))
    previous = lora_state_dict(model) if current is not None else None
    if current is not None:
        remove_lora(model)
    apply_lora(model, config)
    try:
        load_lora_tensors(model, tensors, str(path))
    except Exception:
        remove_lora(model)
        if current is not None:
            apply_lora(model, current.config)
            load_lora_tensors(model, previous, current.path)
        raise
    return AttachedLoRA(str(path), config, _digest(Path(path), tensors, config))
