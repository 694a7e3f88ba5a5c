"""``mizuoto bench --profile``: the per-component clocks and the roofline split (no timing is
asserted: only what is counted, and that the parts add up)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from mizuoto.benchmarking.profile import component_clocks, profile_table, split
from mizuoto.cli import cli


class _Stepper(nn.Module):
    """A decoder whose step is a method of its own calling forward (counted once)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 8)  # a table a call gathers from: not weight traffic
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return self.proj(x)

    def step(self, x):
        return self(x) + 1


def test_clocks_count_calls_and_weight_traffic_and_unhook():
    lm, head = _Stepper(), nn.Linear(8, 2, bias=False)
    x = torch.randn(1, 8)
    with component_clocks({"lm": [lm], "head": [head]}) as clocks:
        for _ in range(3):
            head(lm.step(x))
        lm(x)
    profile = split(clocks, total_s=10.0, bandwidth_gb_s=10.0, per="head")
    rows = profile["components"]
    assert rows["lm"]["calls"] == 4 and rows["head"]["calls"] == 3 and profile["units"] == 3
    assert rows["lm"]["weights_mb_per_unit"] == pytest.approx(4 * (8 * 8 + 8) * 4 / 3 / 1e6)
    assert rows["other"]["ms"] == pytest.approx(10e3 - rows["lm"]["ms"] - rows["head"]["ms"])
    traffic = (4 * 72 + 3 * 16) * 4
    assert profile["bandwidth_bound_s"] == pytest.approx(traffic / 10e9)
    assert "step" not in vars(lm) and not lm._forward_hooks and not head._forward_pre_hooks
    # the first call of each component, and when the first unit (head call) was done
    assert 0 < rows["lm"]["first_call_ms"] <= rows["lm"]["ms"]
    assert 0 < rows["head"]["first_call_ms"] <= rows["head"]["ms"]
    assert rows["other"]["first_call_ms"] is None
    assert 0 < profile["first_unit_s"] * 1e3 <= rows["lm"]["ms"] + rows["head"]["ms"] + 1e3
    text = profile_table(profile)
    assert text.splitlines()[1].split()[:2] == ["component", "ms"] and "other" in text
    assert "1st call ms" in text and "first head done after" in text
    assert profile["read_gb_s"] is None and "of read" not in text
    # with the read rate: each component's traffic against it too, and the header says both
    read = split(clocks, total_s=10.0, bandwidth_gb_s=10.0, per="head", read_gb_s=5.0)
    lm_row = read["components"]["lm"]
    assert lm_row["of_read_rate"] == pytest.approx(2 * lm_row["roofline"])
    assert read["components"]["other"]["of_read_rate"] is None
    text = profile_table(read)
    assert "(copy; reading alone 5.0 GB/s)" in text and "of read" in text.splitlines()[1]


def test_each_calls_floor_is_its_traffic_or_its_multiply_adds_whichever_is_slower():
    """A call's floor is its weight traffic at the bandwidth or its multiply-adds (linear
    layers, 1-d convolutions) at the compute rate, whichever takes longer: one row is
    bandwidth-bound, many rows compute-bound."""
    lm = _Stepper()
    vae = nn.Sequential(nn.Conv1d(4, 6, 3, padding=1), nn.ConvTranspose1d(6, 2, 4, stride=2))
    with component_clocks({"lm": [lm], "vae": [vae]}) as clocks:
        lm.step(torch.randn(1, 8))  # 64 multiply-adds, 72 weights
        lm.step(torch.randn(3, 50, 8))  # 150 rows: 9,600
        vae(torch.randn(1, 4, 10))
    lm_bytes, vae_bytes = 72 * 4, (6 * 4 * 3 + 6 + 6 * 2 * 4 + 2) * 4
    vae_macs = 6 * 10 * 4 * 3 + 6 * 10 * 2 * 4  # output positions x taps; input x taps
    assert [c.per_call for c in clocks["lm"]] == [[(lm_bytes, 64), (lm_bytes, 9600)]]
    assert clocks["vae"][0].per_call == [(vae_bytes, vae_macs)]
    bandwidth, compute = 1e-6, 1e-6  # GB/s and GMAC/s: a byte or a multiply-add a millisecond
    profile = split(clocks, total_s=100.0, bandwidth_gb_s=bandwidth, compute_gmac_s=compute)
    rows = profile["components"]
    assert rows["lm"]["floor_ms"] == pytest.approx(lm_bytes + 9600)
    assert rows["vae"]["floor_ms"] == pytest.approx(max(vae_bytes, vae_macs))
    assert rows["lm"]["gmacs_per_unit"] == pytest.approx(9664 / 1e9)
    assert profile["floor_s"] == pytest.approx((lm_bytes + 9600 + max(vae_bytes, vae_macs)) / 1e3)
    assert profile["of_floor"] == pytest.approx(profile["floor_s"] / 100.0)
    assert "measured compute" in profile_table(profile)
    # without a compute rate: the bandwidth bound only, as before
    plain = split(clocks, total_s=100.0, bandwidth_gb_s=bandwidth)
    assert plain["floor_s"] is None and plain["components"]["lm"]["floor_ms"] is None
    assert "measured compute" not in profile_table(plain)


