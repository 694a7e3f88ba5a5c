"""``engines.voxcpm.fast``: the opt-in fast profile, never exact.

``int8-lm`` replaces the linear layers of both language models by int8 dynamically quantized
ones (weights int8 per tensor, activations quantized per call: torch's
``quantize_dynamic``); ``int8`` does the same inside every component (the local encoder and
DiT too); the single projections between components and the stop head stay float32. The int8 kernel
(``auto``) is fbgemm's packed one where this torch has it (:mod:`mizuoto.runtime.packed_int8`:
weights quantized per output channel, to 7 bits on a CPU without VNNI, and packed once, here
at load; 0.63-0.82 of the dynamic layer's time at VoxCPM's shapes), else torch's dynamic
int8 layer. With the packed kernel each decoder
layer's q/k/v and gate/up run as one product each (the separate products' bits, 4 products a
layer instead of 7; ``applied.compute["fast_products"]``). Either way a decode step attends
with each kv head's query heads as the rows of one query instead of torch's grouped-query call,
over the cache's filled positions only (``["fast_attention"]``: equal to rounding, several
times faster), and the decoder layers' norms, RoPE and residual adds run as fewer operations
(``["fast_elementwise"]``: equal to rounding; VoxCPM-0.5B's LM steps 0.92 of the time on an
AVX2 CPU); ``int8``'s local DiT computes its last layer for the patch's positions only
(``["fast_dit"]``: the velocity reads no other). CPU and
float32 only: that is where torch has the kernels (``engines.voxcpm.dtype=auto`` loads float32
for a profile; an explicit other dtype is refused here). Each result's
``applied.compute["fast"]`` names the profile that ran and ``["fast_kernel"]`` its int8
kernel (``engines.voxcpm.int8_kernel``: ``auto``, ``packed`` or ``dynamic`` chooses it);
the exact default is untouched.

``engines.voxcpm.fast_vae=bfloat16`` also runs the VAE's decoder in bfloat16 (a fast profile
only; ``applied.compute["fast_vae"]`` says which dtype ran). It pays for a whole utterance
only: on an AMD EPYC with AVX512-BF16 a 40-frame decode took 0.48-0.78 of float32's time, but a
VoxCPM-0.5B stream's 3-patch windows took 1.18-1.28 of the float32 decoder's with its
prepacked transposed convolutions (bfloat16 convolutions at 6 frames run torch's reference
path); 41 dB from float32's waveform on random weights. ``int8`` (``auto``'s choice where torch
has fbgemm's packed kernel) keeps the decoder float32 and runs its transposed and pointwise
convolutions as packed int8 products (:mod:`mizuoto.runtime.packed_int8_conv`): at a stream's
few frames they only read their weights (VoxCPM-0.5B's first upsampling: 75 MB of float32
for 6 frames, 14-20 ms a patch on an AVX2 CPU, 1.0 ms in int8). The encoder, which reads a
prompt once per voice, stays float32.
"""

from __future__ import annotations

import torch
from torch import nn

from mizuoto.errors import InvalidOption
from mizuoto.runtime.dynamic_int8 import quantize_linears, require_dynamic_int8
from mizuoto.runtime.packed_int8 import (
    KERNEL_NAME,
    PackedInt8Linear,
    pack_int8_linears,
    packed_int8_unavailable,
)
from mizuoto.runtime.packed_int8_conv import pack_int8_convolutions
from mizuoto_voxcpm.layer_fusion import fast_arithmetic, fuse_products

_LM_GROUPS = ("base_lm", "residual_lm")


def check_fast(profile: str, device: torch.device, dtype: torch.dtype,
               kernel: str = "auto", vae: str = "auto") -> None:
    if profile == "off":
        if vae not in ("auto", "float32"):
            raise InvalidOption("engines.voxcpm.fast_vae", f"{vae} applies to a fast profile "
                                "only (the exact path decodes in float32): set "
                                "engines.voxcpm.fast=int8 or leave fast_vae=auto")
        return
    if device.type != "cpu" or dtype != torch.float32:
        raise InvalidOption("engines.voxcpm.fast", f"{profile} quantizes float32 linear "
                            f"layers on the CPU (the model is {dtype} on {device}): set "
                            "engines.voxcpm.dtype=float32 and compute.device=cpu, or "
                            "engines.voxcpm.fast=off")
    require_dynamic_int8("engines.voxcpm.fast")
    reason = packed_int8_unavailable()
    if kernel == "packed" and reason is not None:
        raise InvalidOption("engines.voxcpm.int8_kernel", f"packed needs fbgemm's packed int8 "
                            f"linear: {reason}; set engines.voxcpm.int8_kernel=auto or dynamic")
    if vae == INT8_VAE and reason is not None:
        raise InvalidOption("engines.voxcpm.fast_vae", f"int8 needs fbgemm's packed int8 "
                            f"linear: {reason}; set engines.voxcpm.fast_vae=auto or float32")


