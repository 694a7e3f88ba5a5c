"""Flow matching: fixed-grid ODE solvers, time grids and the conditional flow-matching sampler."""

from mizuoto.nn.flow.cfm import ConditionalFlowMatching
from mizuoto.nn.flow.ode import odeint_fixed
from mizuoto.nn.flow.timesteps import (
    epss_timesteps,
    sway_sampling,
    time_grid,
    uniform_timesteps,
)

__all__ = [
    "ConditionalFlowMatching",
    "epss_timesteps",
    "odeint_fixed",
    "sway_sampling",
    "time_grid",
    "uniform_timesteps",
]
