"""Upstream's ``f5-tts_finetune-cli`` (f5-tts 1.1.22, ``train/finetune_cli.py``) in our terms:
its defaults (`CLI_DEFAULTS`, the params a command-line run starts from) and its flag names,
which a ``--config`` file may use (`translate_finetune_cli`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mizuoto.errors import InvalidRequest

#: finetune_cli's defaults as our params
CLI_DEFAULTS = {"epochs": 100, "warmup_updates": 20000, "batch_size_type": "frame",
                "batch_frames": 3200, "max_samples": 64, "grad_accumulation": 1,
                "max_grad_norm": 1.0, "keep_last_n_checkpoints": -1, "checkpoint_every": 50000}
#: finetune_cli flags whose value carries over under another name
#: (the shared settings' upstream names, ``num_warmup_updates`` ..., are `TrainerParams`')
RENAMED = {"last_per_updates": "save_every", "tokenizer_path": "vocab_file"}
EXPERIMENTS = {"F5TTS_v1_Base": "v1_base", "F5TTS_Base": "base", "E2TTS_Base": "e2_base"}
#: flags that name what -m / --data name
RUN_FLAGS = {"pretrain": "model", "dataset_name": "dataset"}


def translate_finetune_cli(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with finetune_cli's flag names (``--learning_rate`` as ``learning_rate``,
    dashes or underscores) turned into ours; our own names pass through."""
    out: dict[str, Any] = {}
    flags = {key.lstrip("-").replace("-", "_"): value for key, value in settings.items()}
    kind = flags.get("batch_size_type", "frame")
    for key, value in flags.items():
        if key == "exp_name":
            if value not in EXPERIMENTS:
                raise InvalidRequest("--config exp_name", f"unknown experiment {value!r}",
                                     f"one of {', '.join(EXPERIMENTS)}")
            out["variant"] = EXPERIMENTS[value]
        elif key == "batch_size_per_gpu":
            out["batch_frames" if kind == "frame" else "batch_size"] = value
        elif key == "tokenizer":
            if value == "char":
                raise InvalidRequest("--config tokenizer", "the char tokenizer is not supported",
                                     "pinyin (the default) or custom with tokenizer_path")
            if value == "custom" and "tokenizer_path" not in flags:
                raise InvalidRequest("--config tokenizer", "custom needs tokenizer_path")
        elif key == "bnb_optimizer":
            if value:
                raise InvalidRequest("--config bnb_optimizer", "8-bit Adam is not supported")
        elif key in RUN_FLAGS:
            if value is not None:
                out[RUN_FLAGS[key]] = value
        else:
            out[RENAMED.get(key, key)] = value
    return out
