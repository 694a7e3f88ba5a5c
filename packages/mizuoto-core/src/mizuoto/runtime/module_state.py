"""The state of a module that decides which kernel runs, for comparing two implementations.

Bit-exactness depends on more than arithmetic: ``F.linear`` on a non-contiguous 3-D input folds
the batch into one ``mm`` only when the weight requires grad (else ``bmm``), dropout follows
train/eval, and dtype, strides and memory format pick kernels too. ``kernel_state`` lists all of
these per parameter, buffer and module so that a parity test can compare a model loaded by
Mizuoto with the same checkpoint loaded by the upstream package, name by name.
"""

from __future__ import annotations

import torch
from torch import nn


def _tensor_state(tensor: torch.Tensor) -> dict[str, object]:
    return {
        "dtype": tensor.dtype,
        "shape": tuple(tensor.shape),
        "stride": tuple(tensor.stride()),
        "contiguous": tensor.is_contiguous(),
        "channels_last": tensor.dim() == 4
        and tensor.is_contiguous(memory_format=torch.channels_last),
        "requires_grad": tensor.requires_grad,
        "device": tensor.device.type,
    }


def kernel_state(module: nn.Module, *, prefix: str = "") -> dict[str, dict[str, object]]:
    """``{"param:<name>" | "buffer:<name>" | "module:<name>": state}`` for every tensor and
    submodule under ``module`` (names as in ``named_parameters``/``named_modules``, with
    ``prefix`` stripped so that a sub-model can be compared with a whole one)."""

    def key(kind: str, name: str) -> str | None:
        if not name.startswith(prefix):
            return None
        return f"{kind}:{name[len(prefix):]}"

    state: dict[str, dict[str, object]] = {}
    for name, param in module.named_parameters():
        if (k := key("param", name)) is not None:
            state[k] = _tensor_state(param)
    for name, buffer in module.named_buffers():
        if (k := key("buffer", name)) is not None:
            state[k] = _tensor_state(buffer)
    for name, sub in module.named_modules():
        if (k := key("module", name)) is not None:
            state[k] = {"training": sub.training}
    return state


def state_differences(ours: dict[str, dict[str, object]], theirs: dict[str, dict[str, object]]
                      ) -> list[str]:
    """One line per entry present in both whose state differs (entries in one only are not
    differences of state: implementations may name their non-persistent caches differently)."""
    lines = []
    for name in sorted(set(ours) & set(theirs)):
        for field, value in ours[name].items():
            if theirs[name].get(field) != value:
                lines.append(f"{name}.{field}: ours {value!r}, upstream {theirs[name].get(field)!r}")
    return lines
