"""``engines.voxcpm.fast``: the opt-in fast profile, never exact.

``int8-lm`` replaces the linear layers of both language models by int8 dynamically quantized
ones (weights int8 per tensor, activations quantized per call: torch's
``quantize_dynamic``); ``int8`` does the same inside every component (the local encoder and
DiT too); the single projections between components and the stop head stay float32. The int8 kernel
is fbgemm's packed one where this torch has it (:mod:`mizuoto.runtime.packed_int8`: weights
quantized and packed once, here at load; 0.63-0.82 of the dynamic layer's time at VoxCPM's
shapes), else torch's dynamic int8 layer. CPU and
float32 only: that is where torch has the kernels (``engines.voxcpm.dtype=auto`` loads float32
for a profile; an explicit other dtype is refused here). Each result's
``applied.compute["fast"]`` names the profile that ran and ``["fast_kernel"]`` its int8
kernel; the exact default is untouched.
"""

from __future__ import annotations

import torch
from torch import nn

from mizuoto.errors import InvalidOption
from mizuoto.runtime.dynamic_int8 import quantize_linears, require_dynamic_int8
from mizuoto.runtime.packed_int8 import KERNEL_NAME, pack_int8_linears, packed_int8_unavailable

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


#: ``applied.compute["fast_kernel"]`` of the fallback: torch's dynamic int8 layer
DYNAMIC_KERNEL = "int8 dynamic linear (fbgemm)"


def fast_kernel(profile: str) -> str | None:
    """The int8 kernel ``profile`` runs here (``None`` for ``off``)."""
    if profile == "off":
        return None
    return KERNEL_NAME if packed_int8_unavailable() is None else DYNAMIC_KERNEL


def fast_settings(profile: str) -> dict[str, str]:
    """What ``applied.compute`` adds for ``profile``: its kernel (nothing for ``off``)."""
    kernel = fast_kernel(profile)
    return {} if kernel is None else {"fast_kernel": kernel}


def apply_fast(groups: dict[str, list[nn.Module]], profile: str) -> tuple[str, ...]:
    """Quantize the groups ``profile`` covers in place, with :func:`fast_kernel`'s kernel; the
    names of those quantized."""
    if profile == "off":
        return ()
    names = _LM_GROUPS if profile == "int8-lm" else tuple(groups)
    # a bare projection between components is kept (both skip a root Linear)
    quantize = pack_int8_linears if fast_kernel(profile) == KERNEL_NAME else quantize_linears
    quantize(module for name in names for module in groups[name])
    return names
