"""Loading ``audiovae.safetensors`` / ``audiovae.pth`` into an AudioVAE.

Upstream wraps every convolution in ``torch.nn.utils.weight_norm`` (the old hook API), so the
file holds ``<conv>.weight_g`` and ``<conv>.weight_v`` and each forward recomputes
``torch._weight_norm(v, g, 0)``. We fold that once (``mizuoto.runtime.weight_norm``), on the
VAE's device and in float32, which gives the same weight bits as upstream's per-call
recomputation on that device.

Unlike upstream (``load_state_dict(strict=False)``), a missing or misshapen key raises
``CheckpointMismatch`` naming it (upstream would keep random weights); unexpected keys are
ignored as upstream ignores them, with a warning naming them. The one optional key is the decoder's
``sr_bin_boundaries`` buffer, which upstream builds from the config and a checkpoint may carry;
when present, the file's value wins, as upstream's load does.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from mizuoto.runtime.checkpoint import check_state_dict, find_weights_file, load_state_dict_file
from mizuoto.runtime.weight_norm import fold_weight_norm
from mizuoto_voxcpm.audiovae.causal import CausalConv1d, CausalConvTranspose1d
from mizuoto_voxcpm.audiovae.config import AudioVAEConfig, AudioVAEV2Config
from mizuoto_voxcpm.audiovae.v1 import AudioVAE
from mizuoto_voxcpm.audiovae.v2 import AudioVAEV2

logger = logging.getLogger(__name__)

__all__ = ["SAFETENSORS_FILE", "PTH_FILE", "checkpoint_layout", "load_audio_vae"]

SAFETENSORS_FILE = "audiovae.safetensors"
PTH_FILE = "audiovae.pth"
_OPTIONAL_KEYS = ("decoder.sr_bin_boundaries",)


def build_audio_vae(config: AudioVAEConfig | AudioVAEV2Config) -> AudioVAE | AudioVAEV2:
    """The VAE module of ``config``'s generation, with uninitialised weights."""
    if isinstance(config, AudioVAEV2Config):
        return AudioVAEV2(config)
    return AudioVAE(config)


def checkpoint_layout(vae: AudioVAE | AudioVAEV2) -> dict[str, tuple[int, ...]]:
    """Every key of upstream's checkpoint for ``vae``'s config, with its shape, in module order.

    Weight-normed convolutions contribute ``weight_g`` (``(out, 1, 1)``; ``(in, 1, 1)`` for a
    transposed conv, whose weight starts with the input channels) and ``weight_v``.
    """
    normed = {
        name
        for name, module in vae.named_modules()
        if isinstance(module, (CausalConv1d, CausalConvTranspose1d))
    }
    layout: dict[str, tuple[int, ...]] = {}
    for key, tensor in vae.state_dict(keep_vars=True).items():
        module_name, _, leaf = key.rpartition(".")
        if leaf == "weight" and module_name in normed:
            layout[f"{module_name}.weight_g"] = (tensor.shape[0],) + (1,) * (tensor.ndim - 1)
            layout[f"{module_name}.weight_v"] = tuple(tensor.shape)
        else:
            layout[key] = tuple(tensor.shape)
    return layout


def read_audio_vae_checkpoint(model_dir: str | Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """The VAE state dict of ``model_dir`` on the CPU, and the file it came from.

    ``audiovae.safetensors`` is preferred and ``audiovae.pth`` is the fallback, as upstream's
    ``from_local`` does; a ``.pth`` may wrap its tensors in a ``state_dict`` entry.
    """
    path = find_weights_file(model_dir, (SAFETENSORS_FILE, PTH_FILE),
                             "The AudioVAE weights ship next to config.json in every VoxCPM "
                             "release")
    return path, load_state_dict_file(path, key=("state_dict", ""))


def load_audio_vae(
    model_dir: str | Path,
    config: AudioVAEConfig | AudioVAEV2Config,
    device: str | torch.device = "cpu",
) -> AudioVAE | AudioVAEV2:
    """The AudioVAE of ``model_dir`` in float32 on ``device``, in eval mode, weight norm folded.

    Raises ``ModelFilesMissing`` without a checkpoint and ``CheckpointMismatch`` when its keys
    or shapes differ from what ``config`` builds.
    """
    device = torch.device(device)
    path, checkpoint = read_audio_vae_checkpoint(model_dir)
    with torch.device("meta"):
        vae = build_audio_vae(config)
    layout = checkpoint_layout(vae)

    # upstream loads with strict=False: extra tensors are ignored (with a warning here)
    extra = check_state_dict(layout, checkpoint, path, optional=_OPTIONAL_KEYS,
                             tolerate_unexpected=True,
                             detail=f"the VAE configuration was {config}")
    checkpoint = {key: tensor for key, tensor in checkpoint.items() if key not in set(extra)}

    # load_state_dict would copy into float32 parameters and upstream's int32 buffer
    tensors = {
        key: tensor.to(torch.int32 if key in _OPTIONAL_KEYS else torch.float32)
        for key, tensor in checkpoint.items()
    }
    state = {
        key: tensor.to(device)
        for key, tensor in fold_weight_norm(tensors, device=device, dim=0).items()
    }
    for key in _OPTIONAL_KEYS:
        if key not in state and key in layout:  # upstream keeps the config's value
            state[key] = _config_buffer(config, key, device)
    vae.load_state_dict(state, strict=True, assign=True)
    # parameters keep requires_grad as upstream leaves them (kernel choice can depend on it);
    # every VAE call runs under inference_mode
    logger.debug("loaded AudioVAE v%d from %s on %s", config.generation, path, device)
    return vae.eval()


def _config_buffer(
    config: AudioVAEConfig | AudioVAEV2Config, key: str, device: torch.device
) -> torch.Tensor:
    assert key == "decoder.sr_bin_boundaries", key
    return torch.tensor(config.sr_bin_boundaries, dtype=torch.int32, device=device)
