"""DiT: the F5-TTS flow-matching backbone (adaLN-zero transformer blocks with rotary attention).

`DiT(dim=..., depth=..., heads=..., dim_head=..., ff_mult=..., mel_dim=100, text_num_embeds=...,
text_dim=None, text_mask_padding=True, conv_layers=0, pe_attn_head=None, ...)` mirrors
``f5_tts.model.DiT``; parameter names equal upstream's state-dict keys.

``forward(x, cond, text, time, mask=None, drop_audio_cond=False, drop_text=False,
cfg_infer=False, cache=False) -> (b, n, mel_dim)`` (``(2b, n, mel_dim)`` with ``cfg_infer``: the
conditional half, then the half without audio condition and text). ``x`` and ``cond`` are
``(b, n, mel_dim)``, ``text`` ``(b, nt)`` ids with -1 padding, ``time`` ``(b,)`` or a scalar,
``mask`` ``(b, n)`` True = valid. With ``cache`` the text embedding is computed once and reused
until `clear_cache()`; the sampler gives each run its own (`own_text_cache()`).
"""

from __future__ import annotations

import torch
from torch import nn

from mizuoto.nn.transformer.attention import Attention
from mizuoto.nn.transformer.conditioning import TextConditionedBackbone
from mizuoto.nn.transformer.embeddings import TimestepEmbedding
from mizuoto.nn.transformer.feedforward import FeedForward
from mizuoto.nn.transformer.inputs import InputEmbedding, TextEmbedding
from mizuoto.nn.transformer.norms import AdaLayerNormZero, AdaLayerNormZeroFinal
from mizuoto.nn.transformer.rotary import RotaryEmbedding


class DiTBlock(nn.Module):
    def __init__(
        self,
        dim: int,
        heads: int,
        dim_head: int,
        ff_mult: float = 4,
        dropout: float = 0.1,
        qk_norm: str | None = None,
        pe_attn_head: int | None = None,
        attn_mask_enabled: bool = False,
    ) -> None:
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim)
        self.attn = Attention(
            dim,
            heads=heads,
            dim_head=dim_head,
            dropout=dropout,
            qk_norm=qk_norm,
            pe_attn_head=pe_attn_head,
            attn_mask_enabled=attn_mask_enabled,
        )
        self.ff_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff = FeedForward(dim=dim, mult=ff_mult, dropout=dropout, approximate="tanh")

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        mask: torch.Tensor | None = None,
        rope: torch.Tensor | None = None,
    ) -> torch.Tensor:
        norm, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.attn_norm(x, emb=t)
        x = x + gate_msa.unsqueeze(1) * self.attn(norm, mask=mask, rope=rope)
        norm = self.ff_norm(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        return x + gate_mlp.unsqueeze(1) * self.ff(norm)


class DiT(TextConditionedBackbone):
    uses_audio_mask = True

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
        long_skip_connection: bool = False,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.depth = depth
        text_dim = mel_dim if text_dim is None else text_dim

        self.time_embed = TimestepEmbedding(dim)
        self.text_embed = TextEmbedding(
            text_num_embeds,
            text_dim,
            mask_padding=text_mask_padding,
            conv_layers=conv_layers,
            max_positions=8192,
        )
        self.input_embed = InputEmbedding(mel_dim, text_dim, dim)
        self.rotary_embed = RotaryEmbedding(dim_head)
        self.transformer_blocks = nn.ModuleList(
            [
                DiTBlock(
                    dim=dim,
                    heads=heads,
                    dim_head=dim_head,
                    ff_mult=ff_mult,
                    dropout=dropout,
                    qk_norm=qk_norm,
                    pe_attn_head=pe_attn_head,
                    attn_mask_enabled=attn_mask_enabled,
                )
                for _ in range(depth)
            ]
        )
        self.long_skip_connection = (
            nn.Linear(dim * 2, dim, bias=False) if long_skip_connection else None
        )
        self.norm_out = AdaLayerNormZeroFinal(dim)
        self.proj_out = nn.Linear(dim, mel_dim)
        self.initialize_weights()
        self.clear_cache()

    def initialize_weights(self) -> None:
        """adaLN-zero: modulation and output layers start at zero (as upstream; training only)."""
        for block in self.transformer_blocks:
            nn.init.zeros_(block.attn_norm.linear.weight)
            nn.init.zeros_(block.attn_norm.linear.bias)
        for layer in (self.norm_out.linear, self.proj_out):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

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

        rope = self.rotary_embed.from_seq_len(seq_len)
        residual = x
        for block in self.transformer_blocks:
            x = block(x, t, mask=mask, rope=rope)
        if self.long_skip_connection is not None:
            x = self.long_skip_connection(torch.cat((x, residual), dim=-1))

        x = self.norm_out(x, t)
        return self.proj_out(x)
