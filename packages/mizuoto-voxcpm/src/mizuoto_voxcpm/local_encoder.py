"""The local encoder: one patch of VAE latents in, one LM-width embedding out (a CLS token)."""

from __future__ import annotations

import torch
from torch import nn

from mizuoto_voxcpm.config import TransformerConfig
from mizuoto_voxcpm.minicpm4 import MiniCPM4


class LocalEncoder(nn.Module):
    def __init__(self, config: TransformerConfig, input_dim: int) -> None:
        super().__init__()
        self.special_token = nn.Parameter(torch.zeros(1, 1, 1, config.hidden_size))
        self.in_proj = nn.Linear(input_dim, config.hidden_size, bias=True)
        self.encoder = MiniCPM4(config)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """``patches``: ``(batch, patches, patch_size, feat_dim)`` -> ``(batch, patches, hidden)``."""
        batch, length = patches.shape[:2]
        x = self.in_proj(patches)
        cls = self.special_token.expand(batch, length, 1, -1)
        x = torch.cat([cls, x], dim=2).flatten(0, 1)
        hidden, _ = self.encoder(x, causal=False)
        return hidden[:, 0, :].reshape(batch, length, -1)
