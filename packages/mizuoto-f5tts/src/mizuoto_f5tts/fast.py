"""``engines.f5tts.fast``: the opt-in fast profiles, never exact.

- ``autocast``: the transformer (98 % of a request) runs under ``torch.autocast``: bfloat16 on
  a CPU with native bfloat16 kernels, float16 on CUDA as upstream's own CUDA inference does;
  the ODE loop, guidance and vocoder stay float32 (the transformer's output is cast back).
  Refused where it would only be slower (a CPU that emulates bfloat16: AVX2).
- ``int8``: the linear layers of the transformer's attention and feed-forward blocks become
  torch's dynamic int8 ones (``quantize_dynamic``: int8 weights, activations quantized per
  call; fbgemm's kernels run on AVX2). The profile for a CPU without native bfloat16, where
  ``autocast`` is refused. The input and time embeddings, the adaLN modulation and the output
  projection stay float32: one row per utterance or a thin product, nothing to gain, and
  they set every block's scale. CPU and a float32 model only.
- ``auto``: ``autocast`` where the device has its dtype natively (CUDA, a CPU with native
  bfloat16), else ``int8``.

Every profile also samples 12 steps where a request leaves ``steps`` unset (upstream's EPSS
grid for 12 steps; the exact path keeps upstream's 32): the kernels alone cannot give 3x on a
CPU without AMX, the step count cuts the transformer's calls to 3/8. EPSS 12 and 16 share
their coarse steps after t = 8/32, where the error against 32 steps comes from, and measured
as close to the exact path as each other (``mizuoto_f5tts.engine.FAST_PROFILE_STEPS``; a
request's own ``steps`` wins).

Results say which ran: ``applied.compute["fast"]`` (``auto`` resolved) and, for autocast, the
dtype in ``fast_dtype``; ``applied.sampler["steps"]`` the steps.
"""

from __future__ import annotations

import torch
from torch import nn

from mizuoto.errors import InvalidOption
from mizuoto.nn.transformer.attention import Attention
from mizuoto.nn.transformer.feedforward import FeedForward
from mizuoto.runtime.device import cpu_native_dtype, dtype_name
from mizuoto.runtime.dynamic_int8 import quantize_linears, require_dynamic_int8


def autocast_dtype(device: torch.device) -> torch.dtype:
    """The dtype the transformer autocasts to on ``device``; refused where it is emulated."""
    if device.type == "cuda":
        return torch.float16
    if device.type == "cpu" and cpu_native_dtype(torch.bfloat16):
        return torch.bfloat16
    raise InvalidOption("engines.f5tts.fast", f"autocast needs native bfloat16 kernels on "
                        f"the CPU or a CUDA device (the model is on {device}, which would "
                        "emulate it, slower than float32): use engines.f5tts.fast=int8 on "
                        "such a CPU, or engines.f5tts.fast=off")


def resolve_profile(profile: str, device: torch.device, dtype: torch.dtype) -> str:
    """The profile that will run for ``profile`` (``auto`` picked for ``device``), checked
    before the model is read: a refused combination names the option and the fix."""
    if profile == "auto":
        native = device.type == "cuda" or (device.type == "cpu"
                                           and cpu_native_dtype(torch.bfloat16))
        profile = "autocast" if native else "int8"
    if profile == "autocast":
        autocast_dtype(device)
    elif profile == "int8" and (device.type != "cpu" or dtype != torch.float32):
        raise InvalidOption("engines.f5tts.fast", f"int8 quantizes float32 linear layers on "
                            f"the CPU (the model is {dtype_name(dtype)} on {device}): set "
                            "compute.device=cpu and compute.dtype=float32 (or auto), use "
                            "engines.f5tts.fast=autocast on CUDA, or engines.f5tts.fast=off")
    if profile == "int8":
        require_dynamic_int8("engines.f5tts.fast")
    return profile


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


def quantize_transformer(transformer: nn.Module) -> int:
    """Make the linear layers of ``transformer``'s attention and feed-forward modules dynamic
    int8 in place; how many were quantized."""
    # listed first: quantizing swaps children of the modules being walked
    return quantize_linears([m for m in transformer.modules()
                             if isinstance(m, Attention | FeedForward)])
