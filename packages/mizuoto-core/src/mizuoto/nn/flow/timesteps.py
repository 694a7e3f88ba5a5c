"""Time grids for flow-matching sampling.

- `uniform_timesteps(steps, device, dtype)`: ``linspace(0, 1, steps + 1)``.
- `epss_timesteps(steps, device, dtype)`: F5-TTS's Empirically Pruned Step Sampling grids for
  ``steps`` in {5, 6, 7, 10, 12, 16} (multiples of 1/32), else the uniform grid.
- `sway_sampling(t, coef)`: ``t + coef * (cos(pi / 2 * t) - 1 + t)``; negative ``coef`` crowds
  the steps near t = 0.
- `time_grid(steps, use_epss, sway_sampling_coef, device, dtype)`: the grid ``CFM.sample``
  integrates over (EPSS or uniform, then sway). In half precision many steps with sway give
  repeated values near t = 0 (the ODE solver refuses such a grid): engines check it first.

All computed in ``dtype`` op for op as F5-TTS does, so grids match bitwise in half precision too.
"""

from __future__ import annotations

import torch

_EPSS_GRIDS: dict[int, tuple[int, ...]] = {
    5: (0, 2, 4, 8, 16, 32),
    6: (0, 2, 4, 6, 8, 16, 32),
    7: (0, 2, 4, 6, 8, 16, 24, 32),
    10: (0, 2, 4, 6, 8, 12, 16, 20, 24, 28, 32),
    12: (0, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32),
    16: (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32),
}


def uniform_timesteps(
    steps: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    return torch.linspace(0, 1, steps + 1, device=device, dtype=dtype)


def epss_timesteps(
    steps: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    grid = _EPSS_GRIDS.get(steps)
    if grid is None:
        return uniform_timesteps(steps, device=device, dtype=dtype)
    return (1 / 32) * torch.tensor(grid, device=device, dtype=dtype)


def sway_sampling(t: torch.Tensor, coef: float) -> torch.Tensor:
    return t + coef * (torch.cos(torch.pi / 2 * t) - 1 + t)


def time_grid(steps: int, *, use_epss: bool, sway_sampling_coef: float | None,
              device: torch.device | str | None = None,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """EPSS (``use_epss``) or uniform timesteps, then sway sampling unless the coef is None."""
    if use_epss:
        t = epss_timesteps(steps, device=device, dtype=dtype)
    else:
        t = uniform_timesteps(steps, device=device, dtype=dtype)
    if sway_sampling_coef is not None:
        t = sway_sampling(t, sway_sampling_coef)
    return t
