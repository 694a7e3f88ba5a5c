"""``engines.voxcpm.fast``: the opt-in fast profile, never exact.

``int8-lm`` replaces the linear layers of both language models by int8 dynamically quantized
ones (weights int8 per tensor, activations quantized per call: torch's
``quantize_dynamic``); ``int8`` does the same inside every component (the local encoder and
DiT too); the single projections between components and the stop head stay float32. CPU and
float32 only: that is where torch has the kernels (``engines.voxcpm.dtype=auto`` loads float32
for a profile; an explicit other dtype is refused here). Each result's
``applied.compute["fast"]`` names the profile that ran; the exact default is untouched.
"""

from __future__ import annotations

import torch
from torch import nn

from mizuoto.errors import InvalidOption
from mizuoto.runtime.dynamic_int8 import quantize_linears, require_dynamic_int8

_LM_GROUPS = ("base_lm", "residual_lm")


def check_fast(profile: str, device: torch.device, dtype: torch.dtype) -> None:
    if profile == "off":
        return
    if device.type != "cpu" or dtype != torch.float32:
        raise InvalidOption("engines.voxcpm.fast", f"{profile} quantizes float32 linear "
                            f"layers on the CPU (the model is {dtype} on {device}): set "
                            "engines.voxcpm.dtype=float32 and compute.device=cpu, or "
                            "engines.voxcpm.fast=off")
    require_dynamic_int8("engines.voxcpm.fast")


def apply_fast(groups: dict[str, list[nn.Module]], profile: str) -> tuple[str, ...]:
    """Quantize the groups ``profile`` covers in place; the names of those quantized."""
    if profile == "off":
        return ()
    names = _LM_GROUPS if profile == "int8-lm" else tuple(groups)
    # a bare projection between components is kept (quantize_linears skips a root Linear)
    quantize_linears(module for name in names for module in groups[name])
    return names
