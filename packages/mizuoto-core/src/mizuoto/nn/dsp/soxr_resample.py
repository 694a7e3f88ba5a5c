"""soxr resampling and file loading exactly as librosa does them.

VoxCPM2 reads prompt audio with ``librosa.load(path, sr=..., mono=True)``; these functions
reproduce it bit for bit with soundfile and soxr alone:

- :func:`resample_soxr` is ``librosa.resample(y, orig_sr=..., target_sr=..., res_type="soxr_hq")``:
  each channel is resampled on its own (librosa vectorises with ``np.apply_along_axis``,
  soxr never sees two channels at once), the result is zero-padded or cut to
  ``ceil(length * target / orig)`` samples, and cast back to the input's dtype;
- :func:`load_like_librosa` is ``librosa.load``: soundfile reads float32, channels are
  averaged (``np.mean`` over the channel axis) before resampling.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf
import soxr
import torch
from torch import Tensor

from mizuoto.errors import InvalidAudio
from mizuoto.validation.audio import check_input_audio


def resample_soxr(
    samples: np.ndarray | Tensor,
    orig_sr: int,
    target_sr: int,
    quality: str = "HQ",
    *,
    axis: int = -1,
) -> np.ndarray | Tensor:
    """Resample along ``axis`` (time) with soxr, as ``librosa.resample(res_type="soxr_hq")``.

    ``samples`` is float32 or float64, any number of leading channel dims; a tensor comes back
    as a CPU tensor. ``quality`` is soxr's (``"QQ"``, ``"LQ"``, ``"MQ"``, ``"HQ"``, ``"VHQ"``)
    or librosa's ``"soxr_hq"`` spelling (soxr accepts both).
    """
    if isinstance(samples, Tensor):
        result = resample_soxr(samples.detach().cpu().numpy(), orig_sr, target_sr, quality,
                               axis=axis)
        return torch.from_numpy(np.ascontiguousarray(result))
    _check_librosa_audio(samples)
    if orig_sr == target_sr:
        return samples
    ratio = float(target_sr) / orig_sr
    n_samples = int(np.ceil(samples.shape[axis] * ratio))
    resampled = np.apply_along_axis(soxr.resample, axis, samples, in_rate=orig_sr,
                                    out_rate=target_sr, quality=quality)
    resampled = _fix_length(resampled, n_samples, axis)
    return np.asarray(resampled, dtype=samples.dtype)


def load_like_librosa(
    path: str | Path,
    sr: int | None = 22050,
    *,
    mono: bool = True,
    field: str = "audio",
) -> tuple[np.ndarray, int]:
    """``librosa.load(path, sr=sr, mono=mono)`` for files soundfile can read.

    Returns float32 ``(samples, rate)``: ``(time,)`` when mono, else ``(channels, time)``;
    ``sr=None`` keeps the file's rate. Unreadable files raise :class:`InvalidAudio` for
    ``field`` (librosa would fall back to audioread; formats libsndfile lacks are not read).
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidAudio(field, f"file not found: {path}", "pass the path of an audio file")
    try:
        with sf.SoundFile(path) as file:
            native_sr = file.samplerate
            samples = file.read(frames=-1, dtype="float32", always_2d=False).T
    except (sf.LibsndfileError, RuntimeError) as exc:
        raise InvalidAudio(field, f"cannot read {path} as audio: {exc}",
                           "use WAV, FLAC, OGG or MP3") from exc
    check_input_audio(samples, native_sr, field, str(path))
    if mono:
        samples = mono_like_librosa(samples)
    if sr is None:
        return samples, native_sr
    return resample_soxr(samples, native_sr, sr, "HQ"), sr


def mono_like_librosa(samples: np.ndarray) -> np.ndarray:
    """``librosa.to_mono``: channels first, averaged over every leading dim; validated even
    when already mono (float, finite), as librosa does."""
    _check_librosa_audio(samples)
    if samples.ndim > 1:
        samples = np.mean(samples, axis=tuple(range(samples.ndim - 1)))
    return samples


def _fix_length(data: np.ndarray, size: int, axis: int) -> np.ndarray:
    """Cut or zero-pad ``data`` to ``size`` along ``axis`` (librosa's ``fix_length``)."""
    n = data.shape[axis]
    if n > size:
        index = [slice(None)] * data.ndim
        index[axis] = slice(0, size)
        return data[tuple(index)]
    if n < size:
        widths = [(0, 0)] * data.ndim
        widths[axis] = (0, size - n)
        return np.pad(data, widths, mode="constant")
    return data


def _check_librosa_audio(samples: np.ndarray) -> None:
    """The checks of librosa's ``valid_audio``: floating point, at least 1-D, finite."""
    if not isinstance(samples, np.ndarray):
        raise TypeError(f"audio must be a numpy array, got {type(samples).__name__}")
    if not np.issubdtype(samples.dtype, np.floating):
        raise TypeError(f"audio must be floating point, got {samples.dtype}")
    if samples.ndim == 0:
        raise ValueError("audio must be at least one-dimensional")
    if not np.isfinite(samples).all():
        raise ValueError("audio has non-finite samples (NaN or infinity)")
