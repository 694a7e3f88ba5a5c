"""``compute.compile`` on VoxCPM: the local DiT compiled, reported as compiled, and still right
after a LoRA is attached, swapped, refilled in place or removed; the eager fallback recorded.
``compute.compile=false`` stays bit-exact with upstream (the parity tests run with it off).

The DiT is compiled by dynamo's ``eager`` backend here: the graph capture, its guards (which
must notice the LoRA layers) and the guarded call are the real ones, and the captured ops run
one by one with the same kernels, so the audio is identical. Inductor (what
``compute.compile`` uses) is measured by the benchmark (docs/performance.md, torch.compile).
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import mizuoto
from mizuoto.runtime import compile as compile_
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import write_random_lora, write_random_model

REQUEST = mizuoto.SynthesisRequest("Hello world, this is a test.", seed=3,
                                   params={"max_len": 3, "retry_badcase": False,
                                           "inference_timesteps": 3})


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("compile")
    model = write_random_model(root / "model", "voxcpm2", seed=4, dtype="float32")
    loras = {
        "a": write_random_lora(root / "a", model, seed=1),
        "a2": write_random_lora(root / "a2", model, seed=5),  # a's config: copied in place
    }
    return model, loras


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Compiled frames are cached per code object (every local DiT shares one): each test
    compiles with its own backend."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _load(model, compile: bool) -> VoxCPMEngine:
    return VoxCPMEngine.load(model, options=mizuoto.Options.from_mapping(
        {"compute.device": "cpu", "compute.compile": compile}))


def _failing_backend(graph_module, example_inputs):
    raise RuntimeError("no C++ toolchain in this test")


def test_compiled_dit_follows_lora_changes(setup, monkeypatch):
    model, loras = setup
    monkeypatch.setattr(compile_, "BACKEND", "eager")
    eager, compiled = _load(model, False), _load(model, True)
    for lora in (None, "a", "a2", None):
        path = None if lora is None else loras[lora]
        eager.set_lora(path)
        compiled.set_lora(path)
        expected = eager.synthesize(REQUEST)
        result = compiled.synthesize(REQUEST)
        assert torch.equal(result.audio.samples, expected.audio.samples), lora
        assert result.applied.compute["compile"] is True and result.applied.fallbacks == ()
        assert expected.applied.compute["compile"] is False
    assert counters["stats"]["unique_graphs"] > 0  # the DiT did run through dynamo
    *_, last = compiled.stream(REQUEST)
    assert last.applied.compute["compile"] is True


def test_a_failing_compile_falls_back_to_eager_and_says_so(setup, monkeypatch):
    model, _ = setup
    monkeypatch.setattr(compile_, "BACKEND", _failing_backend)
    expected = _load(model, False).synthesize(REQUEST).audio.samples
    compiled = _load(model, True)
    for _ in range(2):  # the fallback is for good, and every later result says so
        result = compiled.synthesize(REQUEST)
        assert torch.equal(result.audio.samples, expected)
        assert result.applied.compute["compile"] is False
        (note,) = result.applied.fallbacks
        assert "torch.compile failed, running eagerly" in note and "no C++ toolchain" in note
