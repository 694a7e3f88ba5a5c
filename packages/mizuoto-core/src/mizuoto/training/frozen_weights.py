"""The weights of frozen linear layers (a LoRA run's base model), kept in less device memory
with the same bits: ``training.memory`` levels an adapter trainer applies.

- `frozen_linears_to(model, dtype)`: stored in the autocast dtype (``low`` under autocast);
- `stream_frozen_linears(model, device)`: kept in host memory, copied to the device for each
  call (``lowest``).

A linear layer is an ``nn.Linear`` or a module of one of the ``kinds`` given (a LoRA wrapper
holding its base's ``weight`` and ``bias``). One is frozen when none of its tensors trains or
is shared with a module of another kind (a tied embedding).
"""

from __future__ import annotations

import torch
from torch import nn

_TENSORS = ("weight", "bias")


def frozen_linears_to(model: nn.Module, dtype: torch.dtype, *,
                      kinds: tuple[type[nn.Module], ...] = ()) -> int:
    """Keep the weight and bias of every frozen linear layer in ``dtype``, the autocast dtype;
    returns how many layers. Autocast casts them to that dtype at every call anyway (it caches
    casts only of tensors that require gradients), with the same rounding (``Tensor.to``), so
    the forward and backward keep their bits in half the memory."""
    layers = frozen_linears(model, kinds=kinds)
    for module in layers:
        for name in _TENSORS:
            if getattr(module, name, None) is not None:
                getattr(module, name).data = getattr(module, name).data.to(dtype)
    return len(layers)


def frozen_linears(model: nn.Module, keep: tuple[nn.Module, ...] = (), *,
                   kinds: tuple[type[nn.Module], ...] = ()) -> list[nn.Module]:
    """The frozen linear layers of ``model`` (see the module's docstring), except those in
    ``keep``."""
    linear = (nn.Linear, *kinds)
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
                          keep: tuple[nn.Module, ...] = (), *,
                          kinds: tuple[type[nn.Module], ...] = ()) -> int:
    """Keep the frozen linear layers' weights and biases in host memory (pinned, for
    asynchronous copies) and give each call a device copy of them, freed once the call and its
    backward no longer need it; returns how many layers. The values are the same, so are the
    bits. ``keep`` (layers other code reads the device or dtype from) stay on the device.
    Nothing to do on the CPU."""
    if device.type == "cpu":
        return 0
    layers = frozen_linears(model, keep, kinds=kinds)
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
