"""Vocos neural vocoder (vocos 0.1.0, mel variant): mel ``(b, 100, t)`` -> 24 kHz audio.

- `Vocos(feature_extractor, backbone, head)`; `Vocos.decode(mel)` -> ``(b, t * hop)``
  audio; `Vocos.forward(audio)` re-synthesises audio through the mel features.
- `Vocos.from_config(config)`: ``config`` is the parsed ``config.yaml`` of a Vocos release
  (``feature_extractor`` / ``backbone`` / ``head`` entries with ``class_path`` and
  ``init_args``); supported: ``MelSpectrogramFeatures``, ``VocosBackbone``, ``ISTFTHead``.
- `load_vocos(directory, device="cpu")`: ``config.yaml`` + ``pytorch_model.bin`` loaded
  strictly, in float32, in eval mode (as f5-tts ``load_vocoder("vocos", is_local=True)``).
- errors: `ModelFilesMissing` (no config/weights), `CheckpointMismatch` (keys, shapes, or an
  unsupported class in the config).

Parameter and buffer names equal vocos's, including the torchaudio-style buffers of the feature
extractor (``feature_extractor.mel_spec.spectrogram.window``, ``...mel_scale.fb``), which the
released checkpoint carries.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.errors import CheckpointMismatch, ModelFilesMissing
from mizuoto.nn.dsp.mel import melscale_fbanks, spectrogram
from mizuoto.nn.vocoders.istft import ISTFTHead
from mizuoto.nn.vocoders.vocos_backbone import VocosBackbone
from mizuoto.runtime.checkpoint import load_into, load_state_dict_file
from mizuoto.settings_files import SettingsFileError, parse_settings

CONFIG_FILE = "config.yaml"
WEIGHTS_FILE = "pytorch_model.bin"


class _Buffers(nn.Module):
    """A holder for buffers, so their state-dict keys follow torchaudio's module nesting."""

    def __init__(self, **buffers: torch.Tensor) -> None:
        super().__init__()
        for name, value in buffers.items():
            self.register_buffer(name, value)


class MelSpectrogramFeatures(nn.Module):
    """Log-mel features of ``(b, samples)`` audio: ``(b, n_mels, frames)``, log clipped at 1e-7."""

    def __init__(
        self,
        sample_rate: int = 24000,
        n_fft: int = 1024,
        hop_length: int = 256,
        n_mels: int = 100,
        padding: str = "center",
    ) -> None:
        super().__init__()
        if padding not in ("center", "same"):
            raise ValueError(f"padding must be 'center' or 'same', got {padding!r}")
        self.padding = padding
        self.n_fft = n_fft
        self.hop_length = hop_length
        fb = melscale_fbanks(n_fft // 2 + 1, 0.0, float(sample_rate // 2), n_mels, sample_rate)
        self.mel_spec = nn.Module()
        self.mel_spec.spectrogram = _Buffers(window=torch.hann_window(n_fft))
        self.mel_spec.mel_scale = _Buffers(fb=fb)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        if self.padding == "same":
            pad = self.n_fft - self.hop_length
            audio = F.pad(audio, (pad // 2, pad // 2), mode="reflect")
        spec = spectrogram(
            audio,
            self.mel_spec.spectrogram.window,
            n_fft=self.n_fft,
            hop_length=self.hop_length,
            win_length=self.n_fft,
            power=1.0,
            center=self.padding == "center",
        )
        mel = torch.matmul(spec.transpose(-1, -2), self.mel_spec.mel_scale.fb).transpose(-1, -2)
        return torch.log(torch.clip(mel, min=1e-7))


_CLASSES: dict[str, tuple[str, type[nn.Module]]] = {
    "vocos.feature_extractors.MelSpectrogramFeatures": (
        "feature_extractor",
        MelSpectrogramFeatures,
    ),
    "vocos.models.VocosBackbone": ("backbone", VocosBackbone),
    "vocos.heads.ISTFTHead": ("head", ISTFTHead),
}


class Vocos(nn.Module):
    def __init__(
        self, feature_extractor: MelSpectrogramFeatures, backbone: VocosBackbone, head: ISTFTHead
    ) -> None:
        super().__init__()
        self.feature_extractor = feature_extractor
        self.backbone = backbone
        self.head = head

    @classmethod
    def from_config(cls, config: Mapping[str, Any], source: str = "Vocos config") -> Vocos:
        parts = {}
        for role in ("feature_extractor", "backbone", "head"):
            entry = config.get(role)
            if not isinstance(entry, Mapping) or "class_path" not in entry:
                raise CheckpointMismatch(source, detail=f"no '{role}' entry with a class_path")
            known = _CLASSES.get(entry["class_path"])
            if known is None or known[0] != role:
                supported = [p for p, (r, _) in _CLASSES.items() if r == role]
                raise CheckpointMismatch(
                    source,
                    detail=f"{role} class {entry['class_path']!r} is not supported "
                    f"(supported: {', '.join(supported)})",
                )
            parts[role] = known[1](**dict(entry.get("init_args") or {}))
        return cls(**parts)

    @torch.inference_mode()
    def decode(self, mel: torch.Tensor) -> torch.Tensor:
        """Mel ``(b, n_mels, frames)`` -> audio ``(b, frames * hop)``."""
        return self.head(self.backbone(mel))

    @torch.inference_mode()
    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        return self.decode(self.feature_extractor(audio))


def load_vocos(directory: str | Path, device: str | torch.device = "cpu") -> Vocos:
    directory = Path(directory)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    missing = [p.name for p in (config_path, weights_path) if not p.is_file()]
    if missing:
        raise ModelFilesMissing(
            str(directory), missing, "a Vocos directory holds config.yaml and pytorch_model.bin"
        )
    try:  # a model folder from the internet: no alias bomb, nesting or huge integer
        config = parse_settings(config_path.read_text(encoding="utf-8"), "yaml",
                                str(config_path))
    except (SettingsFileError, UnicodeDecodeError) as exc:
        raise CheckpointMismatch(str(config_path), detail=f"cannot be read: {exc}") from None
    model = Vocos.from_config(config, source=str(config_path))
    load_into(model, load_state_dict_file(weights_path), weights_path)
    return model.eval().to(device)
