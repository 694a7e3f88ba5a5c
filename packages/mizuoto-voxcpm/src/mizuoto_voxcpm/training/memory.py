"""``training.memory = "low"``: gradient checkpointing of the MiniCPM layers of both LMs, the
local encoder and the local DiT, with the same bits as without; with LoRA under autocast also
the frozen linear layers' weights kept in the autocast dtype (`frozen_linears_to`).

A checkpointed block runs its forward again during the backward pass. Its random draws (LoRA
dropout masks) come from the run's private generator, so the recomputation rewinds that
generator to where the first run started and puts it back afterwards: the masks are the same
and the rest of the run sees the generator as if nothing had been recomputed.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def _checkpointed(forward, generator: torch.Generator):
    def call(*args, **kwargs):
        start = generator.get_state()
        runs = 0

        def run(*inner_args, **inner_kwargs):
            nonlocal runs
            runs += 1
            if runs == 1:
                return forward(*inner_args, **inner_kwargs)
            now = generator.get_state()
            generator.set_state(start)
            try:
                return forward(*inner_args, **inner_kwargs)
            finally:
                generator.set_state(now)

        return checkpoint(run, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)
    return call


def checkpoint_blocks(model: nn.Module, generator: torch.Generator) -> int:
    """Checkpoint each decoder layer of ``base_lm`` and ``residual_lm``, the local encoder and
    the DiT estimator of ``model`` (in place); returns how many blocks."""
    blocks = [*model.base_lm.layers, *model.residual_lm.layers, model.feat_encoder,
              model.feat_decoder.estimator]
    for block in blocks:
        block.forward = _checkpointed(type(block).forward.__get__(block), generator)
    return len(blocks)


def frozen_linears_to(model: nn.Module, dtype: torch.dtype) -> int:
    """Keep the weight and bias of every linear layer that does not train (LoRA's frozen
    base) in ``dtype``, the autocast dtype; returns how many layers. Autocast casts them to
    that dtype at every call anyway (it caches casts only of tensors that require gradients),
    with the same rounding (``Tensor.to``), so the forward and backward keep their bits in
    half the memory. A parameter also used by a module other than a linear layer (a tied
    embedding) stays as it is."""
    from mizuoto_voxcpm.lora import LoRALinear

    linear = (nn.Linear, LoRALinear)
    shared = {id(p) for m in model.modules() if not isinstance(m, linear)
              for p in m.parameters(recurse=False)}
    count = 0
    for module in model.modules():
        if not isinstance(module, linear):
            continue
        tensors = [t for t in (module.weight, getattr(module, "bias", None)) if t is not None]
        if any(t.requires_grad or id(t) in shared for t in tensors):
            continue
        for tensor in tensors:
            tensor.data = tensor.data.to(dtype)
        count += 1
    return count
