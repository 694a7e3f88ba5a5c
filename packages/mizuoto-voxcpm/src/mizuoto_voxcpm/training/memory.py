"""``training.memory = "low"``: gradient checkpointing of the MiniCPM layers of both LMs, the
local encoder and the local DiT, with the same bits as without.

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
