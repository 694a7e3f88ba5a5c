"""Fixed-grid ODE integration, step for step as torchdiffeq 0.2.5's "euler" and "midpoint".

`odeint_fixed(func, y0, t, method="euler", *, keep_trajectory=True, on_step=None)` integrates
``dy/dt = func(t, y)`` over the grid ``t`` (1-D, strictly increasing or strictly decreasing,
``t[0]`` is the start). ``func`` receives ``t`` as a 0-dim tensor in ``y0``'s dtype. Returns the
trajectory ``(len(t), *y0.shape)`` with ``y0`` first, or only the final state when
``keep_trajectory`` is False. ``on_step(step, t1, y1)`` (if given) is called after each step,
``step`` counting from 1; ``y1`` is the solver's state, which later steps overwrite (clone it
to keep it). ``y0`` is never written to.

Arithmetic as torchdiffeq: ``dt = t1 - t0`` in ``t``'s dtype; Euler ``y1 = y0 + dt * f(t0, y0)``;
midpoint ``y_mid = y0 + f(t0, y0) * (0.5 * dt)``, ``y1 = y0 + dt * f(t0 + 0.5 * dt, y_mid)``.
A decreasing grid is negated and ``func`` wrapped as ``-1.0 * func(-t, y)``, as torchdiffeq does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ODEFunc = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
METHODS = ("euler", "midpoint")


def odeint_fixed(
    func: ODEFunc,
    y0: torch.Tensor,
    t: torch.Tensor,
    method: str = "euler",
    *,
    keep_trajectory: bool = True,
    on_step: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not torch.is_floating_point(t) or t.ndim != 1:
        raise ValueError(f"t must be a 1-D floating-point tensor, got {t.dtype} {tuple(t.shape)}")
    if len(t) > 1 and bool(t[0] > t[1]):
        grid = -t
        base = func

        def func(time: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return -1.0 * base(-time, y)
    else:
        grid = t
    if not bool((grid[1:] > grid[:-1]).all()):
        raise ValueError("t must be strictly increasing or strictly decreasing")
    grid = grid.to(y0.device)

    trajectory = None
    if keep_trajectory:
        trajectory = torch.empty(len(grid), *y0.shape, dtype=y0.dtype, device=y0.device)
        trajectory[0] = y0

    # dt * f and the state are written into the previous step's tensors instead of new ones
    # (y0, the caller's, is never written to): the same kernels on the same operands in the
    # same order as y + dt * f(t, y), so the same bits (tests/test_flow.py)
    dts = grid[1:] - grid[:-1]
    y, dy = y0, None
    for j in range(1, len(grid)):
        t0, dt = grid[j - 1], dts[j - 1]
        if method == "euler":
            velocity = func(t0.to(_real_dtype(y)), y)
        else:
            half_dt = 0.5 * dt
            y_mid = y + func(t0.to(_real_dtype(y)), y) * half_dt
            velocity = func((t0 + half_dt).to(_real_dtype(y_mid)), y_mid)
        if _fits(dy, torch.result_type(dt, velocity), velocity.shape):
            torch.mul(dt, velocity, out=dy)
        else:
            dy = dt * velocity
        if y is not y0 and _fits(y, torch.result_type(y, dy), y.shape):
            y.add_(dy)
        else:
            y = y + dy
        if trajectory is not None:
            trajectory[j] = y
        if on_step is not None:
            on_step(j, grid[j], y)
    return trajectory if trajectory is not None else y


def _real_dtype(y: torch.Tensor) -> torch.dtype:
    # torchdiffeq hands the solver's time to func cast to y.abs().dtype: this, without
    # computing |y|
    return y.real.dtype if y.is_complex() else y.dtype


def _fits(buffer: torch.Tensor | None, dtype: torch.dtype, shape: torch.Size) -> bool:
    """Whether ``buffer`` can take a result of ``dtype`` and ``shape`` as it is."""
    return buffer is not None and buffer.dtype == dtype and buffer.shape == shape
