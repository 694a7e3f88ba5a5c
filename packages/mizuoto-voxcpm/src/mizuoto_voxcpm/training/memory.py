"""``training.memory = "low"``: gradient checkpointing of the MiniCPM layers of both LMs, the
local encoder and the local DiT, with the same bits as without; with LoRA under autocast also
the frozen linear layers' weights kept in the autocast dtype. ``"lowest"`` (LoRA): ``low``,
and the frozen linear layers' weights kept in host memory, copied to the device for each call
(both core's `mizuoto.training.frozen_weights`, LoRA's wrapped layers counted as linear).

A checkpointed block runs its forward again during the backward pass. Its random draws (LoRA
dropout masks) come from the run's private generator, so the recomputation rewinds that
generator to where the first run started and puts it back afterwards: the masks are the same
and the rest of the run sees the generator as if nothing had been recomputed.
"""

from __future__ import annotations

from torch import nn


def recomputed_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks ``low`` recomputes (core's `TrainingRunner.checkpoint_activations`, with the
    run's generator): each decoder layer of ``base_lm`` and ``residual_lm``, the local encoder
    and the DiT estimator."""
    return [*model.base_lm.layers, *model.residual_lm.layers, model.feat_encoder,
            model.feat_decoder.estimator]
