"""The random draws upstream's trainer makes while it builds the model, replayed with core's
`mizuoto.training.init_draws`.

Upstream's accelerator seeds the global generator with 42, then ``from_local`` builds the
AudioVAE and the model with PyTorch's default initialisations (Kaiming-uniform linear and
convolution weights, uniform biases, normal embeddings, a ``randn`` CLS token) before the
checkpoint overwrites them; the LoRA ``A`` matrices, the data order and every training draw
come after. `audio_vae_draws` and `model_draws` list those draws in construction order.
"""

from __future__ import annotations

from collections.abc import Iterator

from mizuoto.training.init_draws import Draw, conv, linear
from mizuoto_voxcpm.audiovae import AudioVAEConfig, AudioVAEV2Config
from mizuoto_voxcpm.config import TransformerConfig, VoxCPMConfig


def _minicpm(config: TransformerConfig) -> Iterator[Draw]:
    hidden, heads, kv, dim = (config.hidden_size, config.num_attention_heads,
                              config.num_key_value_heads, config.head_dim)
    if config.vocab_size > 0:
        yield "normal", config.vocab_size * hidden
    for _ in range(config.num_hidden_layers):
        yield from linear(hidden, heads * dim, bias=False)
        yield from linear(hidden, kv * dim, bias=False)
        yield from linear(hidden, kv * dim, bias=False)
        yield from linear(heads * dim, hidden, bias=False)
        yield from linear(hidden, config.intermediate_size, bias=False)
        yield from linear(hidden, config.intermediate_size, bias=False)
        yield from linear(config.intermediate_size, hidden, bias=False)


def _residual_unit(dim: int, groups: int) -> Iterator[Draw]:
    yield from conv(dim, dim, 7, groups)
    yield from conv(dim, dim, 1)


def audio_vae_draws(config: AudioVAEConfig | AudioVAEV2Config) -> Iterator[Draw]:
    """Upstream's ``AudioVAE(config)`` (either generation), in construction order."""
    d_model = config.encoder_dim
    yield from conv(1, d_model, 7)
    for stride in config.encoder_rates:
        d_model *= 2
        inner = d_model // 2
        groups = inner if config.depthwise else 1
        for _ in range(3):
            yield from _residual_unit(inner, groups)
        yield from conv(inner, d_model, 2 * stride)
    yield from conv(d_model, config.latent_dim, 3)
    yield from conv(d_model, config.latent_dim, 3)

    latent, channels = config.latent_dim, config.decoder_dim
    if config.depthwise:
        yield from conv(latent, latent, 7, groups=latent)
        yield from conv(latent, channels, 1)
    else:
        yield from conv(latent, channels, 7)
    block_inputs = []
    for i, stride in enumerate(config.decoder_rates):
        input_dim, output_dim = channels // 2**i, channels // 2 ** (i + 1)
        groups = output_dim if config.depthwise else 1
        block_inputs.append(input_dim)
        # a transposed convolution's weight is (in, out, kernel): the same count
        yield from conv(input_dim, output_dim, 2 * stride)
        if config.use_noise_block:
            yield from conv(output_dim, output_dim, 1, bias=False)
        for _ in range(3):
            yield from _residual_unit(output_dim, groups)
    yield from conv(output_dim, 1, 7)

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
                yield from conv(out_in, input_dim, 1)


def model_draws(config: VoxCPMConfig) -> Iterator[Draw]:
    """Upstream's ``VoxCPMModel`` / ``VoxCPM2Model`` constructor, in order (no LoRA)."""
    hidden = config.lm.hidden_size
    yield from _minicpm(config.lm)
    yield from _minicpm(config.residual_lm())
    encoder = config.local(config.encoder)
    yield "normal", encoder.hidden_size  # the local encoder's special token: randn(1, 1, 1, h)
    yield from linear(config.feat_dim, encoder.hidden_size)
    yield from _minicpm(encoder)
    dit = config.local(config.dit)
    yield from linear(config.feat_dim, dit.hidden_size)
    yield from linear(config.feat_dim, dit.hidden_size)
    yield from linear(dit.hidden_size, config.feat_dim)
    for _ in range(4):  # time_mlp and delta_time_mlp, two layers each
        yield from linear(dit.hidden_size, dit.hidden_size)
    yield from _minicpm(dit)
    yield from linear(hidden, config.scalar_quantization_latent_dim)
    yield from linear(config.scalar_quantization_latent_dim, hidden)
    yield from linear(config.encoder.hidden_dim, hidden)
    yield from linear(hidden, config.dit.hidden_dim)
    yield from linear(hidden, config.dit.hidden_dim)
    if config.is_v2:
        yield from linear(2 * hidden, hidden)
    yield from linear(hidden, hidden)
    yield from linear(hidden, 2, bias=False)