#: ``applied.compute["fast_kernel"]`` of torch's dynamic int8 layer
DYNAMIC_KERNEL = "int8 dynamic linear (fbgemm)"


def fast_kernel(profile: str, kernel: str = "auto") -> str | None:
    """The int8 kernel ``profile`` runs here with ``engines.voxcpm.int8_kernel=kernel``
    (``None`` for ``off``)."""
    if profile == "off":
        return None
    # auto: the packed kernel wherever this torch has it; on a CPU without VNNI it narrows its
    # weights to 7 bits against AVX2's 16-bit pair sums (packed_int8.weight_levels): there
    # 0.89 of the dynamic layer's time, wave / mel SNR 17.9 / 23.6 dB against 17.2 / 23.0
    # (VoxCPM-0.5B, 20 patches, AMD EPYC with AVX2 only, 2 threads)
    if kernel == "dynamic" or (kernel == "auto" and packed_int8_unavailable() is not None):
        return DYNAMIC_KERNEL
    return KERNEL_NAME


def fast_vae(profile: str, setting: str = "auto") -> str:
    """What ``engines.voxcpm.fast_vae=setting`` runs under ``profile``: float32 on the exact
    path whatever the setting (:func:`check_fast` refuses another one set there); ``auto`` is
    ``int8`` in a fast profile where torch has the packed kernel (VoxCPM-0.5B, 20 patches,
    AMD EPYC with AVX2 only: 0.85 of the float32 VAE's request time, wave / mel SNR against
    the exact path 0.3 / 0.2 dB lower), else float32."""
    if profile == "off":
        return "float32"
    if setting == "auto":
        return INT8_VAE if packed_int8_unavailable() is None else "float32"
    return setting


def fast_vae_dtype(profile: str, setting: str = "auto") -> torch.dtype:
    """The VAE decoder's dtype under ``profile`` with ``engines.voxcpm.fast_vae=setting``:
    bfloat16 where :func:`fast_vae` is, else float32 (``int8``: float32 layers whose
    products run in int8)."""
    return torch.bfloat16 if fast_vae(profile, setting) == "bfloat16" else torch.float32


#: ``engines.voxcpm.fast_vae`` (and ``applied.compute["fast_vae"]``) for a VAE decoder whose
#: transposed and pointwise convolutions run as packed int8 products
INT8_VAE = "int8"

#: ``applied.compute["fast_products"]`` where the packed kernel runs q/k/v and gate/up as one
#: product each (the dynamic layer's per-tensor weights keep them apart: ``separate``)
FUSED_PRODUCTS = "q/k/v and gate/up fused"
#: ``applied.compute["fast_attention"]``: a decode step's grouped-query attention as rows
FOLDED_HEADS = "query heads folded per kv head, over the filled positions"
#: ``applied.compute["fast_elementwise"]``: the decoder layers' elementwise arithmetic fused
#: (:func:`mizuoto_voxcpm.layer_fusion.fuse_elementwise`)
FUSED_ELEMENTWISE = "RMSNorm, RoPE and residual adds fused"
#: ``applied.compute["fast_dit"]``: the local DiT's last layer computes the patch's positions
#: only (:attr:`mizuoto_voxcpm.local_dit.LocalDiT.patch_rows_only`)
PATCH_ROWS_ONLY = "last layer over the patch's positions only"


def fast_settings(profile: str, kernel: str = "auto",
                  vae: str = "auto") -> dict[str, str]:
    """What ``applied.compute`` adds for ``profile``: its kernel, whether the decoder layers'
    products are fused, its decode-step attention and the VAE decoder's dtype (nothing for
    ``off``)."""
    name = fast_kernel(profile, kernel)
    if name is None:
        return {}
    return {"fast_kernel": name,
            "fast_products": FUSED_PRODUCTS if name == KERNEL_NAME else "separate",
            "fast_attention": FOLDED_HEADS,
            "fast_elementwise": FUSED_ELEMENTWISE,
            "fast_dit": PATCH_ROWS_ONLY if profile == "int8" else "as exact",
            "fast_vae": fast_vae(profile, vae)}


