"""Transformer feed-forward: Linear -> GELU -> Dropout -> Linear.

The nesting (``ff.0.0`` and ``ff.2``) matches F5-TTS checkpoint keys.
"""

from __future__ import annotations

import torch
from torch import nn


class FeedForward(nn.Module):
    def __init__(
        self,
        dim: int,
        dim_out: int | None = None,
        mult: float = 4,
        dropout: float = 0.0,
        approximate: str = "none",
    ) -> None:
        super().__init__()
        inner_dim = int(dim * mult)
        dim_out = dim_out if dim_out is not None else dim
        project_in = nn.Sequential(nn.Linear(dim, inner_dim), nn.GELU(approximate=approximate))
        self.ff = nn.Sequential(project_in, nn.Dropout(dropout), nn.Linear(inner_dim, dim_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)
