"""Rotary position embedding in the x-transformers layout (pairs interleaved, GPT-J style).

`RotaryEmbedding(dim_head).from_seq_len(n)` gives the angle table, shape ``(1, n, dim_head)``,
with each frequency repeated for its pair: ``[f0, f0, f1, f1, ...]``. `apply_rotary(t, freqs)`
rotates the first ``freqs.shape[-1]`` channels of ``t`` (``(b, h, n, d)`` or ``(b, n, d)``) and
leaves the rest as is. The arithmetic follows x-transformers 2.31 op for op, so results are
bitwise equal in every dtype; F5-TTS checkpoints carry the ``inv_freq`` buffer.
"""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Frequencies ``1 / base ** (2i / dim)``, kept in the persistent buffer ``inv_freq``."""

    inv_freq: torch.Tensor

    def __init__(self, dim: int, base: float = 10000.0, base_rescale_factor: float = 1.0) -> None:
        super().__init__()
        # NTK-aware rescaling as x-transformers does it (a no-op at the default factor 1)
        base *= base_rescale_factor ** (dim / (dim - 2))
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        # persistent: upstream checkpoints hold `...rotary_embed.inv_freq`
        self.register_buffer("inv_freq", inv_freq)

    def from_seq_len(self, seq_len: int) -> torch.Tensor:
        """Angles of positions ``0 .. seq_len - 1``: ``(1, seq_len, dim)`` in inv_freq's dtype."""
        positions = torch.arange(seq_len, device=self.inv_freq.device)
        return self.forward(positions)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        if positions.ndim == 1:
            positions = positions.unsqueeze(0)
        # einsum + `/ 1.0` (interpolation factor) as x-transformers computes the table
        freqs = torch.einsum("bi,j->bij", positions.type_as(self.inv_freq), self.inv_freq) / 1.0
        return torch.stack((freqs, freqs), dim=-1).flatten(-2)


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """``[x0, x1, x2, x3, ...] -> [-x1, x0, -x3, x2, ...]``."""
    pairs = x.unflatten(-1, (-1, 2))
    even, odd = pairs.unbind(dim=-1)
    return torch.stack((-odd, even), dim=-1).flatten(-2)


def apply_rotary(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate the leading ``freqs.shape[-1]`` channels of ``t`` by the angles in ``freqs``.

    ``freqs`` is ``(1, n_max, d)``; its last ``t.shape[-2]`` positions are used. The output keeps
    ``t``'s dtype.
    """
    rot_dim, seq_len, orig_dtype = freqs.shape[-1], t.shape[-2], t.dtype
    freqs = freqs[:, -seq_len:, :]
    if t.ndim == 4 and freqs.ndim == 3:
        freqs = freqs.unsqueeze(1)  # b n d -> b 1 n d (broadcast over heads)
    t, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    # x-transformers multiplies both terms by an xpos scale of 1.0: exact, so left out
    t = (t * freqs.cos()) + (_rotate_pairs(t) * freqs.sin())
    return torch.cat((t, t_pass), dim=-1).type(orig_dtype)
