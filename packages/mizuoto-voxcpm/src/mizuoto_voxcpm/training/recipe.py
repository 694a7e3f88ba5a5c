"""Upstream's fine-tuning recipes (``conf/<model>/voxcpm_finetune_{all,lora}.yaml``, VoxCPM
2.0.3) and how a ``TrainingConfig`` fills them.

``steps`` sets ``num_iters``, and ``max_steps`` (the cosine schedule's length) too unless
``params`` names it (every recipe has them equal; upstream's ``max_steps: 0`` also means
``num_iters``); ``learning_rate``, ``batch_size`` and ``seed`` come from the config. Everything
else comes from the recipe of the model's generation unless ``params`` names it (``None`` also
means "the recipe's value"; ``max_grad_norm: 0`` turns clipping off, as upstream's ``0``).
LoRA's settings are upstream's ``lora:`` keys prefixed ``lora_``. ``val_manifest`` (a path; unset
or empty: no validation) and ``valid_interval`` turn on upstream's validation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from mizuoto.contracts import TrainingConfig
from mizuoto.errors import InvalidRequest
from mizuoto.training import warn_long_warmup
from mizuoto.validation.ranges import check_names
from mizuoto_voxcpm.lora import LoRAConfig, lora_config_for, target_names
from mizuoto_voxcpm.training.params import VoxCPMTrainingParams

UPSTREAM_SEED = 42  # upstream's Accelerator(seed=42), whatever the yaml says
_COMMON = {"weight_decay": 0.01, "warmup_steps": 100, "max_batch_tokens": 8192,
           "lambda_diff": 1.0, "lambda_stop": 1.0, "learning_rate": {"full": 1e-5, "lora": 1e-4}}
# per generation (0.5B and 1.5 share theirs): the script's default max_grad_norm (0: clip at
# 1e9) unless the yaml sets it
_V1 = {**_COMMON, "grad_accum_steps": 1, "max_grad_norm": 0.0, "batch_size": 16,
       "num_iters": 2000, "lora_r": 8, "lora_alpha": 16, "save_interval": 1000,
       "valid_interval": 1000}
RECIPES: dict[str, dict[str, Any]] = {
    "voxcpm-0.5b": _V1, "voxcpm-1.5": _V1,
    "voxcpm2": {**_COMMON, "grad_accum_steps": 8, "max_grad_norm": 1.0, "batch_size": 2,
                "num_iters": 1000, "lora_r": 32, "lora_alpha": 32, "save_interval": 500,
                "valid_interval": 500},
}
#: upstream's script default: validate every this many steps (and after the last)
VALID_INTERVAL = 1000
# which enable flag each target list belongs to
_TARGET_FLAG = {"target_modules_lm": "enable_lm", "target_modules_dit": "enable_dit",
                "target_proj_modules": "enable_proj"}


def generation_of(raw_config: Mapping[str, Any]) -> str:
    if str(raw_config.get("architecture", "voxcpm")).lower() == "voxcpm2":
        return "voxcpm2"
    rate = (raw_config.get("audio_vae_config") or {}).get("sample_rate", 16000)
    return "voxcpm-1.5" if rate == 44100 else "voxcpm-0.5b"


@attrs.frozen
class Recipe:
    """One run's hyper-parameters, named as upstream's script names them."""

    method: str
    num_iters: int
    max_steps: int
    learning_rate: float
    batch_size: int
    seed: int
    weight_decay: float
    warmup_steps: int
    max_batch_tokens: int
    grad_accum_steps: int
    max_grad_norm: float
    lambdas: dict[str, float]
    lora: LoRAConfig | None
    #: the validation manifest (None: no validation) and how often it runs
    val_manifest: str | None = None
    valid_interval: int = VALID_INTERVAL

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self, recurse=False)
        data["lora"] = self.lora.to_dict() if self.lora else None
        if self.val_manifest is None:  # run.json as before validation existed
            del data["val_manifest"], data["valid_interval"]
        return data


def build_recipe(config: TrainingConfig, generation: str,
                 params: VoxCPMTrainingParams | None = None) -> Recipe:
    """The run's recipe: ``config.params`` (`VoxCPMTrainingParams`, every key checked; or
    ``params``, already checked) over the generation's."""
    base = RECIPES[generation]
    if params is None:
        params = VoxCPMTrainingParams.parse(config.params, trainer="VoxCPM")
    if config.method == "full" and params.lora_given():
        raise InvalidRequest("params", f"{params.lora_given()} apply to method 'lora' only")

    def pick(name: str, kind: type):
        value = getattr(params, name)
        return kind(base.get(name, 0) if value is None else value)

    lora = None
    if config.method == "lora":
        flags = {k: default if getattr(params, f"lora_{k}") is None
                 else getattr(params, f"lora_{k}")
                 for k, default in (("enable_lm", True), ("enable_dit", True),
                                    ("enable_proj", False))}
        if not any(flags.values()):
            raise InvalidRequest("params", "LoRA needs at least one of lora_enable_lm, "
                                 "lora_enable_dit, lora_enable_proj")
        targets = _lora_targets(params, flags, generation == "voxcpm2")
        lora = lora_config_for(generation == "voxcpm2", r=pick("lora_r", int),
                               alpha=pick("lora_alpha", int),
                               dropout=float(params.lora_dropout or 0.0), **flags, **targets)
    # the shared settings (None: the generation's recipe), under upstream's names here
    accum = base["grad_accum_steps"] if params.grad_accumulation is None \
        else params.grad_accumulation
    interval = VALID_INTERVAL if params.valid_interval is None else int(params.valid_interval)
    max_steps = config.steps if params.max_steps is None else int(params.max_steps)
    warmup = base["warmup_steps"] if params.warmup_updates is None else params.warmup_updates
    warn_long_warmup("warmup_updates", warmup, steps=config.steps, schedule=max_steps,
                     learning_rate=float(config.learning_rate))
    return Recipe(
        method=config.method, num_iters=config.steps, max_steps=max_steps,
        learning_rate=float(config.learning_rate), batch_size=config.batch_size,
        seed=config.seed, weight_decay=pick("weight_decay", float),
        warmup_steps=warmup, max_batch_tokens=pick("max_batch_tokens", int),
        grad_accum_steps=accum, max_grad_norm=float(base["max_grad_norm"]
                                                    if params.max_grad_norm is None
                                                    else params.max_grad_norm),
        lambdas={"loss/diff": pick("lambda_diff", float), "loss/stop": pick("lambda_stop", float)},
        lora=lora, val_manifest=str(params.val_manifest) if params.val_manifest else None,
        valid_interval=interval)


