"""Building blocks shared by both AudioVAE generations (DAC-style, causal).

Module and attribute names (``block``, ``model``, ``fc_mu``) follow upstream so that checkpoint
keys map one to one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from mizuoto_voxcpm.audiovae.causal import CausalConv1d, CausalConvTranspose1d, CausalStreamState
from mizuoto_voxcpm.audiovae.snake import Snake1d

__all__ = [
    "CausalDecoderBlock",
    "CausalEncoder",
    "CausalEncoderBlock",
    "CausalResidualUnit",
    "NoiseBlock",
    "decoder_input_layers",
    "earliest_input",
    "noise_drawn_from",
    "run_layers",
]


def run_layers(
    layers: Iterable[nn.Module], x: torch.Tensor, stream: CausalStreamState | None
) -> torch.Tensor:
    """Apply ``layers`` in order, handing the stream state to those that carry context."""
    for layer in layers:
        if isinstance(layer, _STREAMED):
            x = layer(x, stream)
        else:
            x = layer(x)
    return x


class CausalResidualUnit(nn.Module):
    """Snake → dilated causal conv (kernel 7) → Snake → 1x1 conv, plus the input."""

    def __init__(self, dim: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        # upstream's padding is ((7 - 1) * dilation) // 2, doubled on the left
        left_pad = ((7 - 1) * dilation) // 2 * 2
        self.block = nn.Sequential(
            Snake1d(dim),
            CausalConv1d(dim, dim, 7, left_pad=left_pad, dilation=dilation, groups=groups),
            Snake1d(dim),
            CausalConv1d(dim, dim, 1),
        )

    def forward(self, x: torch.Tensor, stream: CausalStreamState | None = None) -> torch.Tensor:
        out = run_layers(self.block, x, stream)
        if torch.is_grad_enabled() and (x.requires_grad or out.requires_grad):
            return x + out
        return out.add_(x)  # upstream's x + y, in place (the sum commutes exactly)


class CausalEncoderBlock(nn.Module):
    """Three residual units (dilations 1, 3, 9), then a strided conv doubling the channels."""

    def __init__(self, output_dim: int, stride: int, groups: int, stride_left_pad: int) -> None:
        super().__init__()
        input_dim = output_dim // 2
        self.block = nn.Sequential(
            CausalResidualUnit(input_dim, dilation=1, groups=groups),
            CausalResidualUnit(input_dim, dilation=3, groups=groups),
            CausalResidualUnit(input_dim, dilation=9, groups=groups),
            Snake1d(input_dim),
            CausalConv1d(input_dim, output_dim, 2 * stride, left_pad=stride_left_pad, stride=stride),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_layers(self.block, x, None)


class CausalEncoder(nn.Module):
    """Waveform ``(B, 1, T)`` to the latent mean ``(B, latent_dim, T / hop)``.

    ``stride_left_pad(stride)`` is where the generations differ: the first pads strided convs
    by ``2 * ceil(stride / 2)``, the second by one less for odd strides.
    """

    def __init__(
        self,
        d_model: int,
        latent_dim: int,
        strides: Iterable[int],
        depthwise: bool,
        stride_left_pad: Callable[[int], int],
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [CausalConv1d(1, d_model, 7, left_pad=6)]
        for stride in strides:
            d_model *= 2
            groups = d_model // 2 if depthwise else 1
            layers.append(CausalEncoderBlock(d_model, stride, groups, stride_left_pad(stride)))
        self.block = nn.Sequential(*layers)
        self.fc_mu = CausalConv1d(d_model, latent_dim, 3, left_pad=2)
        # Loaded but never run at inference: only the mean is used.
        self.fc_logvar = CausalConv1d(d_model, latent_dim, 3, left_pad=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_mu(run_layers(self.block, x, None))


class NoiseBlock(nn.Module):
    """Adds ``noise * W x`` with one Gaussian per time step, drawn from ``generator`` (torch's
    global generator when ``None``; see :func:`noise_drawn_from`)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = CausalConv1d(dim, dim, 1, bias=False)
        self.generator: torch.Generator | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, _, frames = x.shape
        noise = torch.randn((batch, 1, frames), device=x.device, dtype=x.dtype,
                            generator=self.generator)
        return x + noise * self.linear(x)


@contextmanager
def noise_drawn_from(vae: nn.Module, generator: torch.Generator | None) -> Iterator[None]:
    """Within the block, every noise block of ``vae`` draws from ``generator``.

    Upstream's noise blocks draw from the global generator that its sampler has just used, so
    a decode continues the sampler's stream of numbers (and, streaming, the next patch's draw
    continues after the decode's). Passing the sampler's own generator reproduces that.
    """
    blocks = [m for m in vae.modules() if isinstance(m, NoiseBlock)]
    for block in blocks:
        block.generator = generator
    try:
        yield
    finally:
        for block in blocks:
            block.generator = None


