"""First-generation AudioVAE: VoxCPM-0.5B (16 kHz) and VoxCPM1.5 (44.1 kHz)."""

from __future__ import annotations

import math

import torch
from torch import nn

from mizuoto_voxcpm.audiovae.base import AudioVAEBase
from mizuoto_voxcpm.audiovae.blocks import decode_tail, decoder_input_layers, run_layers
from mizuoto_voxcpm.audiovae.causal import CausalStreamState
from mizuoto_voxcpm.audiovae.config import AudioVAEConfig

__all__ = ["AudioVAE"]


def _v1_stride_left_pad(stride: int) -> int:
    return 2 * math.ceil(stride / 2)


class CausalDecoder(nn.Module):
    def __init__(self, config: AudioVAEConfig) -> None:
        super().__init__()
        self.model = nn.Sequential(
            *decoder_input_layers(
                config.latent_dim,
                config.decoder_dim,
                config.decoder_rates,
                config.depthwise,
                config.use_noise_block,
            )
        )

    def forward(self, z: torch.Tensor, stream: CausalStreamState | None = None) -> torch.Tensor:
        return run_layers(self.model, z, stream)


class AudioVAE(AudioVAEBase):
    """Waveform ↔ latents at ``config.sample_rate``; ``hop_length`` samples per latent frame."""

    def __init__(self, config: AudioVAEConfig) -> None:
        super().__init__(config, _v1_stride_left_pad, CausalDecoder(config))

    def decode(
        self, latents: torch.Tensor, stream: CausalStreamState | None = None
    ) -> torch.Tensor:
        """Audio ``(B, 1, frames * decode_hop_length)`` in [-1, 1] from ``(B, latent_dim, frames)``.

        ``stream`` continues a previous call's causal context (see ``StreamingDecoder``);
        VoxCPM-0.5B/1.5 never stream this way upstream: they re-decode the last patches.
        """
        return self.decoder(latents, stream)

    def decode_tail(self, latents: torch.Tensor, samples: int) -> torch.Tensor:
        """The last ``samples`` of :meth:`decode`, computing only what they depend on
        (:func:`~mizuoto_voxcpm.audiovae.blocks.decode_tail`; equal up to float rounding)."""
        return decode_tail(self.decoder.model, latents, samples)
