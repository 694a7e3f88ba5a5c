"""``compute.compile``'s helper: compiling in place, the eager fallback and what it records.

Backends here are dynamo's ``eager`` (graph capture, same kernels) or one that fails on
purpose: an inductor compile takes tens of seconds even for a small layer on two cores.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mizuoto.runtime import compile as compile_
from mizuoto.runtime.compile import Compilation, compile_module, maybe_compile


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Dynamo caches compiled frames per code object: a graph compiled by one test would serve
    the next one's calls and hide its backend."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _failing_backend(graph_module, example_inputs):
    raise RuntimeError("no compiler here")


def test_maybe_compile_disabled_and_eager_backend():
    def double(x):
        return x * 2

    assert maybe_compile(double, False) == (double, None)
    compiled, note = maybe_compile(double, True, backend="eager")
    assert note is None
    x = torch.arange(5.0)
    assert torch.equal(compiled(x), x * 2)
    assert compiled.compile_fallback_note is None


def test_maybe_compile_falls_back_to_eager(caplog):
    layer = nn.Linear(4, 3)
    keys = list(layer.state_dict())
    x = torch.randn(2, 4)
    expected = layer(x)
    compiled, note = maybe_compile(layer, True, backend=_failing_backend)
    assert compiled is layer and note is None
    with caplog.at_level("WARNING"):
        assert torch.equal(compiled(x), expected)
    assert "no compiler here" in layer.compile_fallback_note
    assert "running eagerly" in caplog.text
    assert torch.equal(compiled(x), expected)  # stays eager
    assert list(layer.state_dict()) == keys


def test_maybe_compile_raises_genuine_errors():
    compiled, _ = maybe_compile(nn.Linear(4, 3), True, backend=_failing_backend)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        compiled(torch.randn(2, 5))


def test_compilation_reports_compiled_then_the_fallback(monkeypatch):
    monkeypatch.setattr(compile_, "BACKEND", _failing_backend)  # the default backend
    layer = nn.Linear(4, 3)
    compilation = compile_module(layer, True)
    assert compilation.active and compilation.fallbacks == ()
    layer(torch.randn(2, 4))
    assert not compilation.active
    assert compilation.fallbacks == (layer.compile_fallback_note,)
    assert "RuntimeError: no compiler here" in compilation.note
    assert "\n" not in compilation.note


def test_compilation_not_requested():
    layer = nn.Linear(4, 3)
    forward = layer.forward
    compilation = compile_module(layer, False)
    assert compilation == Compilation(False)
    assert not compilation.active and compilation.note is None and compilation.fallbacks == ()
    assert layer.forward == forward and "forward" not in vars(layer)


def test_a_missing_cpp_compiler_keeps_the_module_eager(monkeypatch):
    """Inductor on the CPU needs a C++ compiler; without one the module is never wrapped and
    the note says what to install (found at load, not after tracing the first call)."""
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config.cpp, "cxx", ("/nonexistent/g++",))
    layer = nn.Linear(4, 3)
    compilation = compile_module(layer, True, backend="inductor")
    assert not compilation.active
    assert "No working C++ compiler" in compilation.note and "install g++" in compilation.note
    assert "forward" not in vars(layer)
    x = torch.randn(2, 4)
    assert torch.equal(layer(x), nn.functional.linear(x, layer.weight, layer.bias))


def test_hitting_the_recompile_limit_is_a_recorded_fallback(monkeypatch):
    """Past dynamo's recompile limit a function would silently run eagerly; here it is a
    fallback with a note, so a result never claims compiled code it did not run."""
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    layer = nn.Linear(4, 3)
    compilation = compile_module(layer, True, backend="eager", dynamic=False)
    layer(torch.randn(2, 4))
    assert compilation.active
    layer.double()  # a new dtype: a recompilation, over the limit of one
    out = layer(torch.randn(2, 4, dtype=torch.float64))
    assert out.dtype == torch.float64
    assert not compilation.active and "recompile_limit" in compilation.note
