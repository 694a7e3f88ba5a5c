"""VoxCPM's AudioVAE, both generations: waveform ↔ 64-dim latents, always float32."""

from mizuoto_voxcpm.audiovae.config import (
    AudioVAEConfig,
    AudioVAEV2Config,
    audio_vae_config_from_model_config,
)
from mizuoto_voxcpm.audiovae.loading import load_audio_vae
from mizuoto_voxcpm.audiovae.streaming import StreamingDecoder
from mizuoto_voxcpm.audiovae.v1 import AudioVAE
from mizuoto_voxcpm.audiovae.v2 import AudioVAEV2

__all__ = [
    "AudioVAE",
    "AudioVAEConfig",
    "AudioVAEV2",
    "AudioVAEV2Config",
    "StreamingDecoder",
    "audio_vae_config_from_model_config",
    "load_audio_vae",
]
