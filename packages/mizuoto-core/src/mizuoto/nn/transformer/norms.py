"""Normalisation layers of the F5-TTS family.

- `AdaLayerNormZero`: DiT's adaptive LayerNorm; one linear map of the conditioning gives shift,
  scale and gate for attention and for the feed-forward (six chunks, in upstream's order).
- `AdaLayerNormZeroFinal`: the last modulation before the output projection (scale, shift).
- `RMSNorm`: the x-transformers form used by UNetT, ``normalize(x) * sqrt(dim) * g``.
- `NativeRMSNorm`: ``F.rms_norm`` with weight, used for the optional q/k norm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class AdaLayerNormZero(nn.Module):
    """Returns ``(modulated x, gate_msa, shift_mlp, scale_mlp, gate_mlp)``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(dim, dim * 6)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def forward(
        self, x: torch.Tensor, emb: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        emb = self.linear(self.silu(emb))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = torch.chunk(emb, 6, dim=1)
        x = self.norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None]
        return x, gate_msa, shift_mlp, scale_mlp, gate_mlp


class AdaLayerNormZeroFinal(nn.Module):
    """Final modulation: ``norm(x) * (1 + scale) + shift`` (scale is the first chunk)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(dim, dim * 2)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        emb = self.linear(self.silu(emb))
        scale, shift = torch.chunk(emb, 2, dim=1)
        return self.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]


class RMSNorm(nn.Module):
    """x-transformers RMSNorm: ``F.normalize(x) * dim ** 0.5 * g`` (parameter ``g``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = dim**0.5
        self.g = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x-transformers adds float(unit_offset) = 0.0 to g first: exact, so left out
        return F.normalize(x, dim=-1) * self.scale * self.g


class NativeRMSNorm(nn.Module):
    """``F.rms_norm`` with a ``weight``; half-precision weights cast the input first (as F5-TTS)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.to(self.weight.dtype)
        return F.rms_norm(x, normalized_shape=(x.shape[-1],), weight=self.weight, eps=self.eps)
