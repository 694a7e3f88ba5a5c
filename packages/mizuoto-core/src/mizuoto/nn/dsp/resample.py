"""Band-limited (windowed-sinc) resampling, bit-identical to torchaudio's.

:func:`resample` equals ``torchaudio.functional.resample`` and :class:`SincResampler` equals
``torchaudio.transforms.Resample`` (``torch.equal``). The two differ from each other:

- ``resample`` builds the kernel in the waveform's dtype (float32 audio, float32 kernel);
- ``SincResampler`` (like ``Resample``) builds it once in float64 and casts it to float32
  unless given ``dtype``, so its output differs from ``resample``'s in the last bits.

Both rates are divided by their gcd; one kernel row per output phase (``new`` rows of
``2 * width + orig`` taps) is applied with ``conv1d(stride=orig)`` after zero-padding
``width`` samples in front and ``width + orig`` behind, and the output is cut to
``ceil(new * length / orig)`` samples.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

METHODS = ("sinc_interp_hann", "sinc_interp_kaiser")
DEFAULT_KAISER_BETA = 14.769656459379492


def sinc_resample_kernel(
    orig_freq: int,
    new_freq: int,
    *,
    lowpass_filter_width: int = 6,
    rolloff: float = 0.99,
    resampling_method: str = "sinc_interp_hann",
    beta: float | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> tuple[Tensor, int]:
    """The polyphase kernel ``(new, 1, 2 * width + orig)`` and ``width``, rates gcd-reduced.

    With ``dtype=None`` the kernel is computed in float64 and returned as float32.
    """
    if int(orig_freq) != orig_freq or int(new_freq) != new_freq:
        raise ValueError(
            f"resampling needs integer rates, got {orig_freq} and {new_freq}; scale both to "
            "integers with the same ratio"
        )
    if resampling_method not in METHODS:
        raise ValueError(f"resampling_method must be one of {METHODS}, got {resampling_method!r}")
    if lowpass_filter_width <= 0:
        raise ValueError(f"lowpass_filter_width must be positive, got {lowpass_filter_width}")
    gcd = math.gcd(int(orig_freq), int(new_freq))
    orig, new = int(orig_freq) // gcd, int(new_freq) // gcd

    # Cut-off below both Nyquist rates; also needed when upsampling (the zero-padded edges).
    base_freq = min(orig, new) * rolloff
    width = math.ceil(lowpass_filter_width * orig / base_freq)

    # Sample times, in input periods, of the taps of each output phase. torchaudio's dtype
    # quirk kept on purpose: without a dtype, the taps are float64 while the phase offsets
    # come from an int64 arange divided into the default float dtype.
    idx_dtype = dtype if dtype is not None else torch.float64
    taps = torch.arange(-width, width + orig, dtype=idx_dtype, device=device)[None, None] / orig
    t = torch.arange(0, -new, -1, dtype=dtype, device=device)[:, None, None] / new + taps
    t *= base_freq
    t = t.clamp_(-lowpass_filter_width, lowpass_filter_width)

    if resampling_method == "sinc_interp_hann":
        window = torch.cos(t * math.pi / lowpass_filter_width / 2) ** 2
    else:
        # torchaudio makes beta a default-dtype (float32) scalar tensor; kept for equal bits.
        beta_tensor = torch.tensor(float(DEFAULT_KAISER_BETA if beta is None else beta))
        window = torch.i0(beta_tensor * torch.sqrt(1 - (t / lowpass_filter_width) ** 2))
        window = window / torch.i0(beta_tensor)

    t *= math.pi
    scale = base_freq / orig
    kernel = torch.where(t == 0, torch.tensor(1.0).to(t), t.sin() / t)
    kernel *= window * scale
    if dtype is None:
        kernel = kernel.to(dtype=torch.float32)
    return kernel, width


def apply_sinc_kernel(waveform: Tensor, orig_freq: int, new_freq: int, kernel: Tensor,
                      width: int) -> Tensor:
    """Resample ``(..., time)`` with a kernel from :func:`sinc_resample_kernel`."""
    if not waveform.is_floating_point():
        raise TypeError(f"resampling needs a floating-point waveform, got {waveform.dtype}")
    gcd = math.gcd(int(orig_freq), int(new_freq))
    orig, new = int(orig_freq) // gcd, int(new_freq) // gcd

    shape = waveform.size()
    waveform = waveform.reshape(-1, shape[-1])
    num_wavs, length = waveform.shape
    padded = torch.nn.functional.pad(waveform, (width, width + orig))
    phases = torch.nn.functional.conv1d(padded[:, None], kernel, stride=orig)
    resampled = phases.transpose(1, 2).reshape(num_wavs, -1)
    # upstream rounds new * length / orig to a float32 tensor before ceil; kept on purpose
    # (for long inputs it can differ by one sample from an exact ceil).
    target_length = int(torch.ceil(torch.as_tensor(new * length / orig)).long())
    resampled = resampled[..., :target_length]
    return resampled.reshape(shape[:-1] + resampled.shape[-1:])


def resample(
    waveform: Tensor,
    orig_freq: int,
    new_freq: int,
    lowpass_filter_width: int = 6,
    rolloff: float = 0.99,
    resampling_method: str = "sinc_interp_hann",
    beta: float | None = None,
) -> Tensor:
    """Resample ``(..., time)`` from ``orig_freq`` to ``new_freq`` Hz.

    Same arguments and bits as ``torchaudio.functional.resample``; the kernel is built on
    every call in the waveform's dtype and device (use :class:`SincResampler` to cache it).
    """
    if orig_freq <= 0 or new_freq <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_freq} and {new_freq}")
    if orig_freq == new_freq:
        return waveform
    kernel, width = sinc_resample_kernel(
        orig_freq,
        new_freq,
        lowpass_filter_width=lowpass_filter_width,
        rolloff=rolloff,
        resampling_method=resampling_method,
        beta=beta,
        device=waveform.device,
        dtype=waveform.dtype,
    )
    return apply_sinc_kernel(waveform, orig_freq, new_freq, kernel, width)


class SincResampler(nn.Module):
    """Resampler with a cached kernel (buffer ``kernel``); equals ``torchaudio.transforms.Resample``.

    The kernel is computed once in float64 and stored as float32 unless ``dtype`` is given;
    move the module with ``.to(device, dtype)`` to resample other dtypes.
    """

    def __init__(
        self,
        orig_freq: int = 16000,
        new_freq: int = 16000,
        resampling_method: str = "sinc_interp_hann",
        lowpass_filter_width: int = 6,
        rolloff: float = 0.99,
        beta: float | None = None,
        *,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.orig_freq = orig_freq
        self.new_freq = new_freq
        self.resampling_method = resampling_method
        self.lowpass_filter_width = lowpass_filter_width
        self.rolloff = rolloff
        self.beta = beta
        self.width = 0
        if orig_freq != new_freq:
            kernel, self.width = sinc_resample_kernel(
                orig_freq,
                new_freq,
                lowpass_filter_width=lowpass_filter_width,
                rolloff=rolloff,
                resampling_method=resampling_method,
                beta=beta,
                dtype=dtype,
            )
            self.register_buffer("kernel", kernel)

    def forward(self, waveform: Tensor) -> Tensor:
        if self.orig_freq == self.new_freq:
            return waveform
        return apply_sinc_kernel(waveform, self.orig_freq, self.new_freq, self.kernel, self.width)

    def extra_repr(self) -> str:
        return f"{self.orig_freq} -> {self.new_freq} Hz, {self.resampling_method}"
