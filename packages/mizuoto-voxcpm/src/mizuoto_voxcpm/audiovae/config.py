"""AudioVAE configurations, read from the ``audio_vae_config`` section of a model's config.json.

Two generations exist. The first (VoxCPM-0.5B at 16 kHz, VoxCPM1.5 at 44.1 kHz) decodes at the
rate it encodes. The second (VoxCPM2) encodes 16 kHz audio and decodes to 48 kHz through a
decoder conditioned on the output sample rate. Which one a model uses is decided, as upstream
does, by the top-level ``architecture`` key (``"voxcpm"`` by default, or ``"voxcpm2"``), not by
the VAE section itself.

Defaults are upstream's (voxcpm 2.0.3 ``AudioVAEConfig`` of each generation): a missing, empty
or null ``audio_vae_config`` means all defaults. Unknown keys are ignored, as pydantic does
upstream.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

logger = logging.getLogger(__name__)

__all__ = [
    "AudioVAEConfig",
    "AudioVAEV2Config",
    "audio_vae_config_from_model_config",
]

CONDITION_TYPES = ("scale_bias", "scale_bias_init", "add", "concat")


def _positive_int(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"audio_vae_config.{attribute.name}: expected a positive integer, got {value!r}"
        )


def _rates(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not value or any(isinstance(r, bool) or not isinstance(r, int) or r <= 0 for r in value):
        raise ValueError(
            f"audio_vae_config.{attribute.name}: expected a non-empty list of positive "
            f"integers, got {list(value)!r}"
        )


def _boolean(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"audio_vae_config.{attribute.name}: expected true or false, got {value!r}")


def _to_tuple(value: Any) -> tuple:
    return tuple(value)


def _to_optional_tuple(value: Any) -> tuple | None:
    return None if value is None else tuple(value)


@attrs.frozen
class AudioVAEConfig:
    """First-generation AudioVAE (voxcpm ``modules/audiovae/audio_vae.py``)."""

    generation: ClassVar[int] = 1

    encoder_dim: int = attrs.field(default=128, validator=_positive_int)
    encoder_rates: tuple[int, ...] = attrs.field(
        default=(2, 5, 8, 8), converter=_to_tuple, validator=_rates
    )
    latent_dim: int = attrs.field(default=64, validator=_positive_int)
    decoder_dim: int = attrs.field(default=1536, validator=_positive_int)
    decoder_rates: tuple[int, ...] = attrs.field(
        default=(8, 8, 5, 2), converter=_to_tuple, validator=_rates
    )
    depthwise: bool = attrs.field(default=True, validator=_boolean)
    sample_rate: int = attrs.field(default=16000, validator=_positive_int)
    use_noise_block: bool = attrs.field(default=False, validator=_boolean)

    @property
    def hop_length(self) -> int:
        """Input samples per latent frame (upstream ``hop_length`` / ``chunk_size``)."""
        return math.prod(self.encoder_rates)

    @property
    def decode_hop_length(self) -> int:
        """Output samples per latent frame."""
        return math.prod(self.decoder_rates)

    @property
    def out_sample_rate(self) -> int:
        """Sample rate of decoded audio: the first generation decodes at its input rate."""
        return self.sample_rate

    @classmethod
    def from_dict(cls, section: Mapping[str, Any] | None) -> AudioVAEConfig:
        return cls(**_known_fields(cls, section))


@attrs.frozen
class AudioVAEV2Config:
    """Second-generation AudioVAE (voxcpm ``modules/audiovae/audio_vae_v2.py``)."""

    generation: ClassVar[int] = 2

    encoder_dim: int = attrs.field(default=128, validator=_positive_int)
    encoder_rates: tuple[int, ...] = attrs.field(
        default=(2, 5, 8, 8), converter=_to_tuple, validator=_rates
    )
    latent_dim: int = attrs.field(default=64, validator=_positive_int)
    decoder_dim: int = attrs.field(default=2048, validator=_positive_int)
    decoder_rates: tuple[int, ...] = attrs.field(
        default=(8, 6, 5, 2, 2, 2), converter=_to_tuple, validator=_rates
    )
    depthwise: bool = attrs.field(default=True, validator=_boolean)
    sample_rate: int = attrs.field(default=16000, validator=_positive_int)
    out_sample_rate: int = attrs.field(default=48000, validator=_positive_int)
    use_noise_block: bool = attrs.field(default=False, validator=_boolean)
    # None builds an unconditioned decoder, as upstream allows.
    sr_bin_boundaries: tuple[int, ...] | None = attrs.field(
        default=(20000, 30000, 40000), converter=_to_optional_tuple
    )
    cond_type: str = attrs.field(default="scale_bias")
    cond_dim: int = attrs.field(default=128, validator=_positive_int)
    cond_out_layer: bool = attrs.field(default=False, validator=_boolean)

    @cond_type.validator
    def _check_cond_type(self, attribute: attrs.Attribute, value: str) -> None:
        if value not in CONDITION_TYPES:
            raise ValueError(
                f"audio_vae_config.cond_type: {value!r} is not one of {', '.join(CONDITION_TYPES)}"
            )
        if value == "concat" and not self.cond_out_layer:
            raise ValueError(
                "audio_vae_config.cond_type: 'concat' needs cond_out_layer: true (upstream asserts it)"
            )

    @property
    def hop_length(self) -> int:
        """Input samples per latent frame, at ``sample_rate``."""
        return math.prod(self.encoder_rates)

    @property
    def decode_hop_length(self) -> int:
        """Output samples per latent frame, at ``out_sample_rate`` (upstream ``decode_chunk_size``)."""
        return math.prod(self.decoder_rates)

    @classmethod
    def from_dict(cls, section: Mapping[str, Any] | None) -> AudioVAEV2Config:
        return cls(**_known_fields(cls, section))


def audio_vae_config_from_model_config(
    model_config: Mapping[str, Any],
) -> AudioVAEConfig | AudioVAEV2Config:
    """The VAE configuration of a model, from its whole config.json as a mapping.

    ``architecture`` picks the generation exactly as upstream's ``VoxCPM`` does (lower-cased,
    ``"voxcpm"`` when absent).
    """
    architecture = str(model_config.get("architecture", "voxcpm")).lower()
    section = model_config.get("audio_vae_config")
    if architecture == "voxcpm2":
        return AudioVAEV2Config.from_dict(section)
    if architecture == "voxcpm":
        return AudioVAEConfig.from_dict(section)
    raise ValueError(
        f"architecture: {architecture!r} is not a VoxCPM architecture (expected 'voxcpm' or "
        "'voxcpm2')"
    )


def _known_fields(cls: type, section: Mapping[str, Any] | None) -> dict[str, Any]:
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ValueError(f"audio_vae_config: expected an object, got {type(section).__name__}")
    names = {field.name for field in attrs.fields(cls)}
    ignored = sorted(set(section) - names)
    if ignored:
        # Upstream's pydantic model ignores extra keys too; some exported configs carry
        # derived values such as chunk_size.
        logger.debug("audio_vae_config: ignoring unknown keys %s", ", ".join(ignored))
    return {key: value for key, value in section.items() if key in names}
