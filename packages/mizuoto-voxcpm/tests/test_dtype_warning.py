"""bfloat16 on a CPU without native bfloat16 kernels: the applied record says so and names the
faster setting (no upstream needed)."""

from __future__ import annotations

import pytest
import torch

from mizuoto import Options, SynthesisRequest
from mizuoto.runtime import bf16_dot, device
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import write_random_model

FAST = {"max_len": 3, "inference_timesteps": 2, "retry_badcase": False}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("models") / "v1", "voxcpm-0.5b")


@pytest.mark.parametrize("native", [False, True])
def test_emulated_bfloat16_is_reported(monkeypatch, model_dir, native):
    monkeypatch.setattr(device, "cpu_native_dtype",
                        lambda dtype: native or dtype == torch.float32)
    monkeypatch.setattr(bf16_dot, "runs", lambda: False)  # a CPU or machine without the kernel
    engine = VoxCPMEngine.load(model_dir, options=Options.from_mapping(
        {"compute": {"device": "cpu"}}))
    assert engine.info.dtype == "bfloat16"  # auto stays the config's dtype, as upstream
    request = SynthesisRequest("hello", seed=1, params=FAST)
    applied = engine.synthesize(request).applied
    streamed = list(engine.stream(request))[-1].applied
    hint = [w for w in applied.warnings if "engines.voxcpm.dtype=float32" in w]
    assert len(hint) == (0 if native else 1)
    assert [w for w in streamed.warnings if "engines.voxcpm.dtype=float32" in w] == hint
    if hint:
        assert "bfloat16 is emulated" in hint[0] and "1.6x to 2.7x" in hint[0]
        # and the inexact profile that is fastest on such a CPU, named as not exact
        assert "engines.voxcpm.fast=int8 (not exact" in hint[0]


def test_nothing_to_say_where_the_bf16dot_kernel_runs_the_linear_layers(monkeypatch, model_dir):
    """There bfloat16 is faster than float32: advising float32 would be wrong; with
    compute.prepack=off the advice stands."""
    monkeypatch.setattr(device, "cpu_native_dtype", lambda dtype: dtype == torch.float32)
    monkeypatch.setattr(bf16_dot, "runs", lambda: True)
    for prepack, warned in (("auto", False), ("off", True)):
        engine = VoxCPMEngine.load(model_dir, options=Options.from_mapping(
            {"compute": {"device": "cpu", "prepack": prepack}}))
        applied = engine.synthesize(SynthesisRequest("hello", seed=1, params=FAST)).applied
        assert any("bfloat16 is emulated" in w for w in applied.warnings) == warned


def test_float32_is_not_reported(monkeypatch, model_dir):
    monkeypatch.setattr(device, "cpu_native_dtype", lambda dtype: dtype == torch.float32)
    engine = VoxCPMEngine.load(model_dir, options=Options.from_mapping(
        {"compute": {"device": "cpu"}, "engines": {"voxcpm": {"dtype": "float32"}}}))
    applied = engine.synthesize(SynthesisRequest("hello", seed=1, params=FAST)).applied
    assert not any("emulated" in w for w in applied.warnings)
