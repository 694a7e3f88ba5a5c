"""An adapter's files, read without torch: which files make a directory an adapter
(:class:`AdapterFormat`; peft's by default) and the base model a peft adapter names
(:func:`adapter_base`), so that ``mizuoto.load(ADAPTER_DIR)`` can find its base before anything
heavy is imported. The layers, loading and hot-swap are :mod:`mizuoto.adapters`."""

from __future__ import annotations

from pathlib import Path

import attrs

from mizuoto.errors import CheckpointMismatch, InvalidRequest
from mizuoto.json_files import JSONFileError, read_json


@attrs.frozen
class AdapterFormat:
    """The files that make a directory an adapter: its weights and its config. The default is
    peft's; an engine whose upstream writes others names them here."""

    weights_file: str = "adapter_model.safetensors"
    config_file: str = "adapter_config.json"
    #: what wraps the model's tensor key (``<module>.lora_A``) in the weights file
    key_prefix: str = "base_model.model."
    key_suffix: str = ".weight"
    #: the config's key naming the base model, and the object holding the LoRA settings
    #: (None: the config's top level)
    base_model_key: str = "base_model_name_or_path"
    settings_key: str | None = None
    #: whether the weights alone (no config file) are an adapter (its reader's defaults)
    config_required: bool = True

    def file_key(self, key: str) -> str:
        """The weights file's key of the model's tensor ``key``."""
        return f"{self.key_prefix}{key}{self.key_suffix}"

    def model_key(self, key: str, source: str) -> str:
        """The model's key of the weights file's ``key`` (refused by name when not this
        format's)."""
        if not (key.startswith(self.key_prefix) and key.endswith(self.key_suffix)):
            raise CheckpointMismatch(source, unexpected=[key], detail="keys are "
                                     f"{self.file_key('<module>.lora_A')} / .lora_B")
        return key[len(self.key_prefix):len(key) - len(self.key_suffix)]

    def holds(self, directory: Path) -> bool:
        """Whether ``directory`` holds an adapter in this format (its weights file)."""
        return (Path(directory) / self.weights_file).is_file()


PEFT_FORMAT = AdapterFormat()


def adapter_base(path: str | Path) -> tuple[str, str | None] | None:
    """``(base model, engine)`` that the peft adapter in directory ``path`` names, or None when
    ``path`` is not one (so that ``mizuoto.load(ADAPTER_DIR)`` loads its base and applies it)."""
    directory = Path(path).expanduser()
    config_file = directory / PEFT_FORMAT.config_file
    if not (directory.is_dir() and PEFT_FORMAT.holds(directory) and config_file.is_file()):
        return None
    try:  # a file from outside: bounded nesting and integers, duplicate keys refused
        info = read_json(config_file)
    except (OSError, JSONFileError) as exc:
        raise CheckpointMismatch(str(config_file), detail=f"cannot read it: {exc}") from exc
    base = info.get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise InvalidRequest("model", f"{directory} is an adapter that names no base model "
                             "(base_model_name_or_path)", "load its base model and apply the "
                             "adapter with --lora")
    own = info.get("mizuoto") if isinstance(info.get("mizuoto"), dict) else {}
    return base, own.get("engine")
