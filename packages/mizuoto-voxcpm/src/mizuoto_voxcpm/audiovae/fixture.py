"""Random-init AudioVAE checkpoints in upstream's file layout, and the configs to build them.

For tests and parity runs: no released weights are needed. Each tensor is drawn from its own
generator seeded by ``(seed, key)``, so the values do not depend on module order and the same
directory loads into upstream's VAE and ours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

from mizuoto.runtime.seeds import keyed_generator
from mizuoto_voxcpm.audiovae.config import AudioVAEConfig, AudioVAEV2Config
from mizuoto_voxcpm.audiovae.loading import (
    PTH_FILE,
    SAFETENSORS_FILE,
    build_audio_vae,
    checkpoint_layout,
)

__all__ = [
    "TINY_V1_16K",
    "TINY_V1_44K",
    "TINY_V2",
    "VOXCPM1_5",
    "VOXCPM2",
    "VOXCPM_0_5B",
    "random_audiovae_state_dict",
    "write_random_audiovae",
]

# Tiny configs keep the real strides (odd ones included) and shrink only the channels.
TINY_V1_16K = AudioVAEConfig(encoder_dim=4, latent_dim=8, decoder_dim=32)
TINY_V1_44K = AudioVAEConfig(
    encoder_dim=4,
    encoder_rates=(2, 3, 6, 7, 7),
    latent_dim=8,
    decoder_dim=64,
    decoder_rates=(7, 7, 6, 3, 2),
    sample_rate=44100,
)
TINY_V2 = AudioVAEV2Config(encoder_dim=4, latent_dim=8, decoder_dim=128)

# Real sizes. VoxCPM-0.5B and VoxCPM2 are upstream's defaults for their generation. VoxCPM1.5's
# strides (hop 1764, 25 Hz latents at 44.1 kHz) and latent_dim are documented; its encoder_dim
# and decoder_dim are guesses (upstream's first-generation default width and VoxCPM2's).
VOXCPM_0_5B = AudioVAEConfig()
VOXCPM1_5 = AudioVAEConfig(
    encoder_dim=128,
    encoder_rates=(2, 3, 6, 7, 7),
    latent_dim=64,
    decoder_dim=2048,
    decoder_rates=(7, 7, 6, 3, 2),
    sample_rate=44100,
)
VOXCPM2 = AudioVAEV2Config()


def random_audiovae_state_dict(
    config: AudioVAEConfig | AudioVAEV2Config, *, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A float32 state dict with upstream's keys for ``config``, scaled so audio stays finite.

    Weight-norm magnitudes are 0.5–0.8 and directions standard normal, Snake alphas 0.5–1.5,
    biases about 0.02, sample-rate scales about 1 ± 0.1.
    """
    with torch.device("meta"):
        vae = build_audio_vae(config)
    state: dict[str, torch.Tensor] = {}
    for key, shape in checkpoint_layout(vae).items():
        if key == "decoder.sr_bin_boundaries":
            state[key] = torch.tensor(config.sr_bin_boundaries, dtype=torch.int32)
            continue
        generator = keyed_generator(seed, key)
        state[key] = _draw(key, shape, generator)
    return state


def write_random_audiovae(
    directory: str | Path,
    config: AudioVAEConfig | AudioVAEV2Config,
    *,
    seed: int = 0,
    fmt: Literal["pth", "safetensors"] = "pth",
) -> Path:
    """Write ``audiovae.pth`` (a plain state dict) or ``audiovae.safetensors`` into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = random_audiovae_state_dict(config, seed=seed)
    if fmt == "pth":
        path = directory / PTH_FILE
        torch.save(state, path)
    elif fmt == "safetensors":
        from mizuoto.runtime.atomic import save_safetensors

        path = directory / SAFETENSORS_FILE
        save_safetensors({key: tensor.contiguous() for key, tensor in state.items()}, path)
    else:
        raise ValueError(f"fmt: {fmt!r} is not 'pth' or 'safetensors'")
    return path


def _draw(key: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    leaf = key.rpartition(".")[2]
    if leaf == "alpha":
        return 0.5 + torch.rand(shape, generator=generator)
    if leaf == "weight_g":
        return 0.5 + 0.3 * torch.rand(shape, generator=generator)
    normal = torch.randn(shape, generator=generator)
    if leaf == "weight_v":
        return normal
    if key.endswith("scale_embed.weight"):
        return 1.0 + 0.1 * normal
    if leaf == "weight":  # bias_embed / cond_embed
        return 0.1 * normal
    return 0.02 * normal  # biases
