"""Second-generation AudioVAE (VoxCPM2): 16 kHz in, 48 kHz out through a decoder conditioned
on the output sample rate."""

from __future__ import annotations

import math

import torch
from torch import nn

from mizuoto_voxcpm.audiovae.base import AudioVAEBase
from mizuoto_voxcpm.audiovae.blocks import CausalDecoderBlock, decoder_input_layers, run_layers
from mizuoto_voxcpm.audiovae.causal import CausalConv1d, CausalStreamState
from mizuoto_voxcpm.audiovae.config import AudioVAEV2Config
from mizuoto_voxcpm.audiovae.snake import Snake1d
from mizuoto_voxcpm.audiovae.streaming import StreamingDecoder

__all__ = ["AudioVAEV2", "SampleRateCondition"]


def _v2_stride_left_pad(stride: int) -> int:
    # the second generation passes output_padding = stride % 2 to its strided encoder convs
    return 2 * math.ceil(stride / 2) - stride % 2


class SampleRateCondition(nn.Module):
    """Per-channel modulation of a decoder block's input by the output sample-rate bucket."""

    def __init__(
        self, input_dim: int, buckets: int, cond_type: str, cond_dim: int, out_layer: bool
    ) -> None:
        super().__init__()
        self.cond_type = cond_type
        out_layer_in_dim = input_dim
        if cond_type in ("scale_bias", "scale_bias_init"):
            self.scale_embed = nn.Embedding(buckets, input_dim)
            self.bias_embed = nn.Embedding(buckets, input_dim)
        elif cond_type == "add":
            self.cond_embed = nn.Embedding(buckets, input_dim)
        else:  # concat
            self.cond_embed = nn.Embedding(buckets, cond_dim)
            out_layer_in_dim = input_dim + cond_dim
        if out_layer:
            self.out_layer = nn.Sequential(
                Snake1d(out_layer_in_dim), CausalConv1d(out_layer_in_dim, input_dim, 1)
            )
        else:
            self.out_layer = nn.Identity()

    def forward(self, x: torch.Tensor, bucket: torch.Tensor) -> torch.Tensor:
        if self.cond_type == "add":
            x = x + self.cond_embed(bucket).unsqueeze(-1)
        elif self.cond_type == "concat":
            cond = self.cond_embed(bucket).unsqueeze(-1).repeat(1, 1, x.shape[-1])
            x = torch.cat([x, cond], dim=1)
        else:
            x = x * self.scale_embed(bucket).unsqueeze(-1) + self.bias_embed(bucket).unsqueeze(-1)
        return self.out_layer(x)


class ConditionedCausalDecoder(nn.Module):
    def __init__(self, config: AudioVAEV2Config) -> None:
        super().__init__()
        layers = decoder_input_layers(
            config.latent_dim,
            config.decoder_dim,
            config.decoder_rates,
            config.depthwise,
            config.use_noise_block,
        )
        if config.sr_bin_boundaries is None:
            self.model = nn.Sequential(*layers)
            self.sr_cond_model = None
            return
        self.model = nn.ModuleList(layers)
        self.register_buffer(
            "sr_bin_boundaries", torch.tensor(config.sr_bin_boundaries, dtype=torch.int32)
        )
        buckets = len(config.sr_bin_boundaries) + 1
        self.sr_cond_model = nn.ModuleList(
            SampleRateCondition(
                layer.input_channels,
                buckets,
                config.cond_type,
                config.cond_dim,
                config.cond_out_layer,
            )
            if isinstance(layer, CausalDecoderBlock)
            else None
            for layer in layers
        )

    def forward(
        self,
        z: torch.Tensor,
        sample_rate: torch.Tensor | None,
        stream: CausalStreamState | None = None,
    ) -> torch.Tensor:
        if self.sr_cond_model is None:
            return run_layers(self.model, z, stream)
        bucket = torch.bucketize(sample_rate, self.sr_bin_boundaries)
        for layer, condition in zip(self.model, self.sr_cond_model, strict=True):
            if condition is not None:
                z = condition(z, bucket)
            z = run_layers((layer,), z, stream)
        return z


class AudioVAEV2(AudioVAEBase):
    """Encodes at ``config.sample_rate``; decodes to ``config.out_sample_rate`` by default."""

    def __init__(self, config: AudioVAEV2Config) -> None:
        super().__init__(config, _v2_stride_left_pad, ConditionedCausalDecoder(config))

    def decode(
        self,
        latents: torch.Tensor,
        out_sample_rate: int | torch.Tensor | None = None,
        stream: CausalStreamState | None = None,
    ) -> torch.Tensor:
        """Audio ``(B, 1, frames * decode_hop_length)`` in [-1, 1] from ``(B, latent_dim, frames)``.

        ``out_sample_rate`` picks the decoder's sample-rate bucket (default
        ``config.out_sample_rate``); the length of the output does not depend on it.
        ``stream`` continues a previous call's causal context (see ``StreamingDecoder``).
        """
        condition = None
        if self.config.sr_bin_boundaries is not None:
            if out_sample_rate is None:
                out_sample_rate = self.out_sample_rate
            if isinstance(out_sample_rate, torch.Tensor):
                condition = out_sample_rate.to(latents.device)
            else:
                condition = torch.tensor([out_sample_rate], device=latents.device, dtype=torch.int32)
        return self.decoder(latents, condition, stream)

    def streaming_decoder(self) -> StreamingDecoder:
        """A fresh chunk-by-chunk decoder (upstream ``streaming_decode()``)."""
        return StreamingDecoder(self)