def test_int8_layers_count_their_packed_weights():
    """A dynamic int8 linear (a fast profile's) holds its weight outside ``parameters()``:
    the clocks count its int8 weight and float32 bias, one byte a weight."""
    import warnings

    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lm = quantize_dynamic(_Stepper(), {nn.Linear}, dtype=torch.qint8)
    assert not list(lm.proj.parameters())
    with component_clocks({"lm": [lm]}) as clocks:
        lm.step(torch.randn(1, 8))
    profile = split(clocks, total_s=1.0, bandwidth_gb_s=10.0, per="lm")
    assert profile["components"]["lm"]["weights_mb_per_unit"] == pytest.approx(
        (8 * 8 * 1 + 8 * 4) / 1e6)
    assert clocks["lm"][0].per_call[0][1] == 64  # its multiply-adds, counted once


def test_bench_profile_splits_a_voxcpm_request(tmp_path, monkeypatch):
    pytest.importorskip("mizuoto_voxcpm")
    monkeypatch.setenv("MIZUOTO_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(cli, ["--quiet", "bench", "random:voxcpm/tiny-0.5b", "--runs",
                                      "1", "--threads", "1", "--json", "--profile"], obj={},
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.output)["configurations"][0]["runs"]
    profile = run["profile"]
    assert list(profile["components"]) == ["base_lm", "residual_lm", "encoder", "dit",
                                           "stop_head", "projections", "vae", "other"]
    assert profile["unit"] == "stop_head" and profile["units"] > 0
    assert profile["components"]["base_lm"]["calls"] > 0  # the prefill and the steps
    # the base LM's first call is its prefill; the first patch is done within the request
    assert 0 < profile["components"]["base_lm"]["first_call_ms"] < profile["request_s"] * 1e3
    assert 0 < profile["first_unit_s"] < profile["request_s"]
    assert profile["bandwidth_gb_s"] > 0 and 0 < profile["roofline"] < 1
    assert profile["read_gb_s"] > 0
    # the kernels' and the CPU's rates measured too: each call's floor at least its
    # bandwidth bound, the CPU's at most the kernels' own (the best rate per dtype)
    assert profile["cpu_rates"]["float32"]["gmac_s"] > 0
    assert profile["bandwidth_bound_s"] <= profile["floor_s"] < profile["request_s"]
    assert profile["floor_s"] <= profile["kernel_floor_s"] * (1 + 1e-9)
    # every component names the kernels its layers ran, each with its measured rate
    assert any("linear" in kernel for kernel in profile["components"]["dit"]["kernels"])
    ran = {kernel for row in profile["components"].values() for kernel in row["kernels"]}
    assert ran and all(profile["kernel_rates_gmac_s"][kernel] > 0 for kernel in ran)
    assert profile["components"]["dit"]["gmacs_per_unit"] > 0
    covered = sum(row["ms"] for row in profile["components"].values())
    assert covered == pytest.approx(profile["request_s"] * 1e3)
    assert profile["eager_for_hooks"] == {}  # the exact path traces nothing


def test_bench_profile_says_which_traced_calls_its_hooks_timed_eager(tmp_path, monkeypatch):
    """A trace runs no hook, so under the profile's clocks an int8 engine's traced steps run
    eager: the profile counts and names them rather than pass eager times for traced ones."""
    pytest.importorskip("mizuoto_voxcpm")
    from mizuoto.benchmarking.profile import profile_table

    monkeypatch.setenv("MIZUOTO_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(cli, ["--quiet", "bench", "random:voxcpm/tiny-0.5b", "--runs",
                                      "1", "--threads", "1", "--json", "--profile",
                                      "--option", "engines.voxcpm.fast=int8"], obj={},
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.output)["configurations"][0]["runs"]
    eager = run["profile"]["eager_for_hooks"]
    assert set(eager) == {"base LM decode step", "residual LM decode step", "local DiT",
                          "local encoder"}
    assert eager["local DiT"] > eager["base LM decode step"] > 0  # steps x evaluations
    assert "timed eager, traced in a plain request" in profile_table(run["profile"])
