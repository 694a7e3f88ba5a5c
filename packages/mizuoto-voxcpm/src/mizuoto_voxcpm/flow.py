"""The conditional flow matching sampler of the local DiT (one patch at a time).

Kept here rather than in ``mizuoto.nn.flow``: VoxCPM integrates from t = 1 down to 0 with the
time grid in the model dtype, accumulates time (``t -= dt``) instead of reading the grid, zeroes
the first Euler step(s) and guides with the CFG-zero* optimised scale. Each of those changes the
bits, so the arithmetic is specific to this engine.
"""

from __future__ import annotations

import torch

from mizuoto_voxcpm.local_dit import LocalDiT


def time_grid(steps: int, *, dtype: torch.dtype, device, sway: float = 1.0) -> torch.Tensor:
    """``linspace(1, 0, steps + 1)`` with sway sampling, computed in ``dtype`` as upstream."""
    t = torch.linspace(1, 0, steps + 1, device=device, dtype=dtype)
    return t + sway * (torch.cos(torch.pi / 2 * t) - 1 + t)


def zeroed_steps(steps: int) -> int:
    """CFG-zero*: how many leading Euler steps use a zero velocity (upstream's 4 % rule)."""
    return max(1, int((steps + 1) * 0.04))


def optimised_scale(positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    dot = torch.sum(positive * negative, dim=1, keepdim=True)
    norm = torch.sum(negative**2, dim=1, keepdim=True) + 1e-8
    return dot / norm


def sample_patch(estimator: LocalDiT, mu: torch.Tensor, cond: torch.Tensor, noise: torch.Tensor,
                 *, steps: int, guidance: float, mean_mode: bool = False,
                 rowwise: bool = False) -> torch.Tensor:
    """Integrate one patch from ``noise`` (``(b, c, patch)``) to latents with guided Euler steps.

    ``mu`` is the LM condition ``(b, ·)``; ``cond`` the previous patch ``(b, c, prefix)``.
    ``rowwise``: ``b`` independent sequences (continuous batching), each to be computed with
    the kernels it gets alone where they differ (see ``LocalDiT.forward``'s ``pairs``).
    """
    grid = time_grid(steps, dtype=mu.dtype, device=mu.device)
    x = noise
    t, dt = grid[0], grid[0] - grid[1]
    batch, channels, length = x.shape
    zero_steps = zeroed_steps(steps)
    for step in range(1, len(grid)):
        if step <= zero_steps:
            velocity = torch.zeros_like(x)
        else:
            velocity = _guided_velocity(estimator, x, mu, cond, t, dt, guidance, mean_mode,
                                        rowwise)
        x = x - dt * velocity
        t = t - dt
        if step < len(grid) - 1:
            dt = t - grid[step + 1]
    return x


def _guided_velocity(estimator, x, mu, cond, t, dt, guidance, mean_mode, rowwise=False):
    batch = x.size(0)
    # conditional and unconditional halves in one batch; the unconditional half has mu = 0
    mu_in = torch.zeros([2 * batch, mu.size(1)], device=x.device, dtype=x.dtype)
    mu_in[:batch] = mu
    x_in = torch.cat([x, x], dim=0)
    cond_in = torch.cat([cond, cond], dim=0)
    t_in = t.reshape(1).expand(2 * batch).to(x.dtype)
    if mean_mode:
        dt_in = dt.reshape(1).expand(2 * batch).to(x.dtype)
    else:
        dt_in = torch.zeros([2 * batch], device=x.device, dtype=x.dtype)
    out = estimator(x_in, mu_in, t_in, cond_in, dt_in, pairs=True) if rowwise else \
        estimator(x_in, mu_in, t_in, cond_in, dt_in)
    positive, negative = torch.split(out, [batch, batch], dim=0)
    scale = optimised_scale(positive.reshape(batch, -1), negative.reshape(batch, -1))
    scale = scale.view(batch, 1, 1)
    return negative * scale + guidance * (positive - negative * scale)
