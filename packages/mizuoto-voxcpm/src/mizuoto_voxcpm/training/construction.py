"""Replaying the random draws upstream's trainer makes while it builds the model.

Upstream's accelerator seeds the global generator with 42, then ``from_local`` builds the
AudioVAE and the model with PyTorch's default initialisations (Kaiming-uniform linear and
convolution weights, uniform biases, normal embeddings, a ``randn`` CLS token) before the
checkpoint overwrites them. Those values are lost, but the generator has moved on: the LoRA
``A`` matrices (kept: the checkpoint has none), the data order and every training draw come
after. We make the same draws, in the same order and with the same sizes, into a scratch
buffer, so the private generator arrives where upstream's global one does.

A float32 ``uniform_`` consumes one 32-bit number per element whatever its bounds, so runs of
uniform draws are replayed as one count; ``normal_`` is replayed per tensor (its consumption
depends on the size).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from mizuoto_voxcpm.audiovae import AudioVAEConfig, AudioVAEV2Config
from mizuoto_voxcpm.config import TransformerConfig, VoxCPMConfig

Draw = tuple[str, int]  # ("uniform" | "normal", number of elements)
_CHUNK = 1 << 24


def _linear(in_features: int, out_features: int, bias: bool = True) -> Iterator[Draw]:
    yield "uniform", in_features * out_features
    if bias:
        yield "uniform", out_features


def _conv(in_channels: int, out_channels: int, kernel: int, groups: int = 1,
          bias: bool = True) -> Iterator[Draw]:
    yield "uniform", out_channels * (in_channels // groups) * kernel
    if bias:
        yield "uniform", out_channels


def _minicpm(config: TransformerConfig) -> Iterator[Draw]:
    hidden, heads, kv, dim = (config.hidden_size, config.num_attention_heads,
                              config.num_key_value_heads, config.head_dim)
    if config.vocab_size > 0:
        yield "normal", config.vocab_size * hidden
    for _ in range(config.num_hidden_layers):
        yield from _linear(hidden, heads * dim, bias=False)
        yield from _linear(hidden, kv * dim, bias=False)
        yield from _linear(hidden, kv * dim, bias=False)
        yield from _linear(heads * dim, hidden, bias=False)
        yield from _linear(hidden, config.intermediate_size, bias=False)
        yield from _linear(hidden, config.intermediate_size, bias=False)
        yield from _linear(config.intermediate_size, hidden, bias=False)


def _residual_unit(dim: int, groups: int) -> Iterator[Draw]:
    yield from _conv(dim, dim, 7, groups)
    yield from _conv(dim, dim, 1)


def audio_vae_draws(config: AudioVAEConfig | AudioVAEV2Config) -> Iterator[Draw]:
    """Upstream's ``AudioVAE(config)`` (either generation), in construction order."""
    d_model = config.encoder_dim
    yield from _conv(1, d_model, 7)
    for stride in config.encoder_rates:
        d_model *= 2
        inner = d_model // 2
        groups = inner if config.depthwise else 1
        for _ in range(3):
            yield from _residual_unit(inner, groups)
        yield from _conv(inner, d_model, 2 * stride)
    yield from _conv(d_model, config.latent_dim, 3)
    yield from _conv(d_model, config.latent_dim, 3)

    latent, channels = config.latent_dim, config.decoder_dim
    if config.depthwise:
        yield from _conv(latent, latent, 7, groups=latent)
        yield from _conv(latent, channels, 1)
    else:
        yield from _conv(latent, channels, 7)
    block_inputs = []
    for i, stride in enumerate(config.decoder_rates):
        input_dim, output_dim = channels // 2**i, channels // 2 ** (i + 1)
        groups = output_dim if config.depthwise else 1
        block_inputs.append(input_dim)
        # a transposed convolution's weight is (in, out, kernel): the same count
        yield from _conv(input_dim, output_dim, 2 * stride)
        if config.use_noise_block:
            yield from _conv(output_dim, output_dim, 1, bias=False)
        for _ in range(3):
            yield from _residual_unit(output_dim, groups)
    yield from _conv(output_dim, 1, 7)

    if getattr(config, "sr_bin_boundaries", None) is not None:
        buckets = len(config.sr_bin_boundaries) + 1
        for input_dim in block_inputs:
            out_in = input_dim
            if config.cond_type in ("scale_bias", "scale_bias_init"):
                yield "normal", buckets * input_dim  # scale_embed, built as an nn.Embedding
                yield "normal", buckets * input_dim  # bias_embed
                if config.cond_type == "scale_bias_init":
                    yield "normal", buckets * input_dim
                    yield "normal", buckets * input_dim
            elif config.cond_type == "add":
                yield "normal", buckets * input_dim
                yield "normal", buckets * input_dim
            else:  # concat
                yield "normal", buckets * config.cond_dim
                out_in = input_dim + config.cond_dim
            if config.cond_out_layer:
                yield from _conv(out_in, input_dim, 1)


def model_draws(config: VoxCPMConfig) -> Iterator[Draw]:
    """Upstream's ``VoxCPMModel`` / ``VoxCPM2Model`` constructor, in order (no LoRA)."""
    hidden = config.lm.hidden_size
    yield from _minicpm(config.lm)
    yield from _minicpm(config.residual_lm())
    encoder = config.local(config.encoder)
    yield "normal", encoder.hidden_size  # the local encoder's special token: randn(1, 1, 1, h)
    yield from _linear(config.feat_dim, encoder.hidden_size)
    yield from _minicpm(encoder)
    dit = config.local(config.dit)
    yield from _linear(config.feat_dim, dit.hidden_size)
    yield from _linear(config.feat_dim, dit.hidden_size)
    yield from _linear(dit.hidden_size, config.feat_dim)
    for _ in range(4):  # time_mlp and delta_time_mlp, two layers each
        yield from _linear(dit.hidden_size, dit.hidden_size)
    yield from _minicpm(dit)
    yield from _linear(hidden, config.scalar_quantization_latent_dim)
    yield from _linear(config.scalar_quantization_latent_dim, hidden)
    yield from _linear(config.encoder.hidden_dim, hidden)
    yield from _linear(hidden, config.dit.hidden_dim)
    yield from _linear(hidden, config.dit.hidden_dim)
    if config.is_v2:
        yield from _linear(2 * hidden, hidden)
    yield from _linear(hidden, hidden)
    yield from _linear(hidden, 2, bias=False)


def replay(generator: torch.Generator, draws: Iterator[Draw]) -> int:
    """Consume ``draws`` from ``generator``; returns the number of elements drawn."""
    total = 0
    pending = 0
    scratch = torch.empty(0)

    def buffer(size: int) -> torch.Tensor:
        nonlocal scratch
        if scratch.numel() < size:
            scratch = torch.empty(size)
        return scratch[:size]

    def flush() -> None:
        nonlocal pending
        while pending:
            size = min(pending, _CHUNK)
            buffer(size).uniform_(generator=generator)
            pending -= size

    for kind, count in draws:
        total += count
        if kind == "uniform":
            pending += count
            continue
        flush()
        buffer(count).normal_(generator=generator)
    flush()
    return total
