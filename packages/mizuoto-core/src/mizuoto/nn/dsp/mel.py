"""Mel filterbank and (log-)mel spectrogram.

Bit-identical (``torch.equal``) to ``torchaudio.transforms.MelSpectrogram`` and
``torchaudio.functional.melscale_fbanks``, and so to the mel features of Vocos
(``MelSpectrogramFeatures``) and F5-TTS (``MelSpec`` with ``mel_spec_type="vocos"``).
Bits depend on the order of operations, so this module repeats torchaudio's exactly:

- the filterbank is built in float32: ``linspace`` over Hz bins and over mel points, HTK
  ``700 * (10 ** (m / 2595) - 1)``, then the triangles as ``max(0, min(down, up))`` with the
  down slope written ``(-1.0 * slopes) / diff``;
- the spectrogram flattens leading dims to one batch dim before ``torch.stft`` (complex), takes
  ``abs()`` and, only when ``power != 1``, ``pow(power)``;
- the mel projection is ``(spec.transpose(-1, -2) @ fb).transpose(-1, -2)``; ``fb.T @ spec``
  happens to match on CPU today, but only torchaudio's form is guaranteed to pick the same
  matmul kernel on every backend.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

logger = logging.getLogger(__name__)

MEL_SCALES = ("htk", "slaney")

# Slaney's scale: linear below 1 kHz, logarithmic above.
_SLANEY_F_SP = 200.0 / 3
_SLANEY_MIN_LOG_HZ = 1000.0
_SLANEY_MIN_LOG_MEL = _SLANEY_MIN_LOG_HZ / _SLANEY_F_SP
_SLANEY_LOGSTEP = math.log(6.4) / 27.0


def hz_to_mel(freq: float, mel_scale: str = "htk") -> float:
    """One frequency in Hz to mels (a Python float, as torchaudio computes it)."""
    _check_mel_scale(mel_scale)
    if mel_scale == "htk":
        return 2595.0 * math.log10(1.0 + (freq / 700.0))
    mels = freq / _SLANEY_F_SP
    if freq >= _SLANEY_MIN_LOG_HZ:
        mels = _SLANEY_MIN_LOG_MEL + math.log(freq / _SLANEY_MIN_LOG_HZ) / _SLANEY_LOGSTEP
    return mels


def mel_to_hz(mels: Tensor, mel_scale: str = "htk") -> Tensor:
    """Mel values to Hz, elementwise."""
    _check_mel_scale(mel_scale)
    if mel_scale == "htk":
        return 700.0 * (10.0 ** (mels / 2595.0) - 1.0)
    freqs = _SLANEY_F_SP * mels
    log_part = mels >= _SLANEY_MIN_LOG_MEL
    freqs[log_part] = _SLANEY_MIN_LOG_HZ * torch.exp(
        _SLANEY_LOGSTEP * (mels[log_part] - _SLANEY_MIN_LOG_MEL)
    )
    return freqs


def melscale_fbanks(
    n_freqs: int,
    f_min: float,
    f_max: float,
    n_mels: int,
    sample_rate: int,
    norm: str | None = None,
    mel_scale: str = "htk",
) -> Tensor:
    """Triangular mel filterbank of shape ``(n_freqs, n_mels)``, float32.

    Apply it as ``spec.transpose(-1, -2) @ fb``. ``norm="slaney"`` divides each triangle by
    its width in Hz (constant energy per band).
    """
    if norm not in (None, "slaney"):
        raise ValueError(f'norm must be None or "slaney", got {norm!r}')
    all_freqs = torch.linspace(0, sample_rate // 2, n_freqs)
    m_pts = torch.linspace(hz_to_mel(f_min, mel_scale), hz_to_mel(f_max, mel_scale), n_mels + 2)
    f_pts = mel_to_hz(m_pts, mel_scale)

    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - all_freqs.unsqueeze(1)  # (n_freqs, n_mels + 2)
    # torchaudio negates by multiplying with -1.0 before dividing; kept for identical bits.
    down = (-1.0 * slopes[:, :-2]) / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    fb = torch.max(torch.zeros(1), torch.min(down, up))

    if norm == "slaney":
        fb *= (2.0 / (f_pts[2 : n_mels + 2] - f_pts[:n_mels])).unsqueeze(0)
    if (fb.max(dim=0).values == 0.0).any():
        logger.warning("a mel filter is all zeros: n_mels=%d is too many for n_freqs=%d",
                       n_mels, n_freqs)
    return fb


def spectrogram(
    waveform: Tensor,
    window: Tensor,
    *,
    n_fft: int,
    hop_length: int,
    win_length: int,
    power: float | None = 1.0,
    pad: int = 0,
    center: bool = True,
    pad_mode: str = "reflect",
    normalized: bool | str = False,
) -> Tensor:
    """STFT magnitude (``power=1``), power (``2``) or complex (``None``) of ``(..., time)``.

    Returns ``(..., n_fft // 2 + 1, frames)``. ``normalized`` is ``False``, ``True`` or
    ``"window"`` (divide by the window's L2 norm) or ``"frame_length"`` (STFT-normalised).
    """
    frame_length_norm, window_norm = _spec_norms(normalized)
    if pad > 0:
        waveform = torch.nn.functional.pad(waveform, (pad, pad), "constant")
    shape = waveform.size()
    spec = torch.stft(
        waveform.reshape(-1, shape[-1]),
        n_fft=n_fft,
        hop_length=hop_length,
        win_length=win_length,
        window=window,
        center=center,
        pad_mode=pad_mode,
        normalized=frame_length_norm,
        onesided=True,
        return_complex=True,
    )
    spec = spec.reshape(shape[:-1] + spec.shape[-2:])
    if window_norm:
        spec /= window.pow(2.0).sum().sqrt()
    if power is None:
        return spec
    if power == 1.0:
        return spec.abs()
    return spec.abs().pow(power)


class MelSpectrogram(nn.Module):
    """Mel spectrogram of ``(..., time)`` audio: ``(..., n_mels, frames)``.

    Same arguments and defaults as ``torchaudio.transforms.MelSpectrogram``; buffers
    ``window`` (``win_length``) and ``filterbank`` (``(n_fft // 2 + 1, n_mels)``).
    """

    def __init__(
        self,
        sample_rate: int = 16000,
        n_fft: int = 400,
        win_length: int | None = None,
        hop_length: int | None = None,
        f_min: float = 0.0,
        f_max: float | None = None,
        pad: int = 0,
        n_mels: int = 128,
        window_fn: Callable[..., Tensor] = torch.hann_window,
        power: float = 2.0,
        normalized: bool | str = False,
        center: bool = True,
        pad_mode: str = "reflect",
        norm: str | None = None,
        mel_scale: str = "htk",
    ) -> None:
        super().__init__()
        self.sample_rate = sample_rate
        self.n_fft = n_fft
        self.win_length = win_length if win_length is not None else n_fft
        self.hop_length = hop_length if hop_length is not None else self.win_length // 2
        self.f_min = f_min
        self.f_max = f_max if f_max is not None else float(sample_rate // 2)
        if self.f_min > self.f_max:
            raise ValueError(f"f_min ({f_min}) must not exceed f_max ({self.f_max})")
        self.pad = pad
        self.n_mels = n_mels
        self.power = power
        self.normalized = normalized
        self.center = center
        self.pad_mode = pad_mode
        self.register_buffer("window", window_fn(self.win_length))
        self.register_buffer(
            "filterbank",
            melscale_fbanks(n_fft // 2 + 1, self.f_min, self.f_max, n_mels, sample_rate,
                            norm, mel_scale),
        )

    def forward(self, waveform: Tensor) -> Tensor:
        spec = spectrogram(
            waveform,
            self.window,
            n_fft=self.n_fft,
            hop_length=self.hop_length,
            win_length=self.win_length,
            power=self.power,
            pad=self.pad,
            center=self.center,
            pad_mode=self.pad_mode,
            normalized=self.normalized,
        )
        return torch.matmul(spec.transpose(-1, -2), self.filterbank).transpose(-1, -2)


class LogMelSpectrogram(MelSpectrogram):
    """Natural log of a magnitude mel spectrogram, clipped below at ``clip_val``.

    Defaults are the Vocos 24 kHz features. F5-TTS clips at ``1e-5``; Vocos's own
    ``MelSpectrogramFeatures`` uses ``safe_log`` which clips at ``1e-7``: pass the one
    the checkpoint was trained with.
    """

    def __init__(
        self,
        sample_rate: int = 24000,
        n_fft: int = 1024,
        hop_length: int = 256,
        n_mels: int = 100,
        *,
        win_length: int | None = None,
        clip_val: float = 1e-5,
        center: bool = True,
    ) -> None:
        super().__init__(
            sample_rate=sample_rate,
            n_fft=n_fft,
            win_length=win_length,
            hop_length=hop_length,
            n_mels=n_mels,
            power=1.0,
            center=center,
        )
        self.clip_val = clip_val

    def forward(self, waveform: Tensor) -> Tensor:
        return super().forward(waveform).clamp(min=self.clip_val).log()


def log_mel_spectrogram(
    waveform: Tensor,
    *,
    sample_rate: int = 24000,
    n_fft: int = 1024,
    hop_length: int = 256,
    win_length: int = 1024,
    n_mels: int = 100,
    clip_val: float = 1e-5,
) -> Tensor:
    """Log-mel of ``(..., time)`` audio with a per-device cached :class:`LogMelSpectrogram`.

    With the defaults this is F5-TTS's ``get_vocos_mel_spectrogram`` (which also squeezes a
    ``(batch, 1, time)`` input to ``(batch, time)`` first; here the caller does that).
    """
    module = _cached_log_mel(sample_rate, n_fft, hop_length, win_length, n_mels, clip_val,
                             waveform.device)
    return module(waveform)


@functools.lru_cache(maxsize=16)
def _cached_log_mel(sample_rate: int, n_fft: int, hop_length: int, win_length: int,
                    n_mels: int, clip_val: float, device: torch.device) -> LogMelSpectrogram:
    return LogMelSpectrogram(sample_rate, n_fft, hop_length, n_mels, win_length=win_length,
                             clip_val=clip_val).to(device)


def _spec_norms(normalized: bool | str) -> tuple[bool, bool]:
    """``(frame_length_norm, window_norm)`` from torchaudio's ``normalized`` argument."""
    if isinstance(normalized, str):
        if normalized not in ("frame_length", "window"):
            raise ValueError(f'normalized must be "frame_length" or "window", got {normalized!r}')
        return normalized == "frame_length", normalized == "window"
    return False, bool(normalized)


def _check_mel_scale(mel_scale: str) -> None:
    if mel_scale not in MEL_SCALES:
        raise ValueError(f'mel_scale must be "htk" or "slaney", got {mel_scale!r}')
