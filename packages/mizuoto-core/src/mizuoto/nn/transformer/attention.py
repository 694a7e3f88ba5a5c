"""Multi-head self-attention of the F5-TTS backbones (DiT and UNetT).

`Attention(dim, heads, dim_head, ...)(x, mask=None, rope=None)`:
- ``x`` ``(b, n, dim)``; ``mask`` ``(b, n)`` bool, True = valid frame, or None;
- ``rope`` the ``(1, n, dim_head)`` angle table of `RotaryEmbedding`, applied to q and k of all
  heads, or of the first ``pe_attn_head`` heads only (F5-TTS v0 and E2 use 1);
- attention is ``F.scaled_dot_product_attention``; the key-padding mask enters it only with
  ``attn_mask_enabled`` (off in every released config), but padded output frames are always
  zeroed when a mask is given.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.nn.transformer.norms import NativeRMSNorm
from mizuoto.nn.transformer.rotary import apply_rotary


class Attention(nn.Module):
    def __init__(
        self,
        dim: int,
        heads: int = 8,
        dim_head: int = 64,
        dropout: float = 0.0,
        qk_norm: str | None = None,
        pe_attn_head: int | None = None,
        attn_mask_enabled: bool = False,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.heads = heads
        self.inner_dim = dim_head * heads
        self.pe_attn_head = pe_attn_head
        self.attn_mask_enabled = attn_mask_enabled

        self.to_q = nn.Linear(dim, self.inner_dim)
        self.to_k = nn.Linear(dim, self.inner_dim)
        self.to_v = nn.Linear(dim, self.inner_dim)
        if qk_norm is None:
            self.q_norm = None
            self.k_norm = None
        elif qk_norm == "rms_norm":
            self.q_norm = NativeRMSNorm(dim_head, eps=1e-6)
            self.k_norm = NativeRMSNorm(dim_head, eps=1e-6)
        else:
            raise ValueError(f"qk_norm must be None or 'rms_norm', got {qk_norm!r}")
        self.to_out = nn.ModuleList([nn.Linear(self.inner_dim, dim), nn.Dropout(dropout)])

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        rope: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch = x.shape[0]
        query = self.to_q(x)
        key = self.to_k(x)
        value = self.to_v(x)

        head_dim = key.shape[-1] // self.heads
        query = query.view(batch, -1, self.heads, head_dim).transpose(1, 2)
        key = key.view(batch, -1, self.heads, head_dim).transpose(1, 2)
        value = value.view(batch, -1, self.heads, head_dim).transpose(1, 2)

        if self.q_norm is not None:
            query = self.q_norm(query)
        if self.k_norm is not None:
            key = self.k_norm(key)

        if rope is not None:
            if self.pe_attn_head is not None:
                # written in place into the projection's view, as upstream: SDPA sees the same
                # strides, hence the same kernel path
                pn = self.pe_attn_head
                query[:, :pn, :, :] = apply_rotary(query[:, :pn, :, :], rope)
                key[:, :pn, :, :] = apply_rotary(key[:, :pn, :, :], rope)
            else:
                query = apply_rotary(query, rope)
                key = apply_rotary(key, rope)

        attn_mask = None
        if self.attn_mask_enabled and mask is not None:
            attn_mask = mask[:, None, None, :].expand(
                batch, self.heads, query.shape[-2], key.shape[-2]
            )
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=0.0, is_causal=False
        )
        out = out.transpose(1, 2).reshape(batch, -1, self.heads * head_dim).to(query.dtype)

        out = self.to_out[0](out)
        out = self.to_out[1](out)
        if mask is not None:
            out = out.masked_fill(~mask.unsqueeze(-1), 0.0)
        return out
