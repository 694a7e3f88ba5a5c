"""Flow-matching pieces: fixed-grid ODE solvers, time grids, the sampler's bookkeeping."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from torch import nn

from mizuoto.nn.flow import (
    ConditionalFlowMatching,
    epss_timesteps,
    odeint_fixed,
    sway_sampling,
    uniform_timesteps,
)


def _linear_field(t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return -2.0 * y + t


class TestOdeintFixed:
    def test_euler_matches_hand_steps(self):
        y0 = torch.tensor([1.0, -0.5])
        t = torch.tensor([0.0, 0.25, 0.75, 1.0])
        y, expected = y0, [y0]
        for t0, t1 in zip(t[:-1], t[1:], strict=True):
            y = y + (t1 - t0) * _linear_field(t0, y)
            expected.append(y)
        assert torch.equal(odeint_fixed(_linear_field, y0, t, "euler"), torch.stack(expected))

    def test_midpoint_matches_hand_steps(self):
        y0 = torch.tensor([1.0, -0.5])
        t = torch.tensor([0.0, 0.5, 1.0])
        y = y0
        for t0, t1 in zip(t[:-1], t[1:], strict=True):
            dt = t1 - t0
            y_mid = y + _linear_field(t0, y) * (0.5 * dt)
            y = y + dt * _linear_field(t0 + 0.5 * dt, y_mid)
        assert torch.equal(odeint_fixed(_linear_field, y0, t, "midpoint")[-1], y)

    def test_midpoint_is_second_order(self):
        # dy/dt = y from 1: e at t = 1; halving the step cuts the error about 4x
        def errors(method):
            out = []
            for n in (16, 32):
                t = torch.linspace(0, 1, n + 1, dtype=torch.float64)
                y = odeint_fixed(lambda t, y: y, torch.ones(1, dtype=torch.float64), t, method)
                out.append(abs(y[-1].item() - math.e))
            return out[0] / out[1]

        assert 3.5 < errors("midpoint") < 4.5
        assert 1.8 < errors("euler") < 2.2

    def test_final_state_only(self):
        t = torch.linspace(0, 1, 5)
        y0 = torch.ones(3)
        full = odeint_fixed(_linear_field, y0, t)
        last = odeint_fixed(_linear_field, y0, t, keep_trajectory=False)
        assert full.shape == (5, 3)
        assert torch.equal(full[0], y0)
        assert torch.equal(last, full[-1])

    @pytest.mark.parametrize("method", ["euler", "midpoint"])
    def test_the_start_is_never_written_and_steps_reuse_their_buffers(self, method):
        y0 = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
        start = y0.clone()
        t = torch.linspace(0, 1, 6)
        states = []
        last = odeint_fixed(_linear_field, y0, t, method, keep_trajectory=False,
                            on_step=lambda j, t1, y1: states.append(y1.data_ptr()))
        assert torch.equal(y0, start)
        assert len(set(states)) == 1 and states[0] == last.data_ptr() != y0.data_ptr()
        assert torch.equal(last, odeint_fixed(_linear_field, y0, t, method)[-1])

    def test_on_step_reports_each_step(self):
        seen = []
        t = torch.linspace(0, 1, 4)
        y = odeint_fixed(_linear_field, torch.ones(2), t, "midpoint",
                         on_step=lambda j, t1, y1: seen.append((j, t1.item(), y1.clone())))
        assert [s[0] for s in seen] == [1, 2, 3]
        assert seen[-1][1] == 1.0 and torch.equal(seen[-1][2], y[-1])

    def test_time_reaches_func_in_state_dtype(self):
        seen = []

        def func(t, y):
            seen.append(t.dtype)
            return y

        odeint_fixed(func, torch.ones(2, dtype=torch.float16), torch.linspace(0, 1, 3), "midpoint")
        assert seen == [torch.float16] * 4

    def test_decreasing_grid_integrates_backwards(self):
        t = torch.linspace(1, 0, 9)
        y = odeint_fixed(lambda t, y: y, torch.ones(1), t, "midpoint")
        assert abs(y[-1].item() - math.exp(-1)) < 2e-3

    @pytest.mark.parametrize(
        "t", [torch.tensor([0.0, 0.5, 0.5, 1.0]), torch.tensor([0.0, 1.0, 0.5])]
    )
    def test_rejects_non_monotonic_grid(self, t):
        with pytest.raises(ValueError, match="strictly"):
            odeint_fixed(_linear_field, torch.ones(1), t)

    def test_rejects_unknown_method(self):
        with pytest.raises(ValueError, match="method"):
            odeint_fixed(_linear_field, torch.ones(1), torch.linspace(0, 1, 3), "rk4")

    @pytest.mark.parity
    @pytest.mark.parametrize("method", ["euler", "midpoint"])
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
    @pytest.mark.parametrize("decreasing", [False, True])
    def test_equals_torchdiffeq(self, method, dtype, decreasing):
        from torchdiffeq import odeint

        g = torch.Generator().manual_seed(0)
        y0 = torch.randn(2, 7, 5, generator=g).to(dtype)
        weight = torch.randn(5, 5, generator=g).to(dtype) * 0.3

        def func(t, y):
            return torch.tanh(y @ weight) * (1 + t) - 0.1 * y

        t = sway_sampling(epss_timesteps(7, dtype=dtype), -1.0)
        if decreasing:
            t = t.flip(0)
        expected = odeint(func, y0, t, method=method)
        assert torch.equal(odeint_fixed(func, y0, t, method), expected)


class TestTimesteps:
    def test_epss_grids(self):
        assert torch.equal(epss_timesteps(7), torch.tensor([0, 2, 4, 6, 8, 16, 24, 32]) / 32)
        assert epss_timesteps(16).shape == (17,)
        for steps in (5, 6, 7, 10, 12, 16):
            grid = epss_timesteps(steps)
            assert grid[0] == 0 and grid[-1] == 1 and len(grid) == steps + 1

    def test_epss_falls_back_to_uniform(self):
        assert torch.equal(epss_timesteps(32), uniform_timesteps(32))
        assert torch.equal(epss_timesteps(8, dtype=torch.float16), torch.linspace(0, 1, 9).half())

    def test_epss_dtype(self):
        assert epss_timesteps(5, dtype=torch.bfloat16).dtype == torch.bfloat16

    def test_sway_values(self):
        t = uniform_timesteps(4)
        out = sway_sampling(t, -1.0)
        # coef -1: t - (cos(pi t / 2) - 1 + t) = 1 - cos(pi t / 2)
        assert torch.allclose(out, 1 - torch.cos(torch.pi / 2 * t), atol=1e-7)
        assert out[0] == 0 and out[-1] == 1
        assert torch.equal(sway_sampling(t, 0.0), t)
        assert (out[1:-1] < t[1:-1]).all()  # negative coef crowds steps near 0


class _EchoBackbone(nn.Module):
    """Velocity = 1 everywhere; records what the sampler passes."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.calls = []

    def own_text_cache(self):
        return contextlib.nullcontext()

    def forward(self, x, cond, text, time, mask=None, cfg_infer=False, cache=False, **kwargs):
        self.calls.append(dict(x=x.shape, cond=cond, time=time, mask=mask, cfg=cfg_infer))
        out = torch.ones_like(x) * self.scale
        return torch.cat((out, out), dim=0) if cfg_infer else out


