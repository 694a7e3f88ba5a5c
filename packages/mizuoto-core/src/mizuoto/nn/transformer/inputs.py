"""Input side of the F5-TTS backbones: text embedding and the noisy-audio/condition/text mix.

`TextEmbedding(text_num_embeds, text_dim, mask_padding, conv_layers, max_positions)`:
``text`` ``(b, nt)`` token ids with -1 as batch padding -> ``(b, n, text_dim)``, cut or padded
to ``seq_len`` frames. Ids are shifted by one so 0 is the filler; with ``conv_layers > 0`` a
sinusoidal table is added and ConvNeXt-V2 blocks refine it. ``seq_len`` is an int (all items as
long as the batch) or a ``(b,)`` tensor of valid lengths (DiT with a batch mask): then positions
past each item's length stay exactly zero.

`InputEmbedding(mel_dim, text_dim, out_dim)`: ``proj([x, cond, text]) + conv_pos(proj(...))``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.nn.transformer.convnext import ConvNeXtV2Block
from mizuoto.nn.transformer.embeddings import ConvPositionEmbedding, sinusoidal_positions


class TextEmbedding(nn.Module):
    freqs_cis: torch.Tensor

    def __init__(
        self,
        text_num_embeds: int,
        text_dim: int,
        *,
        mask_padding: bool = True,
        conv_layers: int = 0,
        conv_mult: int = 2,
        max_positions: int = 8192,
    ) -> None:
        super().__init__()
        self.text_embed = nn.Embedding(text_num_embeds + 1, text_dim)  # row 0 is the filler
        self.mask_padding = mask_padding
        self.max_positions = max_positions
        self.extra_modeling = conv_layers > 0
        if self.extra_modeling:
            table = sinusoidal_positions(text_dim, max_positions)
            self.register_buffer("freqs_cis", table, persistent=False)
            self.text_blocks = nn.Sequential(
                *[ConvNeXtV2Block(text_dim, text_dim * conv_mult) for _ in range(conv_layers)]
            )

    def forward(
        self, text: torch.Tensor, seq_len: int | torch.Tensor, drop_text: bool = False
    ) -> torch.Tensor:
        text = text + 1  # batch padding -1 becomes the filler 0
        valid = None
        if torch.is_tensor(seq_len):
            seq_len = seq_len.to(device=text.device, dtype=torch.long)
            max_seq_len = int(seq_len.max().item())
        else:
            max_seq_len = int(seq_len)

        text = text[:, :max_seq_len]
        text = F.pad(text, (0, max_seq_len - text.shape[1]), value=0)
        if torch.is_tensor(seq_len):
            positions = torch.arange(max_seq_len, device=text.device)
            valid = positions.unsqueeze(0) < seq_len.unsqueeze(1)
            text = text.masked_fill(~valid, 0)
        pad_mask = text == 0 if self.mask_padding else None
        if drop_text:
            text = torch.zeros_like(text)

        emb = self.text_embed(text)
        if valid is not None:
            emb = emb.masked_fill(~valid.unsqueeze(-1), 0.0)

        if self.extra_modeling:
            positions = torch.arange(max_seq_len, device=self.freqs_cis.device)
            # past the table the last row repeats (UNetT's clamp); DiT upstream fails there
            positions = positions.clamp(max=self.max_positions - 1)
            freqs = self.freqs_cis[positions]
            if valid is not None:
                freqs = freqs.unsqueeze(0) * valid.unsqueeze(-1).to(freqs.dtype)
            emb = emb + freqs
            if pad_mask is not None:
                fill = pad_mask.unsqueeze(-1).expand(-1, -1, emb.size(-1))
                emb = emb.masked_fill(fill, 0.0)
                for block in self.text_blocks:
                    emb = block(emb).masked_fill(fill, 0.0)
            else:
                emb = self.text_blocks(emb)
        return emb


class InputEmbedding(nn.Module):
    def __init__(self, mel_dim: int, text_dim: int, out_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(mel_dim * 2 + text_dim, out_dim)
        self.conv_pos_embed = ConvPositionEmbedding(dim=out_dim)

    def forward(
        self,
        x: torch.Tensor,
        cond: torch.Tensor,
        text_embed: torch.Tensor,
        drop_audio_cond: bool = False,
        audio_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if drop_audio_cond:
            cond = torch.zeros_like(cond)
        x = self.proj(torch.cat((x, cond, text_embed), dim=-1))
        return self.conv_pos_embed(x, mask=audio_mask) + x
