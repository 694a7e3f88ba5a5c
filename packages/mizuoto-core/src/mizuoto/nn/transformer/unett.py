"""UNetT: E2-TTS's flat U-Net transformer (pre-norm blocks, skip connections between halves).

`UNetT(dim=..., depth=... (even), heads=..., dim_head=..., ff_mult=..., mel_dim=100,
text_num_embeds=..., text_dim=None, text_mask_padding=True, conv_layers=0, pe_attn_head=None,
skip_connect_type="concat"|"add"|"none", ...)` mirrors ``f5_tts.model.UNetT``. Each entry of
``layers`` is ``[skip_proj, attn_norm, attn, ff_norm, ff]`` (``skip_proj`` only in the later
half with "concat"), matching upstream's state-dict keys; norms are x-transformers `RMSNorm`.
The time embedding rides as an extra first token, so attention runs over ``n + 1`` positions.

``forward`` has the same arguments and result as `DiT.forward`.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.nn.transformer.attention import Attention
from mizuoto.nn.transformer.conditioning import TextConditionedBackbone
from mizuoto.nn.transformer.embeddings import TimestepEmbedding
from mizuoto.nn.transformer.feedforward import FeedForward
from mizuoto.nn.transformer.inputs import InputEmbedding, TextEmbedding
from mizuoto.nn.transformer.norms import RMSNorm
from mizuoto.nn.transformer.rotary import RotaryEmbedding


class UNetT(TextConditionedBackbone):
    def __init__(
        self,
        *,
        dim: int,
        depth: int = 8,
        heads: int = 8,
        dim_head: int = 64,
        dropout: float = 0.1,
        ff_mult: float = 4,
        mel_dim: int = 100,
        text_num_embeds: int = 256,
        text_dim: int | None = None,
        text_mask_padding: bool = True,
        qk_norm: str | None = None,
        conv_layers: int = 0,
        pe_attn_head: int | None = None,
        attn_mask_enabled: bool = False,
        skip_connect_type: Literal["add", "concat", "none"] = "concat",
    ) -> None:
        super().__init__()
        if depth % 2 != 0:
            raise ValueError(f"UNetT depth must be even, got {depth}")
        self.dim = dim
        self.depth = depth
        self.skip_connect_type = skip_connect_type
        text_dim = mel_dim if text_dim is None else text_dim

        self.time_embed = TimestepEmbedding(dim)
        self.text_embed = TextEmbedding(
            text_num_embeds,
            text_dim,
            mask_padding=text_mask_padding,
            conv_layers=conv_layers,
            max_positions=4096,
        )
        self.input_embed = InputEmbedding(mel_dim, text_dim, dim)
        self.rotary_embed = RotaryEmbedding(dim_head)

        self.layers = nn.ModuleList()
        for idx in range(depth):
            later_half = idx >= depth // 2
            attn = Attention(
                dim,
                heads=heads,
                dim_head=dim_head,
                dropout=dropout,
                qk_norm=qk_norm,
                pe_attn_head=pe_attn_head,
                attn_mask_enabled=attn_mask_enabled,
            )
            ff = FeedForward(dim=dim, mult=ff_mult, dropout=dropout, approximate="tanh")
            # built after the block, as upstream builds it: a random initialisation then
            # draws the same values
            skip_proj = (
                nn.Linear(dim * 2, dim, bias=False)
                if skip_connect_type == "concat" and later_half
                else None
            )
            self.layers.append(nn.ModuleList([skip_proj, RMSNorm(dim), attn, RMSNorm(dim), ff]))

        self.norm_out = RMSNorm(dim)
        self.proj_out = nn.Linear(dim, mel_dim)
        self.clear_cache()

    def forward(
        self,
        x: torch.Tensor,
        cond: torch.Tensor,
        text: torch.Tensor,
        time: torch.Tensor,
        mask: torch.Tensor | None = None,
        drop_audio_cond: bool = False,
        drop_text: bool = False,
        cfg_infer: bool = False,
        cache: bool = False,
    ) -> torch.Tensor:
        seq_len = x.shape[1]
        x, t, mask = self.embed_inputs(x, cond, text, time, mask, drop_audio_cond=drop_audio_cond,
                                       drop_text=drop_text, cfg_infer=cfg_infer, cache=cache)

        x = torch.cat([t.unsqueeze(1), x], dim=1)  # time rides as token 0
        if mask is not None:
            mask = F.pad(mask, (1, 0), value=1)
        rope = self.rotary_embed.from_seq_len(seq_len + 1)

        skips = []
        for idx, (skip_proj, attn_norm, attn, ff_norm, ff) in enumerate(self.layers):
            if idx < self.depth // 2:
                skips.append(x)
            else:
                skip = skips.pop()
                if self.skip_connect_type == "concat":
                    x = skip_proj(torch.cat((x, skip), dim=-1))
                elif self.skip_connect_type == "add":
                    x = x + skip
            x = attn(attn_norm(x), rope=rope, mask=mask) + x
            x = ff(ff_norm(x)) + x

        x = self.norm_out(x)[:, 1:, :]
        return self.proj_out(x)