def _lora_targets(params: VoxCPMTrainingParams, flags: dict[str, bool], is_v2: bool
                  ) -> dict[str, tuple[str, ...]]:
    """The target lists ``params`` sets (the others keep upstream's defaults), each a
    non-empty list of distinct layer names of its part of the model, for an enabled part."""
    targets = {}
    for field, allowed in target_names(is_v2).items():
        value = getattr(params, f"lora_{field}")
        if value is None:
            continue
        where = f"params.lora_{field}"
        targets[field] = check_names(where, value, allowed, "layer names")
        if not flags[_TARGET_FLAG[field]]:
            raise InvalidRequest(where, f"applies only with lora_{_TARGET_FLAG[field]} true")
    return targets


def cli_defaults(method: str, generation: str) -> dict[str, Any]:
    """A command-line run's recipe: the yaml of the generation and method (its learning rate,
    batch size, iterations, save and validation intervals; every ``step_<N>`` folder kept, as
    upstream keeps them) and upstream's seed, 42."""
    base = RECIPES[generation]
    return {"steps": base["num_iters"], "learning_rate": base["learning_rate"][method],
            "batch_size": base["batch_size"], "seed": UPSTREAM_SEED,
            "save_every": base["save_interval"],
            "params": {"valid_interval": base["valid_interval"], "keep_last_n_checkpoints": -1,
                       "checkpoint_every": base["save_interval"]}}


#: yaml keys that carry over under another name (``lora:`` and ``lambdas:`` are tables)
_YAML_RENAMED = {"num_iters": "steps", "pretrained_path": "model",
                 "train_manifest": "dataset", "save_interval": "save_every"}
#: yaml keys with no effect on what is trained here (data loader workers, log cadence,
#: where upstream writes: the run directory holds all of it)
_YAML_NO_EFFECT = ("num_workers", "log_interval", "tensorboard", "save_path",
                   "out_sample_rate", "hf_model_id", "config_path")


def translate_yaml(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Upstream's ``conf/voxcpm_v*/voxcpm_finetune_*.yaml`` keys in our terms (our own names
    pass through): a ``lora:`` table means method ``lora``; ``save_interval`` is both the
    resumable and the numbered checkpoints' cadence (upstream writes ``step_<N>`` there)."""
    import logging

    out: dict[str, Any] = {}
    for key, value in settings.items():
        if key == "lora":
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise InvalidRequest("--config lora", "must be a table of LoRA settings")
            out["method"] = "lora"
            out.update({f"lora_{k}": v for k, v in value.items()})
        elif key == "lambdas":
            if not isinstance(value, Mapping) or set(value) - {"loss/diff", "loss/stop"}:
                raise InvalidRequest("--config lambdas", "must set loss/diff and loss/stop, "
                                     f"got {value!r}")
            for name, weight in value.items():
                out[f"lambda_{name.removeprefix('loss/')}"] = weight
        elif key == "val_manifest":
            if value:  # null or "": no validation
                out["val_manifest"] = value
        elif key == "save_interval":
            out["save_every"] = out["checkpoint_every"] = value
            out.setdefault("keep_last_n_checkpoints", -1)
        elif key == "distribute":
            if value:
                raise InvalidRequest("--config distribute", "is not supported: lora_config.json "
                                     "names the base model as given with -m")
        elif key in _YAML_NO_EFFECT:
            logging.getLogger(__name__).info("--config %s: no effect here", key)
        else:  # sample_rate too: checked against the model's VAE
            out[_YAML_RENAMED.get(key, key)] = value
    return out