def apply_fast(groups: dict[str, list[nn.Module]], profile: str,
               kernel: str = "auto") -> tuple[str, ...]:
    """Quantize the groups ``profile`` covers in place, with :func:`fast_kernel`'s kernel; the
    names of those quantized."""
    if profile == "off":
        return ()
    names = _LM_GROUPS if profile == "int8-lm" else tuple(groups)
    roots = [module for name in names for module in groups[name]]
    if fast_kernel(profile, kernel) == KERNEL_NAME:
        # per-channel weights: the fused products give each layer's own bits, in one call
        fuse_products(roots, PackedInt8Linear.fused)
        pack_int8_linears(roots)  # a bare projection between components is kept
    else:
        quantize_linears(roots)  # per-tensor weights: fusing would change them, so none is
    fast_arithmetic(roots)
    return names


def cache_attention(profile: str, requested: str) -> str:
    """The caches' attention under ``profile``: ``fast`` (a step over the filled positions
    only, unmasked: equal to rounding, 0.3 of the time on AVX2 with 2 threads) wherever
    :func:`apply_fast`'s arithmetic runs, else ``requested`` (``compute.attention``; the exact
    path's spans grow in steps of 256 and mask the rest, for upstream's bits)."""
    return "fast" if profile != "off" else requested


#: ``applied.compute["fast_traces"]`` where a single stream's step replays proven traces
#: (:meth:`mizuoto_voxcpm.minicpm4.MiniCPM4.trace_steps`,
#: :meth:`mizuoto_voxcpm.local_dit.LocalDiT.trace_evaluations`,
#: :meth:`mizuoto_voxcpm.local_encoder.LocalEncoder.trace_steps`)
TRACED_STEPS = ("both LMs' single-sequence decode steps (one trace for every position), "
                "the local DiT's evaluations and the encoder's steps "
                "traced per input shape (TorchScript), each proven equal to eager")


def trace_fast_steps(model, profile: str, *, compiled: bool) -> bool:
    """Under ``int8`` (unless ``compiled``, ``compute.compile``: the compiler owns the DiT),
    replay both LMs' single-sequence decode steps (one trace for every position), the
    local DiT's evaluations and the local encoder's decode steps as proven traces per input
    shape; whether it did. The first call of each shape proves it: decode two patches while
    loading (:func:`mizuoto_voxcpm.patch_decoder.rehearse_patches`), then
    :func:`fast_traces_applied` says what was proven."""
    if profile != "int8" or compiled:
        return False
    model.feat_decoder.estimator.trace_evaluations()
    model.feat_encoder.trace_steps()
    model.base_lm.trace_steps(name="base LM decode step")
    model.residual_lm.trace_steps(name="residual LM decode step")
    return True


def fast_traces_applied(model, profile: str) -> dict[str, str]:
    """What ``applied.compute["fast_traces"]`` says after :func:`trace_fast_steps` and the
    rehearsed patches (nothing for ``off``): which parts replay traces, or which stay eager
    and why. Whether traces were set is read from the model, so that
    :func:`trace_fast_steps` alone decides it."""
    if profile == "off":
        return {}
    if profile != "int8":
        return {"fast_traces": "none (int8-lm: the DiT and the encoder as exact)"}
    proven = [model.feat_decoder.estimator.shape_traces, model.feat_encoder.shape_traces,
              model.base_lm.shape_traces, model.residual_lm.shape_traces]
    if any(traces is None for traces in proven):
        # int8 sets no traces only under compute.compile (trace_fast_steps)
        return {"fast_traces": "none: compute.compile owns the DiT"}
    if all(traces.traced for traces in proven):
        return {"fast_traces": TRACED_STEPS}
    reasons = sorted({f"{traces.name}: {reason}" for traces in proven
                      for reason in traces.eager_shapes.values()})
    return {"fast_traces": "eager where unproven: " + "; ".join(reasons)}


def apply_fast_vae(vae: nn.Module, profile: str, setting: str = "auto") -> torch.dtype:
    """Cast the VAE's decoder to :func:`fast_vae_dtype` in place (the decoding casts its
    latents to the decoder's dtype and its audio back to float32), or for ``int8`` make its
    transposed and pointwise convolutions packed int8 ones; the decoder's dtype."""
    dtype = fast_vae_dtype(profile, setting)
    if dtype != torch.float32:
        vae.decoder.to(dtype)
    elif fast_vae(profile, setting) == INT8_VAE:
        pack_int8_convolutions([vae.decoder])
    return dtype