class TestConditionalFlowMatching:
    def test_duration_cond_and_noise(self):
        backbone = _EchoBackbone()
        sampler = ConditionalFlowMatching(backbone, num_channels=4)
        cond = torch.randn(2, 5, 4)
        text = torch.tensor([[1, 2, 3, 4, 5, 6, 7], [1, 2, -1, -1, -1, -1, -1]])
        out, trajectory = sampler.sample(
            cond, text, torch.tensor([3, 9]), lens=torch.tensor([5, 3]), steps=4,
            cfg_strength=2.0, seed=0, keep_trajectory=True,
        )
        # durations become max(text length, lens) + 1 at least: [8, 9]
        assert out.shape == (2, 9, 4)
        assert trajectory.shape == (5, 2, 9, 4)
        assert torch.equal(out[0, :5], cond[0]) and torch.equal(out[1, :3], cond[1, :3])
        noise = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
        assert torch.equal(trajectory[0, 0, :8], noise)
        # the seed is re-applied per item: each draws what a batch of one would
        noise_9 = torch.randn(9, 4, generator=torch.Generator().manual_seed(0))
        assert torch.equal(trajectory[0, 1], noise_9)
        assert torch.equal(trajectory[0, 0, 8], torch.zeros(4))  # padded
        # unit velocity integrated over [0, 1]
        assert torch.allclose(out[0, 5:8], noise[5:] + 1, atol=1e-6)
        call = backbone.calls[0]
        assert call["cfg"] and call["time"].ndim == 0
        assert torch.equal(call["mask"], torch.arange(9)[None] < torch.tensor([8, 9])[:, None])
        assert torch.equal(call["cond"][1, 3:], torch.zeros(6, 4))  # past lens: no condition

    def test_single_item_has_no_mask_and_no_cfg_at_zero(self):
        backbone = _EchoBackbone()
        sampler = ConditionalFlowMatching(backbone, num_channels=4)
        steps = []
        sampler.sample(torch.randn(1, 3, 4), torch.tensor([[1, 2]]), 6, steps=2, cfg_strength=0.0,
                       method="midpoint", on_step=lambda done, total: steps.append((done, total)))
        assert backbone.calls[0]["mask"] is None and not backbone.calls[0]["cfg"]
        assert len(backbone.calls) == 4 and steps == [(1, 2), (2, 2)]

    def test_audio_condition_needs_mel_spec(self):
        sampler = ConditionalFlowMatching(_EchoBackbone(), num_channels=4)
        with pytest.raises(ValueError, match="mel_spec"):
            sampler.sample(torch.randn(1, 1000), torch.tensor([[1]]), 6, steps=2)

    def test_mel_spec_is_not_a_submodule(self):
        mel = nn.Linear(1, 1)
        sampler = ConditionalFlowMatching(_EchoBackbone(), num_channels=4, mel_spec=mel)
        assert sampler.mel_spec is mel
        assert list(sampler.state_dict()) == ["transformer.scale"]
        sampler.to(torch.float16)
        assert mel.weight.dtype == torch.float32

    def test_text_must_be_ids(self):
        sampler = ConditionalFlowMatching(_EchoBackbone(), num_channels=4)
        with pytest.raises(TypeError, match="token ids"):
            sampler.sample(torch.randn(1, 3, 4), ["hello"], 6)
