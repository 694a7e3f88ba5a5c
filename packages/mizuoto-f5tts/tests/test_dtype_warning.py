"""A reduced precision asked for on a CPU without native kernels for it is reported, with the
faster setting (auto is float32 on the CPU, as upstream: nothing to report)."""

from __future__ import annotations

import pytest
import torch

from mizuoto import Options, SynthesisRequest
from mizuoto.runtime import device
from mizuoto_f5tts.engine import F5Engine
from mizuoto_f5tts.fixtures import write_random_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_random_model_dir(tmp_path_factory.mktemp("f5") / "v1", "v1_base", size="tiny")


@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])
def test_emulated_reduced_precision_is_reported(monkeypatch, model_dir, dtype):
    monkeypatch.setattr(device, "cpu_native_dtype", lambda d: d == torch.float32)
    engine = F5Engine.load(model_dir, options=Options.from_mapping(
        {"compute": {"device": "cpu", "dtype": dtype}}))
    result = engine.synthesize(SynthesisRequest("Hello there.", seed=1, steps=2))
    hints = [w for w in result.applied.warnings if "compute.dtype=float32" in w]
    if dtype == "auto":
        assert engine.info.dtype == "float32" and not hints
    else:
        assert engine.info.dtype == "bfloat16" and len(hints) == 1
        assert "bfloat16 is emulated" in hints[0]
        assert "engines.f5tts.fast=int8 (not exact" in hints[0]
