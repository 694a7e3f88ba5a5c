"""The VoxCPM model: text-semantic LM, residual acoustic LM, local encoder, local DiT, stop head.

One class for both generations; the differences are in two places: how the residual LM's input
is fused (VoxCPM2 concatenates and projects, the first generation adds) and how the DiT takes the
LM condition (VoxCPM2 as two tokens, the first generation summed into the time token).
Attribute names match upstream's state dict (``base_lm.layers.0.self_attn.q_proj.weight``, ...).
The audio VAE is loaded separately (``audiovae.*``) and is not part of this module.
"""

from __future__ import annotations

import logging
from pathlib import Path

import attrs
import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.runtime.checkpoint import (
    check_weights_file,
    find_weights_file,
    load_weights_into,
    materialize_empty,
)
from mizuoto_voxcpm.cache_pool import CacheSlot
from mizuoto_voxcpm.config import VoxCPMConfig
from mizuoto_voxcpm.flow import sample_patch
from mizuoto_voxcpm.local_dit import LocalDiT
from mizuoto_voxcpm.local_encoder import LocalEncoder
from mizuoto_voxcpm.longrope import LongRoPE
from mizuoto_voxcpm.minicpm4 import MiniCPM4

log = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class ScalarQuantization(nn.Module):
    """FSQ bottleneck on the LM's audio positions: tanh, round to ``scale`` levels, project."""

    def __init__(self, dim: int, latent_dim: int, scale: int) -> None:
        super().__init__()
        self.scale = scale
        self.in_proj = nn.Linear(dim, latent_dim)
        self.out_proj = nn.Linear(latent_dim, dim)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.in_proj(hidden))
        return self.out_proj(torch.round(hidden * self.scale) / self.scale)


@attrs.frozen
class Prefilled:
    """A prompt's prefill: both LMs' last hidden states ``(1, hidden)`` and their keys and
    values per layer."""

    lm_hidden: torch.Tensor
    residual_hidden: torch.Tensor
    lm_pairs: list[tuple[torch.Tensor, torch.Tensor]]
    residual_pairs: list[tuple[torch.Tensor, torch.Tensor]]

    def fill(self, slot: CacheSlot) -> None:
        """Write the keys and values into ``slot`` (raises ``CacheFull`` when too long)."""
        slot.lm.fill(self.lm_pairs)
        slot.residual.fill(self.residual_pairs)


class FlowDecoder(nn.Module):
    """Holds the DiT as ``estimator`` (upstream's ``feat_decoder.estimator.*`` names)."""

    def __init__(self, estimator: LocalDiT, mean_mode: bool) -> None:
        super().__init__()
        self.estimator = estimator
        self.mean_mode = mean_mode

    def forward(self, mu, cond, noise, *, steps: int, guidance: float,
                rowwise: bool = False) -> torch.Tensor:
        return sample_patch(self.estimator, mu, cond, noise, steps=steps, guidance=guidance,
                            mean_mode=self.mean_mode, rowwise=rowwise)


