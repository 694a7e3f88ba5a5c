"""mizuoto.runtime.dynamic_int8: the int8 fast profiles' layers, quantized where asked and
refused, naming the option, where this torch has no int8 kernels."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from mizuoto.errors import InvalidOption
from mizuoto.runtime import dynamic_int8


def _float_linears(module: nn.Module) -> int:
    return sum(type(m) is nn.Linear for m in module.modules())


def test_this_torch_runs_dynamic_int8():
    assert dynamic_int8.dynamic_int8_unavailable() is None
    dynamic_int8.require_dynamic_int8("engines.x.fast")


def test_every_linear_inside_the_roots_is_quantized_silently_and_counted():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Sequential(nn.Linear(32, 16)))
    kept = nn.Sequential(nn.Linear(16, 16))
    bare = nn.Linear(16, 16)  # a bare root: quantize_dynamic replaces children only
    x = torch.randn(3, 16)
    with torch.no_grad():
        before = block(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.ao's deprecation warnings stay inside
        count = dynamic_int8.quantize_linears([block, bare])
    assert count == 2
    assert _float_linears(block) == 0
    assert _float_linears(kept) == 1 and type(bare) is nn.Linear
    with torch.no_grad():
        after = block(x)
    assert not torch.equal(after, before)
    assert (after - before).norm() < 0.1 * before.norm()  # int8, not another function


def test_a_torch_without_int8_kernels_is_refused_naming_the_option(monkeypatch):
    monkeypatch.setattr(dynamic_int8, "dynamic_int8_unavailable",
                        lambda: "this torch has no int8 kernel for this CPU")
    with pytest.raises(InvalidOption, match="engines.foo.fast") as error:
        dynamic_int8.require_dynamic_int8("engines.foo.fast")
    assert "no int8 kernel" in str(error.value) and "engines.foo.fast=off" in str(error.value)


def test_a_failing_trial_gives_the_reason(monkeypatch):
    import torch.ao.quantization as quantization

    def broken(*args, **kwargs):
        raise RuntimeError("Didn't find engine for operation quantized::linear_prepack NoQEngine")

    monkeypatch.setattr(quantization, "quantize_dynamic", broken)
    dynamic_int8.dynamic_int8_unavailable.cache_clear()
    try:
        reason = dynamic_int8.dynamic_int8_unavailable()
    finally:
        dynamic_int8.dynamic_int8_unavailable.cache_clear()
    assert reason is not None and "NoQEngine" in reason and "quantized engines" in reason
