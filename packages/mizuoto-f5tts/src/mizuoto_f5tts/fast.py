"""``engines.f5tts.fast=autocast``: the opt-in fast profile, never exact.

The transformer (98 % of a request) runs under ``torch.autocast``: bfloat16 on a CPU with
native bfloat16 kernels, float16 on CUDA as upstream's own CUDA inference does; the ODE loop,
guidance and vocoder stay float32 (the transformer's output is cast back). Refused where it
would only be slower (a CPU that emulates bfloat16). Results say
``applied.compute["fast"] == "autocast"`` and the autocast dtype in ``fast_dtype``.
"""

from __future__ import annotations

import torch
from torch import nn

from mizuoto.errors import InvalidOption
from mizuoto.runtime.device import cpu_native_dtype, dtype_name


def autocast_dtype(device: torch.device) -> torch.dtype:
    """The dtype the transformer autocasts to on ``device``; refused where it is emulated."""
    if device.type == "cuda":
        return torch.float16
    if device.type == "cpu" and cpu_native_dtype(torch.bfloat16):
        return torch.bfloat16
    raise InvalidOption("engines.f5tts.fast", f"autocast needs native bfloat16 kernels on "
                        f"the CPU or a CUDA device (the model is on {device}, which would "
                        "emulate it, slower than float32): use engines.f5tts.fast=off")


def autocast_transformer(transformer: nn.Module, device: torch.device) -> str:
    """Run ``transformer``'s forward under autocast from now on; the dtype's name."""
    dtype = autocast_dtype(device)
    forward = transformer.forward

    def autocast_forward(*args, **kwargs):
        with torch.autocast(device.type, dtype=dtype):
            out = forward(*args, **kwargs)
        return out.float()

    transformer.forward = autocast_forward
    return dtype_name(dtype)
