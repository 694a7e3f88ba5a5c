"""The training forward: both LMs over whole packed sequences, the local DiT's conditional flow
matching loss and the stop head's cross-entropy, operation for operation as upstream's
``VoxCPMModel.forward`` / ``UnifiedCFM.compute_loss`` (the order of operations decides the bits
of the gradients).

Every random draw comes from one private generator, in upstream's order: the CFG mask, the
condition-noise mask and noise (drawn even when their ratio is 0), ``r`` and ``t``, the
``r ≠ t`` mask and ``z``; LoRA dropout masks as the layers run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch
import torch.nn.functional as F

from mizuoto_voxcpm.model import VoxCPMModel
from mizuoto_voxcpm.training.data import Batch

# upstream's sample_r_t defaults for the log-normal time sampler
LOGNORM_MU, LOGNORM_SIGMA = -0.4, 1.0


@attrs.frozen
class CfmTraining:
    """``dit_config.cfm_config``'s training fields (upstream's ``CfmConfig`` defaults)."""

    t_scheduler: str = "log-norm"
    training_cfg_rate: float = 0.1
    ratio_r_neq_t_range: tuple[float, float] = (0.25, 0.75)
    noise_cond_prob_range: tuple[float, float] = (0.0, 0.0)
    noise_cond_scale: float = 0.0

    @classmethod
    def from_config_json(cls, raw: Mapping[str, Any]) -> CfmTraining:
        cfm = dict(raw.get("dit_config", {}).get("cfm_config") or {})
        fields = {f.name for f in attrs.fields(cls)}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in cfm.items() if k in fields}
        config = cls(**values)
        if config.t_scheduler not in ("log-norm", "uniform"):
            raise ValueError(f"cfm_config.t_scheduler {config.t_scheduler!r} is not supported "
                             "(upstream knows log-norm and uniform)")
        return config


def quantize_straight_through(fsq, hidden: torch.Tensor) -> torch.Tensor:
    """The FSQ layer in training mode: rounded forward, identity gradient (upstream's
    ``hidden + (quantized - hidden).detach()``, whose sum is not always the rounded value)."""
    hidden = torch.tanh(fsq.in_proj(hidden))
    quantized = torch.round(hidden * fsq.scale) / fsq.scale
    hidden = hidden + (quantized - hidden).detach()
    return fsq.out_proj(hidden)


def _shift_right(x: torch.Tensor) -> torch.Tensor:
    return torch.cat((torch.zeros_like(x[:, 0:1, ...]), x[:, :-1, ...]), dim=1)


def training_losses(model: VoxCPMModel, batch: Batch, *, cfm: CfmTraining,
                    generator: torch.Generator, progress: float, dtype: torch.dtype
                    ) -> dict[str, torch.Tensor]:
    """``{"loss/diff": ..., "loss/stop": ...}`` of one packed batch."""
    device = model.device
    text_tokens = batch.text_tokens.to(device, dtype=torch.long)
    text_mask = batch.text_mask.to(device, dtype=dtype)
    audio_feats = batch.audio_feats.to(device, dtype=dtype)
    audio_mask = batch.audio_mask.to(device, dtype=dtype)
    loss_mask = batch.loss_mask.to(device, dtype=dtype)
    labels = batch.labels.to(device, dtype=torch.long)
    b, t, p, d = audio_feats.shape

    feat_embed = model.enc_to_lm_proj(model.feat_encoder(audio_feats))
    text_embed = model.base_lm.embed_tokens(text_tokens) * model.scale_emb
    combined = text_mask.unsqueeze(-1) * text_embed + audio_mask.unsqueeze(-1) * feat_embed
    enc_outputs, _ = model.base_lm(combined, causal=True)
    enc_outputs = enc_outputs.to(dtype)
    # upstream's FSQ layer: straight-through in training mode, rounded outright in eval mode
    # (validation)
    quantized = (quantize_straight_through(model.fsq_layer, enc_outputs) if model.training
                 else model.fsq_layer(enc_outputs))
    enc_outputs = quantized * audio_mask.unsqueeze(-1) + enc_outputs * text_mask.unsqueeze(-1)
    lm_hidden = _shift_right(enc_outputs)

    residual_in = model._residual_input(enc_outputs, audio_mask.unsqueeze(-1) * feat_embed)
    residual_outputs, _ = model.residual_lm(residual_in, causal=True)
    residual_hidden = _shift_right(residual_outputs.to(dtype))

    dit_hidden = model.dit_condition(lm_hidden, residual_hidden)
    dit_hidden = dit_hidden.reshape(b * t, dit_hidden.size(-1))
    feat_gt = audio_feats.to(dtype).reshape(b * t, p, d)
    feat_cond = _shift_right(audio_feats).to(dtype).reshape(b * t, p, d)
    loss_seq_mask = loss_mask.unsqueeze(-1).repeat(1, 1, p).reshape(b * t, p, 1).to(dtype)

    diff_loss = flow_matching_loss(
        model.feat_decoder.estimator, feat_gt.transpose(1, 2).contiguous(), dit_hidden,
        cond=feat_cond.transpose(1, 2).contiguous(),
        tgt_mask=loss_seq_mask.transpose(1, 2).contiguous(),
        cfm=cfm, mean_mode=model.feat_decoder.mean_mode, generator=generator, progress=progress)

    stop_logits = model.stop_head(F.silu(model.stop_proj(lm_hidden)))
    stop_losses = F.cross_entropy(stop_logits.transpose(1, 2), labels, reduction="none")
    denom = torch.clamp(loss_mask.sum(), min=1.0)
    stop_loss = (stop_losses * loss_mask).sum() / denom
    return {"loss/diff": diff_loss, "loss/stop": stop_loss}


def _sample_r_t(x: torch.Tensor, cfm: CfmTraining, ratio_r_neq_t: float,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.shape[0]
    kw = dict(device=x.device, dtype=x.dtype, generator=generator)
    if cfm.t_scheduler == "log-norm":
        r = torch.sigmoid(torch.randn(n, **kw) * LOGNORM_SIGMA + LOGNORM_MU)
        t = torch.sigmoid(torch.randn(n, **kw) * LOGNORM_SIGMA + LOGNORM_MU)
    else:
        r = torch.rand(n, **kw)
        t = torch.rand(n, **kw)
    mask = torch.rand(n, **kw) < ratio_r_neq_t
    r, t = torch.where(mask, torch.stack([torch.min(r, t), torch.max(r, t)], dim=0),
                       torch.stack([t, t], dim=0))
    return r.squeeze(), t.squeeze()


def flow_matching_loss(estimator, x1: torch.Tensor, mu: torch.Tensor, *, cond: torch.Tensor,
                       tgt_mask: torch.Tensor, cfm: CfmTraining, mean_mode: bool,
                       generator: torch.Generator, progress: float) -> torch.Tensor:
    """Upstream's ``UnifiedCFM.compute_loss`` (``x1``: ``(n, feat, patch)`` targets)."""
    n = x1.shape[0]
    device = x1.device
    if cfm.training_cfg_rate > 0:
        keep = torch.rand(n, device=device, generator=generator) > cfm.training_cfg_rate
        mu = mu * keep.view(-1, 1)
    low, high = cfm.noise_cond_prob_range
    noisy = torch.rand(n, device=device, generator=generator) > (1.0 - (low + progress * (high - low)))
    noise = torch.randn(cond.shape, device=device, dtype=cond.dtype, generator=generator)
    cond = cond + noisy.view(-1, 1, 1) * noise * cfm.noise_cond_scale
    low, high = cfm.ratio_r_neq_t_range
    ratio = low + progress * (high - low) if mean_mode else 0.0
    r, t = _sample_r_t(x1, cfm, ratio, generator)
    r_, t_ = r.detach().clone(), t.detach().clone()
    z = torch.randn(x1.shape, device=device, dtype=x1.dtype, generator=generator)
    y = (1 - t_.view(-1, 1, 1)) * x1 + t_.view(-1, 1, 1) * z
    v = z - x1
    if mean_mode:
        from torch.func import jvp

        def model_fn(z_sample, r_sample, t_sample):
            return estimator(z_sample, mu, t_sample, cond, t_sample - r_sample)

        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            u_pred, dudt = jvp(model_fn, (y, r, t), (v, torch.zeros_like(r), torch.ones_like(t)))
        u_tgt = v - (t_ - r_).view(-1, 1, 1) * dudt
    else:
        u_pred = estimator(y, mu, t, cond, t - r)
        u_tgt = v
    losses = F.mse_loss(u_pred, u_tgt.detach(), reduction="none").mean(dim=1)
    # upstream's adaptive weighting with p = 0: 1 / (loss + eps) ** 0, times the mask
    weights = (1.0 / ((losses + 1e-3).pow(0.0)) * tgt_mask.squeeze(1)).detach()
    return (weights * losses).sum() / torch.clamp(torch.sum(tgt_mask), min=1.0)

