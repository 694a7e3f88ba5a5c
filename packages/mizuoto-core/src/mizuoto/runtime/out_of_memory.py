"""Recognising an allocator's out-of-memory error on every device, so a caller can retry the
work in smaller pieces (the tiled decoders) instead of failing the request.

CUDA raises :class:`torch.OutOfMemoryError`. The CPU allocator raises a plain ``RuntimeError``
("DefaultCPUAllocator: can't allocate memory" when ``malloc`` fails, "not enough memory" in
older builds), and so does MPS ("MPS backend out of memory"): those are told apart by message.
"""

from __future__ import annotations

import torch

# Messages of the allocators that raise a bare RuntimeError when an allocation fails.
_ALLOCATOR_MESSAGES = (
    "DefaultCPUAllocator: can't allocate memory",
    "DefaultCPUAllocator: not enough memory",
    "MPS backend out of memory",
)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says an allocation failed (on CUDA, MPS or the CPU)."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(
        message in str(error) for message in _ALLOCATOR_MESSAGES)


def release_cached_memory(device: torch.device) -> None:
    """Hand the caching allocator's free blocks on ``device`` back, so that a retry in smaller
    pieces is not refused by fragmentation. Nothing to do on the CPU (no cache)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()
