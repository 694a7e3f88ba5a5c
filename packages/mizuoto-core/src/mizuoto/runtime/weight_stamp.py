"""What tells a packed copy of a weight that the weight has changed since it was packed."""

from __future__ import annotations

import torch


def weight_stamp(weight: torch.Tensor) -> tuple:
    """The weight's version counter (an in-place change: a LoRA merged, a state dict loaded
    into it), its storage (a move, a new tensor) and its dtype. An inference tensor (made under
    ``torch.inference_mode``, e.g. a model loaded inside that block) keeps no version counter:
    it is stamped by storage and dtype only, as in-place changes to it go untracked by torch
    itself."""
    version = None if weight.is_inference() else weight._version
    return version, weight.data_ptr(), weight.dtype
