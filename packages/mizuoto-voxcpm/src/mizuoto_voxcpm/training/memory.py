"""``training.memory = "low"``: gradient checkpointing of the MiniCPM layers of both LMs, the
local encoder and the local DiT, with the same bits as without; with LoRA under autocast also
the frozen linear layers' weights kept in the autocast dtype (`frozen_linears_to`).
``"lowest"`` (LoRA): ``low``, and the frozen linear layers' weights kept in host memory,
copied to the device for each call (`stream_frozen_linears`).

A checkpointed block runs its forward again during the backward pass. Its random draws (LoRA
dropout masks) come from the run's private generator, so the recomputation rewinds that
generator to where the first run started and puts it back afterwards: the masks are the same
and the rest of the run sees the generator as if nothing had been recomputed.
"""

from __future__ import annotations

import torch
from torch import nn


def recomputed_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks ``low`` recomputes (core's `TrainingRunner.checkpoint_activations`, with the
    run's generator): each decoder layer of ``base_lm`` and ``residual_lm``, the local encoder
    and the DiT estimator."""
    return [*model.base_lm.layers, *model.residual_lm.layers, model.feat_encoder,
            model.feat_decoder.estimator]


def frozen_linears_to(model: nn.Module, dtype: torch.dtype) -> int:
    """Keep the weight and bias of every linear layer that does not train (LoRA's frozen
    base) in ``dtype``, the autocast dtype; returns how many layers. Autocast casts them to
    that dtype at every call anyway (it caches casts only of tensors that require gradients),
    with the same rounding (``Tensor.to``), so the forward and backward keep their bits in
    half the memory. A parameter also used by a module other than a linear layer (a tied
    embedding) stays as it is."""
    layers = _frozen_linears(model)
    for module in layers:
        for name in _TENSORS:
            if getattr(module, name, None) is not None:
                getattr(module, name).data = getattr(module, name).data.to(dtype)
    return len(layers)


_TENSORS = ("weight", "bias")


def _frozen_linears(model: nn.Module, keep: tuple[nn.Module, ...] = ()) -> list[nn.Module]:
    """The linear layers (plain or LoRA-wrapped) none of whose tensors train or are shared
    with another kind of module, except those in ``keep``."""
    from mizuoto_voxcpm.lora import LoRALinear

    linear = (nn.Linear, LoRALinear)
    shared = {id(p) for m in model.modules() if not isinstance(m, linear)
              for p in m.parameters(recurse=False)}
    found = []
    for module in model.modules():
        if not isinstance(module, linear) or any(module is k for k in keep):
            continue
        tensors = [getattr(module, n) for n in _TENSORS if getattr(module, n, None) is not None]
        if not any(t.requires_grad or id(t) in shared for t in tensors):
            found.append(module)
    return found


def stream_frozen_linears(model: nn.Module, device: torch.device,
                          keep: tuple[nn.Module, ...] = ()) -> int:
    """Keep the frozen linear layers' weights and biases in host memory (pinned, for
    asynchronous copies) and give each call a device copy of them, freed once the call and its
    backward no longer need it; returns how many layers. The values are the same, so are the
    bits. ``keep`` (layers other code reads the device or dtype from) stay on the device.
    Nothing to do on the CPU."""
    if device.type == "cpu":
        return 0
    layers = _frozen_linears(model, keep)
    for module in layers:
        host = {}
        for name in _TENSORS:
            tensor = getattr(module, name, None)
            if tensor is not None:
                data = tensor.data.to("cpu")
                tensor.data = data.pin_memory() if device.type == "cuda" else data
                host[name] = tensor
        module.forward = _streamed(module, type(module).forward.__get__(module), host, device)
    return len(layers)


def _streamed(module: nn.Module, forward, host: dict[str, nn.Parameter], device):
    def call(*args, **kwargs):
        params = module._parameters
        for name, tensor in host.items():
            params[name] = nn.Parameter(tensor.data.to(device, non_blocking=True),
                                        requires_grad=False)
        try:
            return forward(*args, **kwargs)
        finally:
            params.update(host)
    return call
