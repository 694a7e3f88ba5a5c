"""LoRA on VoxCPM's linear layers, as upstream's ``voxcpm.modules.layers.lora`` lays it out.

A :class:`LoRALinear` keeps the wrapped layer's ``weight``/``bias`` under the same names (base
checkpoints load unchanged) and adds ``lora_A`` (``r × in``) and ``lora_B`` (``out × r``);
the output is ``linear(x) + dropout(x Aᵀ Bᵀ) · alpha / r``, never merged into the weight.
LoRA files are ``lora_weights.safetensors`` (upstream's key names, e.g.
``base_lm.layers.0.self_attn.q_proj.lora_A``) and ``lora_config.json``
(``{"base_model": ..., "lora_config": {...}}``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.errors import CheckpointMismatch, InvalidRequest, ModelFilesMissing

WEIGHTS_FILE = "lora_weights.safetensors"
CONFIG_FILE = "lora_config.json"
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


#: far above any published VoxCPM LoRA (r 8..64) and far below a many-gigabyte allocation
MAX_RANK = 4096


def _check_numbers(data: dict[str, Any]) -> None:
    """``r``, ``alpha`` and ``dropout`` of a (possibly downloaded) lora_config, typed and in range
    before any layer is built: ``r: 1e9`` would allocate gigabytes, ``"8"`` fail deep in torch."""
    def number(name: str) -> float | None:
        value = data.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise InvalidRequest(f"lora_config.{name}", f"must be a number, got {value!r}")
        return value

    r, alpha, dropout = number("r"), number("alpha"), number("dropout")
    if r is not None and (r != int(r) or not 1 <= r <= MAX_RANK):
        raise InvalidRequest("lora_config.r", f"{r!r} must be a whole number in 1..{MAX_RANK}")
    if alpha is not None and not 0 < alpha <= 1e6:
        raise InvalidRequest("lora_config.alpha", f"{alpha!r} must be in (0, 1e6]")
    if dropout is not None and not 0 <= dropout < 1:
        raise InvalidRequest("lora_config.dropout", f"{dropout!r} must be in [0, 1)")


def lora_config_for(is_v2: bool, **values: Any) -> LoRAConfig:
    """A LoRAConfig with the defaults of the generation's upstream class."""
    if is_v2:
        values.setdefault("target_proj_modules", PROJECTIONS_V2)
    return LoRAConfig(**values)


# upstream's 2.0.3 `VoxCPM(lora_weights_path=...)` builds this when no config is passed
INFERENCE_DEFAULT = dict(enable_lm=True, enable_dit=True, enable_proj=False)


class LoRALinear(nn.Module):
    """A linear layer plus a low-rank update. ``dropout`` is applied by ``dropout_fn`` when set
    (the trainer draws its masks from its own generator), else as ``nn.Dropout`` would."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        self.in_features = base.in_features
        self.out_features = base.out_features
        self.r = r
        self.alpha = alpha
        self.dropout = dropout
        self._base_scaling = alpha / r if r > 0 else 0.0
        device, dtype = base.weight.device, base.weight.dtype
        # a float32 0-dim buffer as upstream's, rounded as its model cast rounds it
        self.register_buffer("scaling", torch.tensor(self._base_scaling).to(device, dtype),
                             persistent=False)
        self.weight = base.weight
        self.bias = base.bias
        self.lora_A = nn.Parameter(torch.zeros(r, self.in_features, device=device, dtype=dtype))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, r, device=device, dtype=dtype))
        self.dropout_fn: Callable[[torch.Tensor], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = F.linear(x, self.weight, self.bias)
        update = F.linear(F.linear(x, self.lora_A), self.lora_B)
        if self.dropout > 0 and self.training:
            update = self.dropout_fn(update) if self.dropout_fn else F.dropout(update, self.dropout)
        return result + update * self.scaling


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


def kaiming_init_a(generator: torch.Generator) -> Callable[[torch.Tensor], None]:
    """``nn.init.kaiming_uniform_(A, a=sqrt(5))`` drawn from ``generator`` (upstream's init)."""
    def init(tensor: torch.Tensor) -> None:
        with torch.no_grad():
            nn.init.kaiming_uniform_(tensor, a=math.sqrt(5), generator=generator)
    return init


def lora_layers(model: nn.Module) -> list[LoRALinear]:
    return [m for m in model.modules() if isinstance(m, LoRALinear)]


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every ``lora_*`` tensor of ``model`` by its state-dict key (what upstream saves)."""
    return {k: v for k, v in model.state_dict().items() if "lora_" in k}


def remove_lora(model: nn.Module) -> None:
    """Put the plain linear layers back (the base weights are the same tensors)."""
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear):
            parent_name, _, attr = name.rpartition(".")
            base = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                             device="meta")
            base.weight = module.weight
            base.bias = module.bias
            setattr(model.get_submodule(parent_name), attr, base)


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


def load_lora_tensors(model: nn.Module, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Copy LoRA tensors into ``model``'s LoRA parameters; every key must match in name and
    shape (upstream skips unknown keys silently and fails on a shape mismatch)."""
    params = dict(model.named_parameters())
    missing = sorted(k for k in params if "lora_" in k and k not in tensors)
    unknown = sorted(k for k in tensors if k not in params)
    shapes = sorted(k for k in tensors if k in params and tensors[k].shape != params[k].shape)
    if missing or unknown or shapes:
        raise CheckpointMismatch(source, missing=missing, unexpected=unknown, shapes=shapes,
                                 detail="the LoRA does not fit this model (rank, targets or "
                                        "base model differ)")
    with torch.no_grad():
        for key, value in tensors.items():
            params[key].copy_(value.to(params[key].device))


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
