"""Prompt audio to latent patches, read the way each generation's upstream reads it.

VoxCPM2 reads files with ``librosa.load(path, sr=16000)`` (soxr HQ resampling, channel mean);
the first generation with ``torchaudio.load`` and the sinc resampler of
``torchaudio.functional.resample``. Both pad to whole patches (a continuation prompt on the left,
so its end stays aligned with the generated audio; a VoxCPM2 reference on the right) and
encode with the float32 VAE.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mizuoto.contracts.audio import Audio
from mizuoto.nn.dsp.audio_io import check_not_silent, read_audio, to_mono
from mizuoto.nn.dsp.resample import resample
from mizuoto.nn.dsp.soxr_resample import load_like_librosa, resample_soxr


def read_prompt_audio(source: Audio | Path, sample_rate: int, *, v2: bool,
                      field: str = "reference.audio") -> torch.Tensor:
    """Mono float32 ``(1, samples)`` at ``sample_rate`` (the VAE's input rate).

    Silent or empty recordings raise ``InvalidAudio`` (upstream would encode them).
    """
    audio = _read(source, sample_rate, v2=v2, field=field)
    check_not_silent(audio, field)
    return audio


def _read(source: Audio | Path, sample_rate: int, *, v2: bool, field: str) -> torch.Tensor:
    if v2:
        if isinstance(source, Audio):
            samples = source.samples.numpy()
            if source.sample_rate != sample_rate:
                samples = resample_soxr(samples, source.sample_rate, sample_rate, "HQ")
        else:
            samples, _ = load_like_librosa(source, sample_rate, field=field)
        return torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32)).unsqueeze(0)
    if isinstance(source, Audio):
        audio, rate = source.samples.unsqueeze(0), source.sample_rate
    else:
        audio, rate = read_audio(source, field=field)
        audio = to_mono(audio)
    if rate != sample_rate:
        audio = resample(audio, rate, sample_rate)
    return audio


@torch.inference_mode()
def encode_prompt(vae, audio: torch.Tensor, *, patch_size: int, pad_left: bool) -> torch.Tensor:
    """``(1, samples)`` -> ``(patches, patch_size, latent_dim)`` float32 latents on the CPU."""
    patch_samples = patch_size * vae.hop_length
    remainder = audio.size(1) % patch_samples
    if remainder:
        padding = patch_samples - remainder
        audio = torch.nn.functional.pad(audio, (padding, 0) if pad_left else (0, padding))
    device = next(vae.parameters()).device
    latents = vae.encode(audio.to(device), vae.sample_rate).cpu()
    return latents.view(vae.latent_dim, -1, patch_size).permute(1, 2, 0)
