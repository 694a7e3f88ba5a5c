"""Causal convolutions of the AudioVAE, and the state that lets the decoder run chunk by chunk.

Each convolution holds a plain ``weight``: the checkpoint stores weight-norm factors
(``weight_g``, ``weight_v``) that the loader folds once (see ``loading.py``).

Streaming (upstream ``StreamingVAEDecoder``): a convolution that pads ``p`` samples on the left
instead prepends the last ``p`` input samples of the previous chunk; a transposed convolution
prepends its last ``(kernel - 1) // stride`` input frames and drops the output they produce
again. The first chunk sees zeros, as a whole-sequence decode does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CausalConv1d", "CausalConvTranspose1d", "CausalStreamState"]


class CausalStreamState:
    """Per-convolution left context carried between decoder calls."""

    def __init__(self) -> None:
        self._context: dict[nn.Module, torch.Tensor] = {}

    def reset(self) -> None:
        self._context.clear()

    def __len__(self) -> int:
        return len(self._context)

    def extend(self, module: nn.Module, x: torch.Tensor, size: int) -> torch.Tensor:
        """``x`` with ``size`` frames of remembered (or zero) context on its left.

        Remembers the last ``size`` frames of the result for the next call, which is what
        upstream keeps in both of its branches (whole chunk longer or shorter than ``size``).
        """
        previous = self._context.get(module)
        if previous is None:
            extended = F.pad(x, (size, 0))
        else:
            extended = torch.cat([previous, x], dim=-1)
        self._context[module] = extended[..., -size:].detach()
        return extended


class CausalConv1d(nn.Conv1d):
    """Conv1d padded with ``left_pad`` zeros on the left only."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        left_pad: int = 0,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            dilation=dilation,
            groups=groups,
            bias=bias,
        )
        self.left_pad = left_pad

    def forward(self, x: torch.Tensor, stream: CausalStreamState | None = None) -> torch.Tensor:
        if self.left_pad == 0:
            return super().forward(x)
        if stream is None:
            return super().forward(F.pad(x, (self.left_pad, 0)))
        return super().forward(stream.extend(self, x, self.left_pad))


class CausalConvTranspose1d(nn.ConvTranspose1d):
    """ConvTranspose1d whose last ``trim`` output samples are dropped."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, *, stride: int, trim: int
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride=stride)
        self.trim = trim

    def forward(self, x: torch.Tensor, stream: CausalStreamState | None = None) -> torch.Tensor:
        context = (self.kernel_size[0] - 1) // self.stride[0]
        if stream is None or context == 0:
            # upstream slices [..., :-trim] (trim is the stride here, never zero)
            return super().forward(x)[..., : -self.trim]
        out = super().forward(stream.extend(self, x, context))
        left = context * self.stride[0]
        return out[..., left : -self.trim] if self.trim > 0 else out[..., left:]
