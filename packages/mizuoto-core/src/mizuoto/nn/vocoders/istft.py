"""Inverse STFT with Vocos's "same" padding, and the Vocos ISTFT head.

`ISTFT(n_fft, hop_length, win_length, padding="same"|"center")(spec)`: complex ``(b, bins, t)``
-> audio ``(b, samples)``. "same" is Vocos's own overlap-add (``torch.istft`` only pads at the
centre): irfft, window, ``fold`` into ``(t - 1) * hop + win`` samples, trim
``(win - hop) // 2`` at each end, divide by the folded squared window. "center" is
``torch.istft``. Op for op as vocos 0.1.0, hence bitwise equal.

`ISTFTHead(dim, n_fft, hop_length, padding="same")`: hidden ``(b, t, dim)`` -> audio; a linear
map to log-magnitude and phase (``n_fft // 2 + 1`` each), magnitude clipped at 100.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ISTFT(nn.Module):
    window: torch.Tensor

    def __init__(self, n_fft: int, hop_length: int, win_length: int, padding: str = "same") -> None:
        super().__init__()
        if padding not in ("center", "same"):
            raise ValueError(f"padding must be 'center' or 'same', got {padding!r}")
        self.padding = padding
        self.n_fft = n_fft
        self.hop_length = hop_length
        self.win_length = win_length
        self.register_buffer("window", torch.hann_window(win_length))

    def forward(self, spec: torch.Tensor) -> torch.Tensor:
        if self.padding == "center":
            return torch.istft(
                spec, self.n_fft, self.hop_length, self.win_length, self.window, center=True
            )
        if spec.dim() != 3:
            shape = tuple(spec.shape)
            raise ValueError(f"expected a (batch, bins, frames) spectrogram, got {shape}")
        pad = (self.win_length - self.hop_length) // 2
        frames = spec.shape[-1]

        frames_td = torch.fft.irfft(spec, self.n_fft, dim=1, norm="backward")
        frames_td = frames_td * self.window[None, :, None]

        output_size = (frames - 1) * self.hop_length + self.win_length
        fold = dict(
            output_size=(1, output_size),
            kernel_size=(1, self.win_length),
            stride=(1, self.hop_length),
        )
        audio = F.fold(frames_td, **fold)[:, 0, 0, pad:-pad]

        window_sq = self.window.square().expand(1, frames, -1).transpose(1, 2)
        envelope = F.fold(window_sq, **fold).squeeze()[pad:-pad]
        if not bool((envelope > 1e-11).all()):
            raise ValueError("ISTFT window envelope vanishes (NOLA violated)")
        return audio / envelope


class ISTFTHead(nn.Module):
    def __init__(self, dim: int, n_fft: int, hop_length: int, padding: str = "same") -> None:
        super().__init__()
        self.out = nn.Linear(dim, n_fft + 2)
        self.istft = ISTFT(n_fft=n_fft, hop_length=hop_length, win_length=n_fft, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.out(x).transpose(1, 2)
        mag, phase = x.chunk(2, dim=1)
        mag = torch.clip(torch.exp(mag), max=1e2)
        # the complex spectrum exactly as vocos forms it (not torch.polar): same bits
        spec = mag * (torch.cos(phase) + 1j * torch.sin(phase))
        return self.istft(spec)
