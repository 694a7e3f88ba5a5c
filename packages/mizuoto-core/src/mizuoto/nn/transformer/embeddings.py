"""Position and time embeddings of the F5-TTS family.

- `sinusoidal_positions(dim, length)`: ``(length, dim)`` table ``[cos | sin]`` added to the text
  embedding (upstream's ``precompute_freqs_cis``).
- `SinusoidalEmbedding(dim)`: ``[sin | cos]`` features of a scalar (times 1000) per batch item.
- `TimestepEmbedding(dim)`: flow time ``(b,)`` -> ``(b, dim)`` via sinusoids and a 2-layer MLP.
- `ConvPositionEmbedding(dim)`: two grouped convolutions with Mish, optionally masking padding.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal_positions(dim: int, length: int, theta: float = 10000.0) -> torch.Tensor:
    """``(length, dim)`` float32 table: ``cos(p * f_i)`` then ``sin(p * f_i)``."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    positions = torch.arange(length, device=freqs.device)
    angles = torch.outer(positions, freqs).float()
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class SinusoidalEmbedding(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor, scale: float = 1000) -> torch.Tensor:
        half_dim = self.dim // 2
        step = math.log(10000) / (half_dim - 1)
        freqs = torch.exp(torch.arange(half_dim, device=x.device).float() * -step)
        angles = scale * x.unsqueeze(1) * freqs.unsqueeze(0)
        return torch.cat((angles.sin(), angles.cos()), dim=-1)


class TimestepEmbedding(nn.Module):
    def __init__(self, dim: int, freq_embed_dim: int = 256) -> None:
        super().__init__()
        self.time_embed = SinusoidalEmbedding(freq_embed_dim)
        self.time_mlp = nn.Sequential(
            nn.Linear(freq_embed_dim, dim), nn.SiLU(), nn.Linear(dim, dim)
        )

    def forward(self, timestep: torch.Tensor) -> torch.Tensor:
        hidden = self.time_embed(timestep).to(timestep.dtype)
        return self.time_mlp(hidden)


class ConvPositionEmbedding(nn.Module):
    """``(b, n, d) -> (b, n, d)``; with ``mask`` (``(b, n)``, True = valid) padding stays zero."""

    def __init__(self, dim: int, kernel_size: int = 31, groups: int = 16) -> None:
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        self.conv1d = nn.Sequential(
            nn.Conv1d(dim, dim, kernel_size, groups=groups, padding=kernel_size // 2),
            nn.Mish(),
            nn.Conv1d(dim, dim, kernel_size, groups=groups, padding=kernel_size // 2),
            nn.Mish(),
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x.permute(0, 2, 1)
        if mask is None:
            x = self.conv1d(x)
        else:
            pad = ~mask.unsqueeze(1)
            x = x.masked_fill(pad, 0.0)
            for layer in self.conv1d:
                x = layer(x)
                if isinstance(layer, nn.Conv1d):
                    x = x.masked_fill(pad, 0.0)
        return x.permute(0, 2, 1)
