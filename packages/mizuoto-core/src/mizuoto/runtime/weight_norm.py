"""Folding weight-norm parameter pairs of a state dict into plain weights.

Checkpoints of weight-normed layers store a magnitude ``g`` and a direction ``v`` per weight,
under old-style names (``conv.weight_g`` / ``conv.weight_v``, ``torch.nn.utils.weight_norm``)
or parametrization names (``conv.parametrizations.weight.original0`` / ``original1``,
``torch.nn.utils.parametrizations.weight_norm``). Inference needs only ``w = g * v / ||v||``;
folding it once at load gives the same bits as removing the weight norm from the module
(both compute ``torch._weight_norm(v, g, dim)``), provided it runs on the same device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

_OLD_G, _OLD_V = "_g", "_v"
_PARAM_G, _PARAM_V = "original0", "original1"
_PARAMETRIZATIONS = "parametrizations."


def fold_weight_norm(
    state_dict: Mapping[str, Tensor],
    *,
    device: torch.device | str | None = None,
    dim: int | Callable[[str], int] | None = None,
) -> dict[str, Tensor]:
    """Return a copy of ``state_dict`` with every weight-norm pair replaced by its weight.

    ``foo.weight_g`` + ``foo.weight_v`` and ``foo.parametrizations.weight.original0`` +
    ``.original1`` become ``foo.weight``, computed on ``device`` (default: where ``v`` is)
    and left there. ``dim`` is the weight-norm dim (``weight_norm``'s argument, 0 by
    default); ``None`` reads it off ``g``'s shape (the one axis longer than 1, else 0),
    a function maps the folded key to it. Other entries are kept as they are. A ``g``
    without its ``v`` (or the reverse) raises ``KeyError``.
    """
    folded: dict[str, Tensor] = {}
    pairs: dict[str, dict[str, Tensor]] = {}
    for key, value in state_dict.items():
        target = _pair_target(key, state_dict)
        if target is None:
            folded[key] = value
            continue
        weight_key, part = target
        pairs.setdefault(weight_key, {})[part] = value
    for weight_key, pair in pairs.items():
        if set(pair) != {"g", "v"}:
            missing = "v (direction)" if "g" in pair else "g (magnitude)"
            raise KeyError(f"weight norm of {weight_key}: {missing} is missing")
        g, v = pair["g"], pair["v"]
        target_device = torch.device(device) if device is not None else v.device
        norm_dim = _norm_dim(weight_key, g, dim)
        folded[weight_key] = torch._weight_norm(v.to(target_device), g.to(target_device),
                                                norm_dim)
    return folded


def _pair_target(key: str, state_dict: Mapping[str, Tensor]) -> tuple[str, str] | None:
    """``(weight key, "g" | "v")`` if ``key`` is half of a weight-norm pair.

    Parametrization names are unambiguous; an old-style ``x_g`` only counts when ``x_v`` is
    there too (``gate_g``-like names of other parameters stay as they are).
    """
    prefix, _, leaf = key.rpartition(".")
    if _PARAMETRIZATIONS in key and leaf in (_PARAM_G, _PARAM_V):
        # "<module>.parametrizations.<name>.original0"
        owner, _, name = prefix.rpartition(".")
        if owner == "parametrizations" or owner.endswith("." + "parametrizations"):
            module = owner[: -len("parametrizations")].rstrip(".")
            weight_key = f"{module}.{name}" if module else name
            return weight_key, "g" if leaf == _PARAM_G else "v"
    for suffix, part, partner in ((_OLD_G, "g", _OLD_V), (_OLD_V, "v", _OLD_G)):
        if leaf.endswith(suffix) and len(leaf) > len(suffix):
            stem = key[: -len(suffix)]
            if stem + partner in state_dict:
                return stem, part
    return None


def _norm_dim(weight_key: str, g: Tensor, dim: int | Callable[[str], int] | None) -> int:
    if callable(dim):
        return dim(weight_key)
    if dim is not None:
        return dim
    if g.dim() == 0:
        return -1  # weight_norm(dim=None): one norm over the whole weight
    long_axes = [axis for axis, size in enumerate(g.shape) if size != 1]
    if len(long_axes) > 1:
        raise ValueError(f"weight norm of {weight_key}: g has shape {tuple(g.shape)}; "
                         "pass dim= explicitly")
    return long_axes[0] if long_axes else 0
