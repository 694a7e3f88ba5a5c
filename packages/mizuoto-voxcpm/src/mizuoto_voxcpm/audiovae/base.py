"""What both AudioVAE generations share: the causal encoder, the sizes and ``encode``."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mizuoto_voxcpm.audiovae.blocks import CausalEncoder, earliest_input


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


class AudioVAEBase(nn.Module):
    """Encoder + a generation's decoder. Always float32; build it with ``load_audio_vae`` (a
    bare instance holds uninitialised weights)."""

    def __init__(self, config, stride_left_pad: Callable[[int], int], decoder: nn.Module) -> None:
        super().__init__()
        self.config = config
        self.encoder = CausalEncoder(
            config.encoder_dim,
            config.latent_dim,
            config.encoder_rates,
            config.depthwise,
            stride_left_pad,
        )
        self.decoder = decoder

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

    @property
    def decoder_receptive_field(self) -> int:
        """How many latent frames before a frame reach its samples through the decoder (the
        decoder is causal: no later frame does). 19 to 21 for the released strides."""
        return -earliest_input(self.decoder.model, 0)

    def encode(self, audio: torch.Tensor, sample_rate: int | None = None) -> torch.Tensor:
        """Latent means ``(B, latent_dim, ceil(T / hop_length))`` of ``(B, T)`` or ``(B, 1, T)``.

        The audio is right-padded with zeros to a multiple of ``hop_length`` first.
        """
        check_sample_rate(sample_rate, self.sample_rate)
        if audio.ndim == 2:
            audio = audio.unsqueeze(1)
        return self.encoder(pad_to_hop(audio, self.hop_length))
