"""A run's recipe from the command line: ``--config FILE`` (TOML; YAML too, for upstream's own
files) and ``--param KEY=VALUE`` (repeatable), over the trainer's defaults.

Precedence, lowest first: the trainer's `Trainer.defaults` for the engine, method and model
(upstream's recipe), the config file (translated by `Trainer.upstream_recipe` when it uses
upstream's names), ``--param`` pairs, then the explicit options (``--steps`` ...). Keys that are
`TrainingConfig` fields (``steps``, ``learning_rate``, ``batch_size``, ``seed``, ``memory``,
``save_every``, ``mixed_precision``, ``compute``) set those; every other key is a trainer param, which the trainer validates
(unknown keys named). The params every trainer shares (`TrainerParams`: ``warmup_updates``,
``grad_accumulation``, ...) are read under upstream's names too (``warmup_steps``,
``grad_accum_steps``, ...) and kept under theirs; the command sets them by option as well.
``model`` and ``dataset`` in a file stand for ``-m`` and ``--data``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mizuoto.contracts.trainer import training_settings
from mizuoto.errors import InvalidRequest
from mizuoto.key_values import parse_pairs

#: the `TrainingConfig` fields a file sets: the command's settings, and ``compute``
CONFIG_FIELDS = (*(setting.name for setting in training_settings() if not setting.param),
                 "compute")
#: the shared trainer params the command sets by option (`TrainerParams`)
PARAM_SETTINGS = tuple(setting.name for setting in training_settings() if setting.param)
#: keys a file may set besides the fields and params: what ``-m``, ``--data``, ``--method`` set
RUN_KEYS = ("model", "dataset", "method")


def parse_params(pairs: Iterable[str]) -> dict[str, Any]:
    """``--param KEY=VALUE`` pairs, each value read as TOML, else as text."""
    return parse_pairs(pairs, lambda pair: InvalidRequest(
        "--param", f"expected KEY=VALUE, got {pair!r}", "e.g. --param grad_accum_steps=4"))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The settings of a TOML file (``.toml``) or YAML file (``.yaml``/``.yml``, upstream
    VoxCPM's ``conf/*.yaml``; needs PyYAML)."""
    from mizuoto.text.files import read_utf8

    path = Path(path)
    text = read_utf8(path, "--config")
    from mizuoto.settings_files import SettingsFileError, parse_settings

    kind = "yaml" if path.suffix.lower() in (".yaml", ".yml") else "toml"
    if kind == "yaml":
        try:
            import yaml  # noqa: F401 - only to name the missing extra
        except ImportError:
            raise InvalidRequest("--config", f"{path} is YAML, which needs PyYAML",
                                 "pip install pyyaml, or write the settings as TOML") from None
    try:
        data = parse_settings(text, kind, str(path))
    except SettingsFileError as exc:
        raise InvalidRequest("--config", str(exc),
                             "" if kind == "yaml" else "a .yaml/.yml file is read as YAML"
                             ) from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise InvalidRequest("--config", f"{path} must hold a table of settings, not "
                             f"{type(data).__name__}")
    return dict(data)


def split_settings(settings: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any],
                                                           dict[str, Any]]:
    """``(run keys, TrainingConfig fields, params)`` of a flat settings table."""
    run = {k: v for k, v in settings.items() if k in RUN_KEYS}
    fields = {k: v for k, v in settings.items() if k in CONFIG_FIELDS}
    params = {k: v for k, v in settings.items() if k not in RUN_KEYS and k not in CONFIG_FIELDS}
    return run, fields, params


def recipe_text(recipe: Mapping[str, Any]) -> str:
    """The effective recipe, one ``key = value`` per line, for the start of a run."""
    import json

    return "\n".join(f"  {key} = {json.dumps(value, default=str)}"
                     for key, value in recipe.items())


def training_config(trainer, *, method: str | None, model: str | None, dataset: str | None,
                    output_dir: str, config_file: str | None = None,
                    param_pairs: Iterable[str] = (), explicit: Mapping[str, Any] | None = None):
    """The `TrainingConfig` of a command-line run (see the module doc for the precedence)."""
    from mizuoto.contracts.trainer import TrainingConfig

    from_file: dict[str, Any] = {}
    if config_file is not None:
        from_file = dict(trainer.upstream_recipe(read_config_file(config_file)))
    file_run, file_fields, file_params = split_settings(from_file)
    pair_run, pair_fields, pair_params = split_settings(parse_params(param_pairs))
    if pair_run:
        raise InvalidRequest("--param", f"{', '.join(pair_run)} cannot be a --param",
                             "use -m, --data and --method")
    method = method or file_run.get("method") or "full"
    model = model or file_run.get("model")
    dataset = dataset or file_run.get("dataset")
    if model is None:
        raise InvalidRequest("model", "no model given", "pass -m MODEL (or model in --config)")
    if dataset is None:
        raise InvalidRequest("dataset", "no data set given",
                             "pass --data PATH (or dataset in --config)")
    if method not in trainer.methods:
        raise InvalidRequest("method", f"{trainer.engine} supports {sorted(trainer.methods)}, "
                             f"not {method!r}")
    defaults = dict(trainer.defaults(method, str(model)))
    default_params = dict(defaults.pop("params", {}))
    given = {k: v for k, v in (explicit or {}).items() if v is not None}
    option_params = {k: given.pop(k) for k in PARAM_SETTINGS if k in given}
    fields = {**defaults, **file_fields, **pair_fields, **given}
    unknown = sorted(set(fields) - set(CONFIG_FIELDS))
    if unknown:
        from mizuoto.settings_files import name_some

        raise InvalidRequest("--config", f"unknown settings: {name_some(unknown)}")
    shared = getattr(trainer, "params_class", None)
    canonical = shared.canonical if shared is not None else dict  # (older trainers: as given)
    params = {**canonical(default_params), **canonical(file_params), **canonical(pair_params),
              **option_params}
    return TrainingConfig(method=method, model=str(model), dataset=Path(dataset),
                          output_dir=Path(output_dir), params=params, **fields)
