"""``mizuoto bench --profile``'s kernels: which kernel each layer ran, the rates they and the
CPU reach (tiny products: nothing timed is asserted), and the three floors a component is
measured against."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from mizuoto.benchmarking.kernels import (
    KernelRates,
    kernel_counts,
    kernel_probes,
    layer_kernel,
    measure_kernel_rates,
)
from mizuoto.benchmarking.profile import component_clocks, profile_table, split


def _int8(module: nn.Module) -> nn.Module:
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(module, {nn.Linear}, dtype=torch.qint8)


class _Packed(nn.Linear):
    prepacked_kernel = "onednn"


class _OwnKernel(nn.Linear):
    kernel_name, kernel_dtype = "int8 own kernel (test)", "int8"


def test_each_layer_names_the_kernel_it_ran():
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = "x86"
    try:
        assert layer_kernel(_int8(nn.Sequential(nn.Linear(4, 4)))[0]) == (
            "int8 dynamic linear (fbgemm)", "int8")
    finally:
        torch.backends.quantized.engine = previous
    assert layer_kernel(nn.Linear(4, 4)) == ("torch float32 linear (MKL)", "float32")
    bf16 = layer_kernel(nn.Linear(4, 4).bfloat16())
    assert bf16[1] == "bfloat16" and bf16[0] in kernel_probes()
    assert layer_kernel(_Packed(4, 4).bfloat16()) == ("bfloat16 linear (oneDNN, prepacked)",
                                                       "bfloat16")
    assert layer_kernel(_OwnKernel(4, 4)) == ("int8 own kernel (test)", "int8")
    assert layer_kernel(nn.Conv1d(2, 2, 3)) == ("torch float32 conv1d", "float32")
    assert kernel_counts([nn.Linear(2, 2), nn.Conv1d(2, 2, 1), nn.Linear(3, 3)]) == {
        "torch float32 linear (MKL)": 2, "torch float32 conv1d": 1}


def test_rates_are_measured_per_kernel_in_use_and_the_cpu_rate_is_the_best_per_dtype():
    def probe(factor):
        def make(side):
            a = torch.randn(side, side)
            return (lambda: [a @ a for _ in range(factor)]), side ** 3
        return make

    def broken(side):
        raise RuntimeError("no such kernel on this CPU")

    probes = {"slow int8": ("int8", probe(8)), "fast int8": ("int8", probe(1)),
              "missing int8": ("int8", broken), "bf16 only": ("bfloat16", probe(1))}
    rates = measure_kernel_rates({("slow int8", "int8"), ("unprobed", "int8")},
                                 sides=(8,), repeats=1, probes=probes)
    # the kernel in use has its own rate; one without a probe has none; no bf16 in use
    assert set(rates.kernels) == {"slow int8"} and rates.kernel("unprobed") is None
    assert set(rates.cpu) == {"int8"} and rates.cpu["int8"][1] in ("fast int8", "slow int8")
    assert rates.best("int8") >= rates.kernel("slow int8") > 0
    assert rates.best("bfloat16") is None


def test_the_real_probes_run_at_a_tiny_size():
    in_use = {("torch float32 linear (MKL)", "float32"), ("int8 dynamic linear (fbgemm)", "int8")}
    rates = measure_kernel_rates(in_use, sides=(32,), repeats=1)
    assert rates.kernel("torch float32 linear (MKL)") > 0
    assert rates.kernel("int8 dynamic linear (fbgemm)") > 0
    assert rates.best("float32") > 0 and rates.best("int8") >= rates.kernel(
        "int8 dynamic linear (fbgemm)")


def test_a_component_is_measured_against_its_bandwidth_its_kernels_and_the_cpu():
    """A byte or a multiply-add a millisecond: an int8 layer whose kernel runs at half the
    CPU's int8 rate has a kernel floor twice its CPU floor where compute bounds the call."""
    lm = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False))
    dit = _int8(nn.Sequential(nn.Linear(8, 8, bias=False)))
    with component_clocks({"lm": [lm], "dit": [dit]}) as clocks:
        lm(torch.randn(1, 8))  # 128 multiply-adds, 512 bytes: bandwidth-bound
        dit(torch.randn(100, 8))  # 6,400 multiply-adds, 64 + 4 bytes: compute-bound
    (int8_kernel, _), = {layer_kernel(layer) for layer in clocks["dit"][0].layers}
    rates = KernelRates(kernels={"torch float32 linear (MKL)": 1e-6, int8_kernel: 0.5e-6},
                        cpu={"float32": (1e-6, "torch float32 linear (MKL)"),
                             "int8": (1e-6, "int8 qlinear (oneDNN, VNNI)")})
    profile = split(clocks, total_s=100.0, bandwidth_gb_s=1e-6, rates=rates)
    rows = profile["components"]
    assert rows["lm"]["floor_ms"] == pytest.approx(512)
    assert rows["lm"]["kernel_floor_ms"] == pytest.approx(512)
    assert rows["dit"]["floor_ms"] == pytest.approx(6400)
    assert rows["dit"]["kernel_floor_ms"] == pytest.approx(12800)
    assert rows["dit"]["kernels"] == {int8_kernel: 1}
    assert rows["lm"]["kernels"] == {"torch float32 linear (MKL)": 2}
    assert profile["floor_s"] == pytest.approx(6.912)
    assert profile["kernel_floor_s"] == pytest.approx(13.312)
    assert profile["of_kernel_floor"] == pytest.approx(13.312 / 100)
    text = profile_table(profile)
    assert "kernels that ran:" in text
    assert f"dit: {int8_kernel} x1" in text and "int8 qlinear (oneDNN, VNNI)" in text
    # a kernel with no measured rate leaves its component's kernel floor unknown
    unknown = split(clocks, total_s=100.0, bandwidth_gb_s=1e-6,
                    rates=KernelRates(kernels={}, cpu=rates.cpu))
    assert unknown["components"]["dit"]["kernel_floor_ms"] is None
    assert unknown["kernel_floor_s"] is None and unknown["floor_s"] == pytest.approx(6.912)


def test_a_component_that_is_one_linear_layer_counts_its_multiply_adds():
    head = nn.Linear(8, 2)
    with component_clocks({"head": [head]}) as clocks:
        head(torch.randn(3, 8))
    assert clocks["head"][0].per_call == [((8 * 2 + 2) * 4, 48)]
    assert clocks["head"][0].layers == [head]

