"""MiniCPM's LongRoPE tables and the rotary embedding applied to queries and keys (upstream's
arithmetic, and a fast profile's equal-to-rounding form)."""

from __future__ import annotations

import math

import torch
from torch import nn

from mizuoto_voxcpm.config import TransformerConfig


class LongRoPE(nn.Module):
    """MiniCPM's LongRoPE tables, built once in float32 for ``max_position_embeddings``.

    The tables are buffers: casting the model (``.to(bfloat16)``) rounds them, as upstream's
    cast does before the checkpoint is copied in.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        original = config.rope_scaling.original_max_position_embeddings
        scale = config.max_position_embeddings / original
        self.scaling_factor = math.sqrt(1 + math.log(scale) / math.log(original))
        if torch.get_default_device().type == "meta":
            # loading builds on the meta device and calls rebuild() once there is one; the
            # tables' arithmetic on meta tensors would import torch._dynamo (2.5 s)
            rows, dim = config.max_position_embeddings, config.head_dim
            inv_freq, cos, sin = torch.empty(dim // 2), torch.empty(rows, dim), \
                torch.empty(rows, dim)
        else:
            inv_freq, cos, sin = self._tables(device=None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("cos_cached", cos, persistent=False)
        self.register_buffer("sin_cached", sin, persistent=False)

    def _tables(self, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        config = self.config
        dim = config.head_dim
        scaling = config.rope_scaling
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, device=device).float()
                                                / dim))
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float32,
                                 device=device)
        long = config.max_position_embeddings > scaling.original_max_position_embeddings
        factors = scaling.long_factor if long else scaling.short_factor
        ext_factors = torch.tensor(factors, dtype=torch.float32, device=device)
        freqs = torch.mul(torch.outer(positions, 1.0 / ext_factors), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return inv_freq, emb.cos() * self.scaling_factor, emb.sin() * self.scaling_factor

    def rebuild(self, dtype: torch.dtype) -> None:
        """Recompute the tables in float32 on the buffers' device, then round to ``dtype``
        (for a model materialised from the meta device)."""
        for name, table in zip(("inv_freq", "cos_cached", "sin_cached"),
                               self._tables(self.inv_freq.device), strict=True):
            setattr(self, name, table.to(dtype))

    #: also return the rows' sign-flipped sin (:func:`sign_flipped_sin`), once per forward or
    #: step for every layer (a fast profile's: :func:`apply_rope_together` reads it)
    sign_flipped: bool = False

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # index_select, not advanced indexing: the same rows, and capturable in a CUDA graph
        cos = self.cos_cached.index_select(0, positions)
        sin = self.sin_cached.index_select(0, positions)
        if self.sign_flipped:
            return cos, sin, sign_flipped_sin(sin)
        return cos, sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = q.dtype
    q = q.to(torch.float32)
    k = k.to(torch.float32)
    q = (q * cos) + (_rotate_half(q) * sin)
    k = (k * cos) + (_rotate_half(k) * sin)
    return q.to(dtype), k.to(dtype)


def sign_flipped_sin(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` with its first half negated: rotating half by a roll then needs no negation."""
    half = sin.size(-1) // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def apply_rope_together(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                        signed_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`apply_rope` for float32 ``q`` and ``k`` as one tensor in four operations (a
    fast profile's: the rotation by a roll and :func:`sign_flipped_sin`, equal to rounding; a
    decode step's RoPE in 0.44 of the time on an AVX2 CPU)."""
    heads, half = q.size(1), q.size(-1) // 2
    both = torch.cat((q, k), dim=1)
    out = both * cos
    out.addcmul_(both.roll(half, dims=-1), signed_sin)
    return out[:, :heads], out[:, heads:]
