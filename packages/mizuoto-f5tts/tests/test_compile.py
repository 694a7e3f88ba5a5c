"""``compute.compile`` on F5-TTS: the backbone compiled, its results reported as compiled, the
eager fallback recorded. ``compute.compile=false`` stays bit-exact with upstream (the parity
tests run with it off).

In CI the backbone is compiled by dynamo's ``eager`` backend: the graph capture and the
guarded call are the real ones, and the captured ops run one by one with the same kernels, so
the audio is identical. Inductor (what ``compute.compile`` uses) takes tens of seconds even for
the tiny model on two cores: its test is marked ``realsize``.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch._dynamo.utils import counters

import mizuoto
from mizuoto import EditRequest, SynthesisRequest
from mizuoto.runtime import compile as compile_
from mizuoto_f5tts import F5Engine

TEXT = "Hello there, this is a test."


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Compiled frames are cached per code object (every DiT shares one): each test compiles
    with its own backend."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _load(model_dir, *, compile: bool = True) -> F5Engine:
    options = mizuoto.Options.from_mapping({"compute.device": "cpu", "compute.cpu_threads": 1,
                                            "compute.compile": compile})
    return F5Engine.load(model_dir, options=options)


def _request(ref, text=TEXT, **fields):
    return SynthesisRequest(text, reference=ref, seed=5, steps=4, **fields)


def _failing_backend(graph_module, example_inputs):
    raise RuntimeError("no C++ toolchain in this test")


def test_compiled_backbone_gives_eager_audio_and_says_compiled(engine, model_dir, ref,
                                                              monkeypatch):
    monkeypatch.setattr(compile_, "BACKEND", "eager")
    compiled = _load(model_dir)
    for text in (TEXT, "A longer line, so that the frames and the tokens change size."):
        expected = engine.synthesize(_request(ref, text))
        result = compiled.synthesize(_request(ref, text))
        assert torch.equal(result.audio.samples, expected.audio.samples)
        assert result.applied.compute["compile"] is True and result.applied.fallbacks == ()
        assert expected.applied.compute["compile"] is False
    assert counters["stats"]["unique_graphs"] > 0  # the backbone did run through dynamo
    edit = EditRequest(ref, "A long reference line.", [(0.3, 0.6)], seed=2, steps=4)
    assert torch.equal(compiled.edit(edit).audio.samples, engine.edit(edit).audio.samples)


def test_a_failing_compile_falls_back_to_eager_and_says_so(engine, model_dir, ref,
                                                           monkeypatch):
    monkeypatch.setattr(compile_, "BACKEND", _failing_backend)
    compiled = _load(model_dir)
    expected = engine.synthesize(_request(ref)).audio.samples
    for _ in range(2):  # the fallback is for good, and every later result says so
        result = compiled.synthesize(_request(ref))
        assert torch.equal(result.audio.samples, expected)
        assert result.applied.compute["compile"] is False
        (note,) = result.applied.fallbacks
        assert "torch.compile failed, running eagerly" in note and "no C++ toolchain" in note


def test_compile_off_leaves_the_backbone_alone(model_dir):
    plain = _load(model_dir, compile=False)
    assert "forward" not in vars(plain.model.transformer)


@pytest.mark.realsize  # an inductor compile: ~45 s on two shared cores
def test_inductor_audio_is_close_to_eager(engine, model_dir, ref):
    """Inductor fuses the backbone's ops into C++ kernels that sum in another order, so each
    step differs from eager in the last bits; the Euler steps and the vocoder carry that into
    the audio. Measured on this tiny model: max |diff| 1e-7. Allowed: 1e-4 (-80 dBFS), and a
    signal-to-difference ratio over 60 dB."""
    compiled = _load(model_dir)
    expected = engine.synthesize(_request(ref)).audio.samples
    result = compiled.synthesize(_request(ref))
    assert result.applied.compute["compile"] is True and result.applied.fallbacks == ()
    diff = result.audio.samples - expected
    assert float(diff.abs().max()) < 1e-4
    snr = 10 * math.log10(float(expected.pow(2).sum()) / max(float(diff.pow(2).sum()), 1e-30))
    assert snr > 60