class VoxCPMModel(nn.Module):
    def __init__(self, config: VoxCPMConfig) -> None:
        super().__init__()
        self.config = config
        lm = config.lm
        hidden = lm.hidden_size
        self.patch_size = config.patch_size
        self.feat_dim = config.feat_dim
        self.base_lm = MiniCPM4(lm)
        self.residual_lm = MiniCPM4(config.residual_lm())
        self.feat_encoder = LocalEncoder(config.local(config.encoder), config.feat_dim)
        self.feat_decoder = FlowDecoder(
            LocalDiT(config.local(config.dit), config.feat_dim, separate_condition=config.is_v2),
            config.dit_mean_mode)
        self.fsq_layer = ScalarQuantization(hidden, config.scalar_quantization_latent_dim,
                                            config.scalar_quantization_scale)
        self.enc_to_lm_proj = nn.Linear(config.encoder.hidden_dim, hidden)
        self.lm_to_dit_proj = nn.Linear(hidden, config.dit.hidden_dim)
        self.res_to_dit_proj = nn.Linear(hidden, config.dit.hidden_dim)
        if config.is_v2:
            self.fusion_concat_proj = nn.Linear(hidden * 2, hidden)
        self.stop_proj = nn.Linear(hidden, hidden)
        self.stop_head = nn.Linear(hidden, 2, bias=False)
        self.scale_emb = lm.scale_emb if lm.use_mup else 1.0
        #: the model's own cache slot (the first of an engine's pool; CUDA graphs replay
        #: over it); a request may run in any other slot of the same shapes
        self.caches: CacheSlot | None = None
        #: CUDA graphs of one patch (``compute.cuda_graphs``), set by the engine
        self.patch_graphs = None

    @property
    def dtype(self) -> torch.dtype:
        return self.stop_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.stop_head.weight.device

    @property
    def dit_rows(self) -> int:
        """The rows the local DiT's layers see in one stream's guided evaluation: the
        conditional and unconditional sequences of the condition token(s) (VoxCPM2: the LM's
        and the residual LM's, then the time), the previous patch and the patch."""
        condition = 3 if self.config.is_v2 else 1
        return 2 * (condition + 2 * self.patch_size)

    @property
    def encoder_rows(self) -> int:
        """The rows the local encoder's layers see for one new patch: its CLS token and the
        patch's frames."""
        return 1 + self.patch_size

    def allocate_caches(self, attention: str = "exact") -> None:
        """The model's own slot of static caches (``max_length`` positions).

        ``attention``: ``exact`` (upstream's bits) or ``fast`` (the filled part of the cache
        only; see :data:`~mizuoto_voxcpm.kv_cache.ATTENTION_MODES`).
        """
        self.caches = CacheSlot.allocate(self, attention)
        self.patch_graphs = None  # graphs capture the caches' memory: they go with them

    def _apply(self, fn, recurse=True):
        # moving or casting the model leaves the caches (and any CUDA graph over them) behind
        moved = super()._apply(fn, recurse)
        if self.caches is not None:
            self.allocate_caches(self.caches.lm.attention)
        return moved

    def component_groups(self) -> dict[str, list[nn.Module]]:
        """The modules of each component of a patch, as ``applied.compute["prepack"]`` and
        ``mizuoto bench --profile`` name them."""
        groups = {"base_lm": [self.base_lm], "residual_lm": [self.residual_lm],
                  "encoder": [self.feat_encoder, self.enc_to_lm_proj],
                  "dit": [self.feat_decoder.estimator, self.lm_to_dit_proj, self.res_to_dit_proj],
                  "stop_head": [self.stop_proj, self.stop_head],
                  "projections": [self.fsq_layer]}
        if self.config.is_v2:
            groups["projections"].append(self.fusion_concat_proj)
        return groups

    # -- the pieces of one generation ------------------------------------------------------

    def encode_patches(self, patches: torch.Tensor) -> torch.Tensor:
        """``(b, t, patch, feat)`` latents -> ``(b, t, hidden)`` LM inputs."""
        return self.enc_to_lm_proj(self.feat_encoder(patches))

    def encode_patch_rows(self, patches: torch.Tensor) -> torch.Tensor:
        """One new patch per sequence, ``(b, patch, feat)`` -> ``(b, hidden)``, with the kernels
        :meth:`encode_patches` runs for a single one: there the encoder's CLS outputs, a
        strided view, are contiguous only because ``b`` is 1, and a strided input takes
        another matrix-product path (other bits) in the projection; here they are copied to
        contiguous rows first. ``patches`` should be strided as the sampler's output is (a
        transposed view), for the same reason."""
        hidden = self.feat_encoder(patches.unsqueeze(1)).contiguous()
        return self.enc_to_lm_proj(hidden)[:, 0]

    def encode_prompt_patches(self, feats: torch.Tensor, feat_mask: torch.Tensor) -> torch.Tensor:
        """:meth:`encode_patches` of a prompt's positions, ``(b, n, patch, feat)`` ->
        ``(b, n, hidden)``, where the prefill keeps only the audio positions (``feat_mask``).

        A prompt without audio (zero-shot, voice design) skips the encoder: upstream encodes
        every text position's zero patch only to multiply it by the mask's 0, so zeros in its
        place give the same embeddings (a zero's sign aside, which no sum or product after it
        sees) -- about 100 ms of a real-size 0.5B prefill's first audio."""
        if not bool(feat_mask.any()):
            return torch.zeros(*feats.shape[:2], self.enc_to_lm_proj.out_features,
                               dtype=self.dtype, device=feats.device)
        return self.encode_patches(feats)

    def _residual_input(self, lm_hidden: torch.Tensor, audio_embed: torch.Tensor) -> torch.Tensor:
        if self.config.is_v2:
            return self.fusion_concat_proj(torch.cat((lm_hidden, audio_embed), dim=-1))
        return lm_hidden + audio_embed

    def prefill(self, tokens: torch.Tensor, text_mask: torch.Tensor, feats: torch.Tensor,
                feat_mask: torch.Tensor, slot: CacheSlot) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the prompt through both LMs, fill ``slot``; return the last hidden states.

        ``tokens``/``text_mask``/``feat_mask``: ``(1, n)``; ``feats``: ``(1, n, patch, feat)``.
        """
        prefilled = self.prefill_states(tokens, text_mask, feats, feat_mask)
        prefilled.fill(slot)
        return prefilled.lm_hidden, prefilled.residual_hidden

    def prefill_states(self, tokens: torch.Tensor, text_mask: torch.Tensor, feats: torch.Tensor,
                       feat_mask: torch.Tensor) -> Prefilled:
        """:meth:`prefill` without a slot: the last hidden states and both LMs' keys and
        values, which fill any number of slots (a prompt's prefill does not depend on the
        slot it is written to)."""
        feat_embed = self.encode_prompt_patches(feats, feat_mask)
        text_embed = self.base_lm.embed_tokens(tokens) * self.scale_emb
        embeds = text_mask.unsqueeze(-1) * text_embed + feat_mask.unsqueeze(-1) * feat_embed
        outputs, lm_pairs = self.base_lm(embeds, causal=True)
        outputs = (self.fsq_layer(outputs) * feat_mask.unsqueeze(-1)
                   + outputs * text_mask.unsqueeze(-1))
        residual_in = self._residual_input(outputs, feat_mask.unsqueeze(-1) * feat_embed)
        residual, residual_pairs = self.residual_lm(residual_in, causal=True)
        return Prefilled(outputs[:, -1, :], residual[:, -1, :], lm_pairs, residual_pairs)

    def prefill_packed(self, sequences: list) -> list[Prefilled]:
        """:meth:`prefill_states` of several prompts (each a ``PromptSequence``) in one pass:
        their positions packed one after another, every matrix product run once for all, each
        prompt attending within itself. Per prompt the same arithmetic as alone, but matrix
        products over more rows may sum in another order (other bits)."""
        lengths = tuple(int(sequence.tokens.size(1)) for sequence in sequences)
        device, dtype = self.device, self.dtype

        def packed(name: str) -> torch.Tensor:
            return torch.cat([getattr(sequence, name) for sequence in sequences], dim=1)

        tokens, text_mask = packed("tokens").to(device), packed("text_mask").to(device)
        feat_mask = packed("feat_mask").to(device)
        feats = packed("feats").to(device).to(dtype)
        # the local encoder encodes each position's patch on its own: packing changes nothing
        feat_embed = self.encode_prompt_patches(feats, feat_mask)
        text_embed = self.base_lm.embed_tokens(tokens) * self.scale_emb
        embeds = text_mask.unsqueeze(-1) * text_embed + feat_mask.unsqueeze(-1) * feat_embed
        outputs, lm_pairs = self.base_lm(embeds, causal=True, segments=lengths)
        outputs = (self.fsq_layer(outputs) * feat_mask.unsqueeze(-1)
                   + outputs * text_mask.unsqueeze(-1))
        residual_in = self._residual_input(outputs, feat_mask.unsqueeze(-1) * feat_embed)
        residual, residual_pairs = self.residual_lm(residual_in, causal=True, segments=lengths)
        prefilled, start = [], 0
        for length in lengths:
            end = start + length
            prefilled.append(Prefilled(
                outputs[:, end - 1, :], residual[:, end - 1, :],
                [(k[:, :, start:end], v[:, :, start:end]) for k, v in lm_pairs],
                [(k[:, :, start:end], v[:, :, start:end]) for k, v in residual_pairs]))
            start = end
        return prefilled

    def dit_condition(self, lm_hidden: torch.Tensor, residual_hidden: torch.Tensor
                      ) -> torch.Tensor:
        lm_part = self.lm_to_dit_proj(lm_hidden)
        residual_part = self.res_to_dit_proj(residual_hidden)
        if self.config.is_v2:
            return torch.cat((lm_part, residual_part), dim=-1)
        return lm_part + residual_part

    def sample(self, lm_hidden, residual_hidden, previous: torch.Tensor, noise: torch.Tensor,
               *, steps: int, guidance: float, rowwise: bool = False) -> torch.Tensor:
        """One patch ``(b, patch, feat)`` from the LM states and the previous patch
        (``rowwise``: ``b`` independent sequences, see :func:`~mizuoto_voxcpm.flow.sample_patch`)."""
        mu = self.dit_condition(lm_hidden, residual_hidden)
        patch = self.feat_decoder(mu, previous.transpose(1, 2).contiguous(), noise,
                                  steps=steps, guidance=guidance, rowwise=rowwise)
        return patch.transpose(1, 2)

    def stop_flag(self, lm_hidden: torch.Tensor) -> torch.Tensor:
        """Whether the stop head ends speech at this LM state: ``(b,)`` bool, on the device
        (reading it is the host's only wait per patch)."""
        logits = self.stop_head(F.silu(self.stop_proj(lm_hidden)))
        return logits.argmax(dim=-1) == 1

    def advance(self, patch_embed: torch.Tensor, slot: CacheSlot
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed one generated patch (``(b, hidden)``) to both LMs in ``slot``; return their
        new states."""
        lm_hidden = self.fsq_layer(self.base_lm.step(patch_embed, slot.lm))
        residual_in = self._residual_input(lm_hidden, patch_embed)
        return lm_hidden, self.residual_lm.step(residual_in, slot.residual)

    def advance_rows(self, patch_embeds: torch.Tensor, slots: list[CacheSlot]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`advance` for ``b`` sequences at once (``patch_embeds``: ``(b, hidden)``),
        row ``i`` in ``slots[i]``."""
        lm_hidden = self.fsq_layer(self.base_lm.step_rows(patch_embeds, [s.lm for s in slots]))
        residual_in = self._residual_input(lm_hidden, patch_embeds)
        return lm_hidden, self.residual_lm.step_rows(residual_in, [s.residual for s in slots])


# -- loading ---------------------------------------------------------------------------------


def find_weights(model_dir: Path) -> Path:
    return find_weights_file(model_dir, WEIGHT_FILES,
                             "the VoxCPM LM weights are missing from the model directory")


def load_model(model_dir: str | Path, config: VoxCPMConfig, *, dtype: torch.dtype,
               device: torch.device | str = "cpu", attention: str = "exact") -> VoxCPMModel:
    """Build the model in ``dtype`` (RoPE tables computed in float32 and rounded to ``dtype``,
    as upstream's cast before copying the checkpoint in does), then load the weights strictly."""
    model_dir = Path(model_dir)
    path = find_weights(model_dir)
    # built on the meta device (no random init), materialised uninitialised, RoPE tables
    # recomputed: the same values as upstream's build-in-float32-then-cast, without the init cost
    with torch.device("meta"):
        model = VoxCPMModel(config)
    # the file's shapes against the config's, from the header alone: a config.json that does
    # not fit its weights is named before the model takes any memory
    check_weights_file(model, path, skip_prefixes=("audio_vae.",), tolerate_unexpected=True,
                       detail=f"the layout comes from {config.path}")
    model = materialize_empty(model, device, dtype)
    for module in model.modules():
        if isinstance(module, LongRoPE):
            module.rebuild(dtype)
    # upstream loads with strict=False: extra tensors are ignored (with a warning here), while
    # a missing one would silently stay uninitialised, so missing and mis-shaped keys are errors.
    # Upstream overwrites any audio_vae.* entries with audiovae.*: they are not LM weights.
    # Tensor by tensor: a float32 VoxCPM2 file into bfloat16 no longer holds both at once.
    # (a .bin: upstream reads checkpoint.get("state_dict", checkpoint))
    load_weights_into(model, path, key=("state_dict", ""), skip_prefixes=("audio_vae.",),
                      tolerate_unexpected=True)
    # upstream's from_local only calls .eval(): parameters keep requires_grad=True, and that
    # picks the kernel. F.linear on a non-contiguous 3-D input (the DiT's out_proj on
    # hidden[:, skip:]) goes through at::matmul, which folds the batch into one mm only when the
    # weight requires grad, else runs bmm -- 1 ulp apart in fp32 for patch 2 and width >= 16.
    # Generation runs under inference_mode, so no graph is recorded either way.
    model = model.eval()
    model.allocate_caches(attention)
    return model
