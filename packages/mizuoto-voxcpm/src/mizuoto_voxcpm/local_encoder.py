"""The local encoder: one patch of VAE latents in, one LM-width embedding out (a CLS token)."""

from __future__ import annotations

import torch
from torch import nn

from mizuoto.runtime.shape_traces import ShapeTraces
from mizuoto_voxcpm.config import TransformerConfig
from mizuoto_voxcpm.minicpm4 import MiniCPM4


class LocalEncoder(nn.Module):
    def __init__(self, config: TransformerConfig, input_dim: int) -> None:
        super().__init__()
        self.special_token = nn.Parameter(torch.zeros(1, 1, 1, config.hidden_size))
        self.in_proj = nn.Linear(input_dim, config.hidden_size, bias=True)
        self.encoder = MiniCPM4(config)
        #: a decode step's encodings (one patch per sequence) replayed as a proven trace per
        #: input shape (a fast profile's: :meth:`trace_steps`), else None: eager
        self.shape_traces: ShapeTraces | None = None

    def trace_steps(self) -> None:
        """Run a decode step's encoding (one patch per sequence; a prompt's many patches stay
        eager, their shapes being the prompt's) as a TorchScript trace per input shape proven
        equal to the eager one (:class:`mizuoto.runtime.shape_traces.ShapeTraces`: a 0.5B
        step's encoding in 0.76 of its eager time on two AVX2 cores, the same bits). Set it
        after any rewrite of the layers: a trace keeps the packed weights it met."""
        self.shape_traces = ShapeTraces.of_method(self, "encode", name="local encoder")

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """:meth:`encode`, through :attr:`shape_traces` at a decode step where they are set."""
        if self.shape_traces is not None and patches.size(1) == 1:
            return self.shape_traces(patches)
        return self.encode(patches)

    def encode(self, patches: torch.Tensor) -> torch.Tensor:
        """``patches``: ``(batch, patches, patch_size, feat_dim)`` -> ``(batch, patches, hidden)``."""
        batch, length = patches.shape[:2]
        x = self.in_proj(patches)
        cls = self.special_token.expand(batch, length, 1, -1)
        x = torch.cat([cls, x], dim=2).flatten(0, 1)
        hidden, _ = self.encoder(x, causal=False)
        return hidden[:, 0, :].reshape(batch, length, -1)
