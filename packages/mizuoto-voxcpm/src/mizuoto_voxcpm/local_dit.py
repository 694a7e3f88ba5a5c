"""The local DiT: predicts the velocity of one patch from the LM state and the previous patch.

Two layouts: the first generation adds the LM condition to the time embedding in one token
(``prefix_tokens=0``); VoxCPM2 feeds the condition as its own tokens before the time token.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.runtime.shape_traces import ShapeTraces
from mizuoto_voxcpm.config import TransformerConfig
from mizuoto_voxcpm.minicpm4 import MiniCPM4


def sinusoidal_embedding(t: torch.Tensor, dim: int, scale: float = 1000) -> torch.Tensor:
    """Timestep embedding; the frequency table is built in ``t``'s dtype (bf16 in bf16 runs)."""
    if t.ndim < 1:
        t = t.unsqueeze(0)
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=t.dtype, device=t.device) * -step)
    angles = scale * t.unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


class TimestepMLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(dim, dim, bias=True)
        self.linear_2 = nn.Linear(dim, dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class LocalDiT(nn.Module):
    def __init__(self, config: TransformerConfig, in_channels: int, *, separate_condition: bool
                 ) -> None:
        super().__init__()
        hidden = config.hidden_size
        if hidden % 2:
            raise ValueError("the local DiT's hidden_dim must be even (sinusoidal time embedding)")
        self.hidden = hidden
        self.separate_condition = separate_condition
        self.in_proj = nn.Linear(in_channels, hidden, bias=True)
        self.cond_proj = nn.Linear(in_channels, hidden, bias=True)
        self.out_proj = nn.Linear(hidden, in_channels, bias=True)
        self.time_mlp = TimestepMLP(hidden)
        self.delta_time_mlp = TimestepMLP(hidden)
        self.decoder = MiniCPM4(config)
        #: the last decoder layer computes the patch's positions only, after every position's
        #: keys and values (a fast profile's: the velocity reads no other; equal to rounding)
        self.patch_rows_only = False
        #: the evaluations replayed as a proven trace per input shape and ``pairs`` (a fast
        #: profile's: :meth:`trace_evaluations`), else None: eager
        self.shape_traces: ShapeTraces | None = None

    def trace_evaluations(self) -> None:
        """Run each input shape's inference evaluation as a TorchScript trace proven equal to
        the eager one (:class:`mizuoto.runtime.shape_traces.ShapeTraces`: a 0.5B evaluation
        in 0.76 of its eager time on two AVX2 cores, the same bits). Set it after any rewrite
        of the layers: a trace keeps the packed weights it met."""
        self.shape_traces = ShapeTraces.of_method(self, "evaluate", name="local DiT")

    def forward(self, x: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, cond: torch.Tensor,
                dt: torch.Tensor, *, pairs: bool = False) -> torch.Tensor:
        """:meth:`evaluate`, through :attr:`shape_traces` where they are set."""
        if self.shape_traces is not None:
            return self.shape_traces(x, mu, t, cond, dt, pairs=pairs)
        return self.evaluate(x, mu, t, cond, dt, pairs=pairs)

    def evaluate(self, x: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, cond: torch.Tensor,
                 dt: torch.Tensor, *, pairs: bool = False) -> torch.Tensor:
        """``x``: ``(n, c, patch)``, ``mu``: ``(n, h·k)``, ``t``/``dt``: ``(n,)``,
        ``cond``: ``(n, c, prefix)`` -> velocity ``(n, c, patch)``.

        ``pairs`` (a batch of several sequences, guided: the first ``n/2`` rows conditional,
        the rest their unconditional twins): the output projection runs once per sequence on
        its two rows, as for one sequence alone. Its input is a strided view, which the matrix
        product copies into ``rows × patch`` rows: with more rows the kernel may sum in
        another order (seen in bfloat16, 1 ulp, then amplified by the sampler)."""
        x = self.in_proj(x.transpose(1, 2).contiguous())
        cond = self.cond_proj(cond.transpose(1, 2).contiguous())
        time = self.time_mlp(sinusoidal_embedding(t, self.hidden).to(x.dtype))
        time = time + self.delta_time_mlp(sinusoidal_embedding(dt, self.hidden).to(x.dtype))
        if self.separate_condition:
            mu = mu.view(x.size(0), -1, x.size(-1))
            tokens = torch.cat([mu, time.unsqueeze(1), cond, x], dim=1)
            skip = mu.size(1) + 1 + cond.size(1)
        else:
            tokens = torch.cat([(mu + time).unsqueeze(1), cond, x], dim=1)
            skip = 1 + cond.size(1)
        if self.patch_rows_only:
            hidden, _ = self.decoder(tokens, causal=False, last=tokens.size(1) - skip)
            skip = 0
        else:
            hidden, _ = self.decoder(tokens, causal=False)
        if pairs and x.size(0) > 2:
            half = x.size(0) // 2
            outs = [self.out_proj(torch.stack((hidden[i], hidden[half + i]))[:, skip:, :])
                    for i in range(half)]
            out = torch.cat([o[:1] for o in outs] + [o[1:] for o in outs])
        else:
            out = self.out_proj(hidden[:, skip:, :])
        return out.transpose(1, 2).contiguous()
