"""Random-weight F5-TTS model directories in upstream's file layout (test fixtures).

`write_random_model_dir(path, variant, *, size="tiny", seed=0, vocab=None,
checkpoint_format="safetensors") -> Path` writes into ``path`` (created if needed):

- ``model_<step>.safetensors`` (or ``.pt``) named as upstream releases the variant, holding an
  EMA checkpoint as upstream's trainer writes it: ``initted``, ``step`` and every ``CFM`` key
  under ``ema_model.`` (``.pt``: ``{"ema_model_state_dict": ..., "model_state_dict": ...}``);
- ``variant.json``: the variant's family, for that checkpoint
  (`mizuoto_f5tts.identification`);
- ``vocab.txt``: ``vocab`` (tokens, one per line) or upstream's 2545-token vocab;
- ``vocos/config.yaml`` + ``vocos/pytorch_model.bin``: a Vocos of the real architecture
  (13.5 M parameters) for ``size="real"``, a small one (dim 64, 2 layers) for ``"tiny"``.

``variant`` is a name in `VARIANT_NAMES` or an `F5Variant` (then ``size`` is ignored). Every
tensor is drawn from its own generator seeded by ``(seed, key)``, so values do not depend on
module construction order: ``std * randn`` (std 0.02), norm gains ``1 + std * randn``.
Every parameter is overwritten, including the ones DiT zero-initialises (adaLN, output
projection), so outputs are finite noise, not speech. Buffers keep their computed values
(rotary ``inv_freq``, Vocos windows and mel filterbank).

Also: `write_random_vocos_dir(path, *, size="tiny", seed=0)` (the ``vocos/`` part alone),
`vocos_config(size)` (its ``config.yaml`` mapping) and `random_state_dict(model, seed, std,
buffers)` (the drawing rule, for any module).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
import yaml
from torch import nn

from mizuoto.nn.flow import ConditionalFlowMatching
from mizuoto.nn.transformer.norms import NativeRMSNorm, RMSNorm
from mizuoto.nn.transformer.rotary import RotaryEmbedding
from mizuoto.nn.vocoders import Vocos
from mizuoto.runtime.atomic import save_safetensors
from mizuoto.runtime.seeds import keyed_generator
from mizuoto_f5tts.checkpoint import VOCAB_FILE, VOCOS_DIR, default_vocab_path, read_vocab
from mizuoto_f5tts.identification import write_record
from mizuoto_f5tts.variants import F5Variant, checkpoint_name, get_variant

STD = 0.02

_VOCOS_REAL = {"dim": 512, "intermediate_dim": 1536, "num_layers": 8}
_VOCOS_TINY = {"dim": 64, "intermediate_dim": 128, "num_layers": 2}


def vocos_config(size: str = "real") -> dict:
    """The ``config.yaml`` mapping of charactr/vocos-mel-24khz, or its tiny test version."""
    arch = _VOCOS_REAL if size == "real" else _VOCOS_TINY
    return {
        "feature_extractor": {
            "class_path": "vocos.feature_extractors.MelSpectrogramFeatures",
            "init_args": {
                "sample_rate": 24000,
                "n_fft": 1024,
                "hop_length": 256,
                "n_mels": 100,
                "padding": "center",
            },
        },
        "backbone": {
            "class_path": "vocos.models.VocosBackbone",
            "init_args": {"input_channels": 100, **arch},
        },
        "head": {
            "class_path": "vocos.heads.ISTFTHead",
            "init_args": {"dim": arch["dim"], "n_fft": 1024, "hop_length": 256, "padding": "same"},
        },
    }


def _gain_keys(model: nn.Module) -> set[str]:
    """Parameters that scale a normalised signal: drawn around 1 instead of 0."""
    keys = set()
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, nn.LayerNorm) and module.weight is not None:
            keys.add(prefix + "weight")
        elif isinstance(module, RMSNorm):
            keys.add(prefix + "g")
        elif isinstance(module, NativeRMSNorm):
            keys.add(prefix + "weight")
    return keys


def random_state_dict(
    model: nn.Module,
    seed: int = 0,
    std: float = STD,
    buffers: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """``model``'s persistent state, float32, every parameter drawn from its own generator.

    Buffers keep their values, or take the one in ``buffers`` (needed for a "meta" model).
    """
    gains = _gain_keys(model)
    params = {name for name, _ in model.named_parameters()}
    buffers = buffers or {}
    state = {}
    for key, value in model.state_dict().items():
        if key in params:
            noise = torch.randn(value.shape, generator=keyed_generator(seed, key),
                                dtype=torch.float32)
            value = (1.0 + std * noise) if key in gains else std * noise
        elif key in buffers:
            value = buffers[key]
        elif value.is_meta:
            raise RuntimeError(f"no value for the buffer {key} of a meta-device model")
        state[key] = value.detach().to(torch.float32).contiguous().clone()
    return state


def _write_vocab(path: Path, vocab: Iterable[str] | None) -> None:
    if vocab is None:
        shutil.copyfile(default_vocab_path(), path)
        return
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for token in vocab:
            f.write(f"{token}\n")


def write_random_model_dir(
    path: str | Path,
    variant: str | F5Variant,
    *,
    size: str = "tiny",
    seed: int = 0,
    vocab: Iterable[str] | None = None,
    checkpoint_format: str = "safetensors",
) -> Path:
    if checkpoint_format not in ("safetensors", "pt"):
        raise ValueError(
            f"checkpoint_format must be 'safetensors' or 'pt', got {checkpoint_format!r}"
        )
    if isinstance(variant, str):
        variant = get_variant(variant, size)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)

    vocab_path = path / VOCAB_FILE
    _write_vocab(vocab_path, vocab)
    vocab_size = len(read_vocab(vocab_path))

    with torch.device("meta"):
        skeleton = ConditionalFlowMatching(variant.build_backbone(text_num_embeds=vocab_size))
    # buffers need real values; on "meta" they have none, so build those modules for real
    real_buffers = {"transformer.rotary_embed.inv_freq": RotaryEmbedding(variant.dim_head).inv_freq}
    cfm_state = random_state_dict(skeleton, seed=seed, buffers=real_buffers)
    ema = {"initted": torch.tensor(True), "step": torch.tensor(0)}
    ema.update({f"ema_model.{k}": v for k, v in cfm_state.items()})
    ckpt_path = path / checkpoint_name(variant.name, checkpoint_format)
    if checkpoint_format == "safetensors":
        save_safetensors(ema, ckpt_path)
    else:
        torch.save({"ema_model_state_dict": ema, "model_state_dict": cfm_state}, ckpt_path)

    write_record(path, ckpt_path.name, variant.name)
    write_random_vocos_dir(path / VOCOS_DIR, size="real" if variant.size == "real" else "tiny",
                           seed=seed)
    return path


def write_random_vocos_dir(path: str | Path, *, size: str = "tiny", seed: int = 0) -> Path:
    """``config.yaml`` + ``pytorch_model.bin`` of a random-weight Vocos (see `vocos_config`)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = vocos_config(size)
    with open(path / "config.yaml", "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    model = Vocos.from_config(config)
    torch.save(random_state_dict(model, seed=seed), path / "pytorch_model.bin")
    return path
