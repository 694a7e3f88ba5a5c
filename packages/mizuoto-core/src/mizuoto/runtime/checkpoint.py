"""Reading checkpoint files and loading them strictly, with errors that name the keys.

Upstream loaders often use ``strict=False``, where a missing key silently keeps its random
init. Mizuoto loads strictly and, before touching the module, reports every missing key,
unexpected key and shape mismatch in one :class:`~mizuoto.errors.CheckpointMismatch`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from mizuoto.errors import CheckpointMismatch, ModelFilesMissing

SAFETENSORS_SUFFIXES = (".safetensors",)
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def load_state_dict_file(
    path: str | Path,
    key: str | Sequence[str] | None = None,
) -> dict[str, Tensor]:
    """Tensors of a ``.safetensors`` or torch pickle (``.pt``, ``.pth``, ``.bin``, ``.ckpt``) file.

    Pickles are read with ``weights_only=True`` onto the CPU. ``key`` selects a nested dict,
    e.g. ``"state_dict"``, a dotted path ``"model.ema"``, or several candidates tried in order
    (``("ema_model_state_dict", "model_state_dict")``). A missing file raises
    :class:`ModelFilesMissing`; an unreadable one or a missing key :class:`CheckpointMismatch`.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelFilesMissing(str(path.parent), [path.name])
    suffix = path.suffix.lower()
    try:
        if suffix in SAFETENSORS_SUFFIXES:
            from safetensors.torch import load_file

            data = load_file(str(path), device="cpu")
        elif suffix in PICKLE_SUFFIXES:
            data = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise CheckpointMismatch(
                str(path), detail=f"unknown checkpoint type {suffix!r}; use .safetensors or "
                f"one of {', '.join(PICKLE_SUFFIXES)}")
    except CheckpointMismatch:
        raise
    except Exception as exc:  # safetensors / pickle errors have no common base class
        raise CheckpointMismatch(str(path), detail=f"cannot read it: {exc}") from exc
    if key is not None:
        data = _select(data, key, path)
    if not isinstance(data, Mapping):
        raise CheckpointMismatch(str(path), detail=f"holds a {type(data).__name__}, not a "
                                 "state dict")
    nested = [k for k, v in data.items() if not isinstance(v, Tensor)]
    if nested:
        raise CheckpointMismatch(str(path), detail=f"entries that are not tensors: "
                                 f"{', '.join(map(str, nested[:8]))}; select one with key=")
    return dict(data)


def load_into(module: nn.Module, state_dict: Mapping[str, Tensor], path: str | Path) -> nn.Module:
    """Load ``state_dict`` into ``module`` strictly; return the module.

    Missing keys, unexpected keys and shape mismatches are all collected first and raised
    together as :class:`CheckpointMismatch` naming ``path``; nothing is loaded then.
    """
    expected = module.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    shapes = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)}, model {tuple(expected[k].shape)}"
        for k in expected
        if k in state_dict and tuple(state_dict[k].shape) != tuple(expected[k].shape)
    ]
    if missing or unexpected or shapes:
        raise CheckpointMismatch(str(path), missing=missing, unexpected=unexpected,
                                 shapes=shapes)
    module.load_state_dict(state_dict, strict=True)
    return module


def _select(data: object, key: str | Sequence[str], path: Path) -> object:
    candidates = [key] if isinstance(key, str) else list(key)
    for candidate in candidates:
        if isinstance(data, Mapping) and candidate in data:
            return data[candidate]
        node = data
        for part in candidate.split("."):
            if not isinstance(node, Mapping) or part not in node:
                break
            node = node[part]
        else:
            return node
    top = ", ".join(map(str, data)) if isinstance(data, Mapping) else type(data).__name__
    raise CheckpointMismatch(str(path), detail=f"has no {' or '.join(map(repr, candidates))} "
                             f"(top-level keys: {top})")
