"""Vocos backbone: ConvNeXt blocks over mel features (vocos 0.1.0 ``VocosBackbone``).

`VocosBackbone(input_channels, dim, intermediate_dim, num_layers)`: ``(b, channels, t)`` ->
``(b, t, dim)``. The band-conditioned AdaLayerNorm variant (Encodec features) is not supported.
"""

from __future__ import annotations

import torch
from torch import nn


class ConvNeXtBlock(nn.Module):
    """Depthwise conv -> LayerNorm -> MLP -> layer scale ``gamma``, plus the input (b, c, t)."""

    def __init__(self, dim: int, intermediate_dim: int, layer_scale_init_value: float) -> None:
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, intermediate_dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(intermediate_dim, dim)
        self.gamma = (
            nn.Parameter(layer_scale_init_value * torch.ones(dim))
            if layer_scale_init_value > 0
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        x = self.dwconv(x).transpose(1, 2)
        x = self.pwconv2(self.act(self.pwconv1(self.norm(x))))
        if self.gamma is not None:
            x = self.gamma * x
        return residual + x.transpose(1, 2)


class VocosBackbone(nn.Module):
    def __init__(
        self,
        input_channels: int,
        dim: int,
        intermediate_dim: int,
        num_layers: int,
        layer_scale_init_value: float | None = None,
        adanorm_num_embeddings: int | None = None,
    ) -> None:
        super().__init__()
        if adanorm_num_embeddings is not None:
            raise ValueError(
                "VocosBackbone: adanorm_num_embeddings (Encodec features) is not supported"
            )
        self.input_channels = input_channels
        self.embed = nn.Conv1d(input_channels, dim, kernel_size=7, padding=3)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        layer_scale_init_value = layer_scale_init_value or 1 / num_layers
        self.convnext = nn.ModuleList(
            ConvNeXtBlock(dim, intermediate_dim, layer_scale_init_value) for _ in range(num_layers)
        )
        self.final_layer_norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        x = self.norm(x.transpose(1, 2)).transpose(1, 2)
        for block in self.convnext:
            x = block(x)
        return self.final_layer_norm(x.transpose(1, 2))
