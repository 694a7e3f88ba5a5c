"""First-generation AudioVAE: VoxCPM-0.5B (16 kHz) and VoxCPM1.5 (44.1 kHz)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mizuoto_voxcpm.audiovae.blocks import CausalEncoder, decoder_input_layers, run_layers
from mizuoto_voxcpm.audiovae.causal import CausalStreamState
from mizuoto_voxcpm.audiovae.config import AudioVAEConfig

__all__ = ["AudioVAE", "pad_to_hop"]


def _v1_stride_left_pad(stride: int) -> int:
    return 2 * math.ceil(stride / 2)


def pad_to_hop(audio: torch.Tensor, hop_length: int) -> torch.Tensor:
    """Right-pad with zeros to a whole number of latent frames (upstream ``preprocess``)."""
    length = audio.shape[-1]
    return F.pad(audio, (0, math.ceil(length / hop_length) * hop_length - length))


def check_sample_rate(sample_rate: int | None, expected: int) -> None:
    if sample_rate is not None and sample_rate != expected:
        raise ValueError(
            f"sample_rate: the AudioVAE encodes {expected} Hz audio, got {sample_rate} Hz "
            "(resample first)"
        )


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


class AudioVAE(nn.Module):
    """Waveform ↔ latents at ``config.sample_rate``; ``hop_length`` samples per latent frame.

    Always float32. Build it with ``load_audio_vae``; a bare instance holds uninitialised weights.
    """

    def __init__(self, config: AudioVAEConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = CausalEncoder(
            config.encoder_dim,
            config.latent_dim,
            config.encoder_rates,
            config.depthwise,
            _v1_stride_left_pad,
        )
        self.decoder = CausalDecoder(config)

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def out_sample_rate(self) -> int:
        return self.config.out_sample_rate

    @property
    def latent_dim(self) -> int:
        return self.config.latent_dim

    @property
    def hop_length(self) -> int:
        return self.config.hop_length

    @property
    def decode_hop_length(self) -> int:
        return self.config.decode_hop_length

    def encode(self, audio: torch.Tensor, sample_rate: int | None = None) -> torch.Tensor:
        """Latent means ``(B, latent_dim, ceil(T / hop_length))`` of ``(B, T)`` or ``(B, 1, T)``.

        The audio is right-padded with zeros to a multiple of ``hop_length`` first.
        """
        check_sample_rate(sample_rate, self.sample_rate)
        if audio.ndim == 2:
            audio = audio.unsqueeze(1)
        return self.encoder(pad_to_hop(audio, self.hop_length))

    def decode(
        self, latents: torch.Tensor, stream: CausalStreamState | None = None
    ) -> torch.Tensor:
        """Audio ``(B, 1, frames * decode_hop_length)`` in [-1, 1] from ``(B, latent_dim, frames)``.

        ``stream`` continues a previous call's causal context (see ``StreamingDecoder``);
        VoxCPM-0.5B/1.5 never stream this way upstream: they re-decode the last patches.
        """
        return self.decoder(latents, stream)
