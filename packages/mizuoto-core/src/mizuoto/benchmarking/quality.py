"""How far a configuration's audio is from the base configuration's, for ``mizuoto bench``'s
side-by-side columns (a fast profile against the exact path): the speed-up, the waveform SNR,
the mel SNR and whether the end of speech moved.

Both SNRs are over the samples both outputs have (an output that stopped earlier is compared
on its length; the ``stop`` entry says so). The mel SNR compares magnitude mel spectrograms
(1024-point STFT, hop 256, 100 bands: F5-TTS's vocoder mel), which ignore phase: two outputs
that sound alike but drift in phase score higher there than on the waveform. Imports torch
(for the mel) only when called.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

#: The mel of the mel SNR (magnitude, F5-TTS's vocoder settings).
MEL = {"n_fft": 1024, "hop_length": 256, "n_mels": 100}


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    """``10 log10(|reference|² / |other - reference|²)`` over the common length; ``inf`` when
    equal there, ``-inf`` when the reference is silent and the other not."""
    length = min(reference.size, other.size)
    reference = reference[:length].astype(np.float64)
    noise = float(np.sum((other[:length].astype(np.float64) - reference) ** 2))
    signal = float(np.sum(reference**2))
    if noise == 0:
        return math.inf
    return -math.inf if signal == 0 else 10 * math.log10(signal / noise)


def mel_snr_db(reference: np.ndarray, other: np.ndarray, sample_rate: int) -> float | None:
    """:func:`snr_db` of the two magnitude mel spectrograms (:data:`MEL`); ``None`` for audio
    shorter than one STFT window."""
    length = min(reference.size, other.size)
    if length <= MEL["n_fft"]:
        return None
    import torch

    from mizuoto.nn.dsp.mel import MelSpectrogram

    mel = MelSpectrogram(sample_rate, n_fft=MEL["n_fft"], hop_length=MEL["hop_length"],
                         n_mels=MEL["n_mels"], power=1.0)
    with torch.no_grad():
        spectra = [mel(torch.from_numpy(np.ascontiguousarray(audio[:length], np.float32)))
                   for audio in (reference, other)]
    return snr_db(spectra[0].double().numpy().ravel(), spectra[1].double().numpy().ravel())


def stop_moved(base: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    """Whether the end of speech moved: by the patch count where the engine reports one
    (``applied.extra["patches"]``, VoxCPM), else by the length."""
    if base.get("patches") is not None and other.get("patches") is not None:
        return {"moved": base["patches"] != other["patches"], "unit": "patches",
                "base": base["patches"], "this": other["patches"]}
    return {"moved": base["samples"] != other["samples"], "unit": "samples",
            "base": base["samples"], "this": other["samples"]}


def against_base(base_run: Mapping[str, Any], run: Mapping[str, Any], base_audio: Path,
                 audio: Path, speedup: float | None) -> dict[str, Any]:
    """The side-by-side entry of one configuration: ``speedup`` (the base's median request
    time over this one's), ``identical`` (the same samples), ``waveform_snr_db`` and
    ``mel_snr_db`` (``None`` when identical, as JSON has no infinity, or when the sample rates
    differ) and ``stop``, from the audio each configuration's child saved (``.npy``)."""
    reference, other = np.load(base_audio), np.load(audio)
    rate = int(run["sample_rate"])
    identical = reference.shape == other.shape and bool(np.array_equal(reference, other))
    comparable = rate == int(base_run["sample_rate"]) and not identical

    def finite(value: float | None) -> float | None:
        return value if comparable and value is not None and math.isfinite(value) else None

    return {"speedup": speedup, "identical": identical,
            "waveform_snr_db": finite(snr_db(reference, other)),
            "mel_snr_db": finite(mel_snr_db(reference, other, rate)) if comparable else None,
            "stop": stop_moved(base_run, run)}


def format_db(value: float | None, identical: bool) -> str:
    """An SNR for the table: ``exact`` for identical audio."""
    if identical:
        return "exact"
    return "-" if value is None else f"{value:.1f}"


def format_stop(stop: Mapping[str, Any]) -> str:
    """``same (20 patches)`` or ``moved (20 -> 17 patches)``."""
    if not stop["moved"]:
        return f"same ({stop['this']} {stop['unit']})" if stop["unit"] == "patches" else "same"
    return f"moved ({stop['base']} -> {stop['this']} {stop['unit']})"