class CausalDecoderBlock(nn.Module):
    """Snake → transposed conv upsampling by ``stride`` → [noise] → three residual units."""

    def __init__(
        self, input_dim: int, output_dim: int, stride: int, groups: int, use_noise_block: bool
    ) -> None:
        super().__init__()
        padding = math.ceil(stride / 2)
        layers: list[nn.Module] = [
            Snake1d(input_dim),
            CausalConvTranspose1d(
                input_dim, output_dim, 2 * stride, stride=stride, trim=padding * 2 - stride % 2
            ),
        ]
        if use_noise_block:
            layers.append(NoiseBlock(output_dim))
        layers += [
            CausalResidualUnit(output_dim, dilation=1, groups=groups),
            CausalResidualUnit(output_dim, dilation=3, groups=groups),
            CausalResidualUnit(output_dim, dilation=9, groups=groups),
        ]
        self.block = nn.Sequential(*layers)
        self.input_channels = input_dim

    def forward(self, x: torch.Tensor, stream: CausalStreamState | None = None) -> torch.Tensor:
        return run_layers(self.block, x, stream)


def decoder_input_layers(
    input_channel: int,
    channels: int,
    rates: Iterable[int],
    depthwise: bool,
    use_noise_block: bool,
    d_out: int = 1,
) -> list[nn.Module]:
    """The decoder's layer list, in upstream's order (indices are checkpoint key positions)."""
    if depthwise:
        layers: list[nn.Module] = [
            CausalConv1d(input_channel, input_channel, 7, left_pad=6, groups=input_channel),
            CausalConv1d(input_channel, channels, 1),
        ]
    else:
        layers = [CausalConv1d(input_channel, channels, 7, left_pad=6)]
    output_dim = channels
    for i, stride in enumerate(rates):
        input_dim = channels // 2**i
        output_dim = channels // 2 ** (i + 1)
        groups = output_dim if depthwise else 1
        layers.append(CausalDecoderBlock(input_dim, output_dim, stride, groups, use_noise_block))
    layers += [
        Snake1d(output_dim),
        CausalConv1d(output_dim, d_out, 7, left_pad=6),
        nn.Tanh(),
    ]
    return layers


def earliest_input(layers: Iterable[nn.Module], index: int) -> int:
    """The earliest input position that output position ``index`` of ``layers`` (applied in
    order, causal) depends on; the latest is ``index`` itself, scaled by the strides.

    Walks the layers backwards: a causal convolution reaches ``left_pad`` positions back, a
    transposed one (kernel ``k``, stride ``s``) maps output ``t`` to input
    ``ceil((t - k + 1) / s)``, a residual unit reaches as far as its branch. Every other layer
    (Snake, tanh, the noise and sample-rate blocks' 1x1 convolutions) is pointwise in time.
    """
    for layer in reversed(list(layers)):
        if isinstance(layer, CausalConvTranspose1d):
            index = -((layer.kernel_size[0] - 1 - index) // layer.stride[0])
        elif isinstance(layer, CausalConv1d):
            index -= layer.left_pad
        elif isinstance(layer, (CausalResidualUnit, CausalDecoderBlock)):
            index = earliest_input(layer.block, index)
    return index


_STREAMED = (CausalConv1d, CausalConvTranspose1d, CausalResidualUnit, CausalDecoderBlock)


def decode_tail(layers: Iterable[nn.Module], z: torch.Tensor, keep: int) -> torch.Tensor:
    """The last ``keep`` output samples of ``run_layers(layers, z, None)``, each layer run only
    over the positions those samples depend on (:func:`earliest_input`).

    A causal decoder's output at ``t`` depends on no input after ``t``, and on nothing before
    :func:`earliest_input` of ``t``: cropping each layer's input to what the kept samples need
    drops work, not information (the first generation's streaming re-decodes three patches to
    keep the last one's samples: two thirds of that decode is thrown away). The kept samples
    are the same sums over the same values; convolutions over fewer positions may group them
    differently, so they can differ from the whole decode by float rounding.
    """
    flat: list[nn.Module] = []
    for layer in layers:
        flat.extend(layer.block if isinstance(layer, CausalDecoderBlock) else [layer])
    if any(isinstance(layer, NoiseBlock) for layer in flat):
        raise ValueError("decode_tail: noise blocks draw per position; decode whole")
    total = z.size(-1)
    for layer in flat:
        if isinstance(layer, CausalConvTranspose1d):
            total *= layer.stride[0]
    target = total - keep
    x, offset = z, 0  # offset: the full-decode position of x[..., 0] at this layer's input
    for index, layer in enumerate(flat):
        start = max(earliest_input(flat[index:], target), 0)
        if start > offset:
            x, offset = x[..., start - offset:], start
        if isinstance(layer, _STREAMED):
            x = layer(x, None)
        else:
            x = layer(x)
        if isinstance(layer, CausalConvTranspose1d):
            offset *= layer.stride[0]
    return x[..., target - offset:]
