"""ShapeTraces: one proven TorchScript trace per input shape, eager wherever a trace could be
wrong (autograd, hooks, value-dependent operations, too many shapes, a failed trace)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from mizuoto.runtime.shape_traces import MethodCall, ShapeTraces


class Block(nn.Module):
    """A few small operations around a product, counting its eager calls."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.eager_calls = 0

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        self.eager_calls += 1
        return self.norm(torch.nn.functional.silu(self.linear(x)) * scale + x)


class SizeBranch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.size(0) > 2 else x * 3


class ValueBranch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if bool(x.sum() > 0) else x * 3


class Owner(nn.Module):
    """A block under a module whose method (not ``forward``) is traced."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def body(self, x: torch.Tensor, scale: torch.Tensor, *, twice: bool = False
             ) -> torch.Tensor:
        out = self.block(x, scale)
        return out * 2 if twice else out


def _inputs(rows: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 8, generator=generator), torch.rand(rows, 1, generator=generator)


@torch.inference_mode()
def test_each_shape_is_traced_once_proven_and_then_replayed_bit_for_bit():
    block = Block()
    traces = ShapeTraces(block, name="block")
    first = traces(*_inputs(3))
    assert traces.traced == 1 and traces.eager_shapes == {}
    calls = block.eager_calls
    for seed in (2, 3, 4):  # other values, same shape: the trace, not the module's forward
        inputs = _inputs(3, seed)
        assert torch.equal(traces(*inputs), block(*inputs))
    assert block.eager_calls == calls + 3  # only the comparisons above called it
    assert torch.equal(first, block(*_inputs(3)))
    traces(*_inputs(5))  # a new shape: a second trace
    assert traces.traced == 2


def test_autograd_and_hooks_run_the_module_eagerly():
    block = Block()
    traces = ShapeTraces(block, name="block")
    out = traces(*_inputs(3))
    assert out.requires_grad and traces.traced == 0  # grad enabled: never traced
    seen = []
    handle = block.linear.register_forward_hook(lambda *args: seen.append(1))
    with torch.inference_mode():
        traces(*_inputs(3))
        assert traces.traced == 0 and seen == [1]  # a hook inside: eager, so it runs
        handle.remove()
        traces(*_inputs(3))
        traces(*_inputs(3))
        assert traces.traced == 1 and seen == [1]
        # a global hook (torch's, on every module) too
        handle = nn.modules.module.register_module_forward_hook(
            lambda *args: seen.append(2))
        try:
            traces(*_inputs(3))
        finally:
            handle.remove()
        assert seen.count(2) == 3  # the block, its linear and its norm ran eagerly


@torch.inference_mode()
def test_calls_run_eager_for_hooks_are_counted_per_traces_found_under_the_modules():
    """A profile's count of hooked (eager) calls reads the traces its modules hold, so two
    engines in one process do not mix; a module not holding traces counts nothing."""
    from mizuoto.runtime.shape_traces import calls_run_eager_for_hooks

    mine, theirs = Owner(), Owner()
    for owner in (mine, theirs):
        owner.shape_traces = ShapeTraces.of_method(owner, "body", name="body")
    handle = mine.block.register_forward_hook(lambda *args: None)
    try:
        mine.shape_traces(*_inputs(3))
        mine.shape_traces(*_inputs(3))
        theirs.shape_traces(*_inputs(3))  # no hook: traced
    finally:
        handle.remove()
    assert calls_run_eager_for_hooks([mine]) == {"body": 2}
    assert calls_run_eager_for_hooks([theirs]) == {"body": 0}
    assert calls_run_eager_for_hooks([Block(), "not a module"]) == {}


@torch.inference_mode()
def test_a_module_that_branches_on_values_stays_eager_and_says_why(caplog):
    traces = ShapeTraces(ValueBranch(), name="branchy")
    positive = torch.ones(4)
    with caplog.at_level(logging.INFO, logger="mizuoto.runtime.shape_traces"):
        assert torch.equal(traces(positive), positive * 2)
    assert traces.traced == 0
    (reason,) = traces.eager_shapes.values()
    assert "depends on input values" in reason and "branchy" in caplog.text
    assert torch.equal(traces(-positive), -positive * 3)  # the other branch, still right


@torch.inference_mode()
def test_a_branch_on_a_size_is_traced_per_shape():
    """The tracer warns for it too; the shape key makes it safe, and the second sample of
    values shows it: each shape its own trace, each right."""
    traces = ShapeTraces(SizeBranch(), name="sizes")
    for rows, factor in ((4, 2), (2, 3), (4, 2), (2, 3)):
        x = torch.randn(rows)
        assert torch.equal(traces(x), x * factor)
    assert traces.traced == 2 and traces.eager_shapes == {}


@torch.inference_mode()
def test_past_max_shapes_new_shapes_run_eager():
    traces = ShapeTraces(Block(), name="block", max_shapes=2)
    for rows in (1, 2, 3, 4):
        inputs = _inputs(rows)
        assert torch.equal(traces(*inputs), traces.module(*inputs))
    assert traces.traced == 2
    assert set(traces.eager_shapes.values()) == {"more than 2 shapes"}


@torch.inference_mode()
def test_the_proof_runs_a_trace_up_to_its_optimized_graph_each_run_compared(monkeypatch):
    """TorchScript profiles a trace's first run and optimizes on the next (both slow): the
    proof makes those runs, each against eager, so later calls replay the proven graph."""
    runs, real_trace = [], torch.jit.trace
    profiled = torch._C._jit_get_num_profiled_runs()

    class Counted(nn.Module):
        def __init__(self, trace: nn.Module) -> None:
            super().__init__()
            self.trace = trace

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            runs.append(1)
            out = self.trace(*inputs)
            # the optimized graph differs from eager: its proof fails, the shape stays eager
            return out + 1 if len(runs) > profiled and wrong else out

    monkeypatch.setattr(torch.jit, "trace", lambda *a, **k: Counted(real_trace(*a, **k)))
    for wrong in (False, True):
        runs.clear()
        traces = ShapeTraces(Block(), name="block")
        traces(*_inputs(3))
        assert len(runs) == profiled + 1
        assert traces.traced == (0 if wrong else 1)
        assert list(traces.eager_shapes.values()) == (
            ["the trace's output (or what it wrote) differs from the eager call's"]
            if wrong else [])


@torch.inference_mode()
def test_a_failed_trace_leaves_the_shape_eager(monkeypatch):
    def broken_trace(*args, **kwargs):
        raise RuntimeError("no tracer here")

    monkeypatch.setattr(torch.jit, "trace", broken_trace)
    block = Block()
    traces = ShapeTraces(block, name="block")
    inputs = _inputs(3)
    assert torch.equal(traces(*inputs), block(*inputs))
    assert traces.traced == 0
    (reason,) = traces.eager_shapes.values()
    assert reason == "tracing failed: RuntimeError: no tracer here"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_dtypes_are_separate_shapes(dtype):
    block = Block().to(dtype)
    traces = ShapeTraces(block, name="block")
    x, scale = (t.to(dtype) for t in _inputs(3))
    assert torch.equal(traces(x, scale), block(x, scale))
    assert torch.equal(traces(x, scale), block(x, scale))
    assert traces.traced == 1


@torch.inference_mode()
def test_of_method_traces_a_method_with_fixed_keywords():
    owner = Owner()
    traces = ShapeTraces.of_method(owner, "body", name="owner", twice=True)
    inputs = _inputs(3)
    assert torch.equal(traces(*inputs), owner.body(*inputs, twice=True))
    assert torch.equal(traces(*_inputs(3, 9)), owner.body(*_inputs(3, 9), twice=True))
    assert traces.traced == 1
    # the call is not registered under its owner (no cycle in the module tree)
    assert not any(isinstance(m, MethodCall) for m in owner.modules())


@torch.inference_mode()
def test_keyword_options_at_the_call_get_their_own_traces():
    """Options that change the operations (a flag) are part of the key, like a shape; an
    option given at its default keys as if unset (the same operations, one trace)."""
    owner = Owner()
    traces = ShapeTraces.of_method(owner, "body", name="owner")
    for seed in (1, 2):
        inputs = _inputs(3, seed)
        for twice in (False, True):
            assert torch.equal(traces(*inputs, twice=twice), owner.body(*inputs, twice=twice))
    assert torch.equal(traces(*_inputs(3)), owner.body(*_inputs(3)))
    assert traces.traced == 2  # False (also unset) and True
    assert torch.equal(traces(*_inputs(4)), owner.body(*_inputs(4)))
    assert torch.equal(traces(*_inputs(4, 5), twice=False), owner.body(*_inputs(4, 5)))
    assert traces.traced == 3  # a new shape: unset, then False replays its trace


class Writer(nn.Module):
    """Writes ``x`` into ``buffer`` at ``position`` and advances it (a decode step's cache)."""

    def forward(self, x: torch.Tensor, buffer: torch.Tensor, position: torch.Tensor
                ) -> torch.Tensor:
        buffer.index_copy_(0, position, x)
        position.add_(1)
        return buffer.sum(dim=0)


@torch.inference_mode()
def test_a_module_writing_into_its_inputs_writes_once_per_call_traced_or_not():
    """The proof's tracing and trial runs work on copies (strides kept: a view into a larger
    buffer stays one): the real inputs change exactly as one eager call changes them."""
    traces = ShapeTraces(Writer(), name="writer")
    storage = torch.zeros(6, 3)
    buffer, position = storage[:4], torch.tensor([0])
    expected_storage, expected_position = storage.clone(), position.clone()
    for step in range(4):
        x = torch.full((1, 3), float(step + 1))
        out = traces(x, buffer, position)
        Writer()(x, expected_storage[:4], expected_position)
        assert torch.equal(out, expected_storage[:4].sum(dim=0))
        assert torch.equal(storage, expected_storage) and torch.equal(position,
                                                                      expected_position)
    assert traces.traced == 1 and int(position) == 4
    assert storage[4:].abs().sum() == 0


class AttendFilled(nn.Module):
    """One query against a view of a buffer's filled rows (a decode step's cache): the view
    grows by a row per call, its strides stay the buffer's. ``length_as_constant``: the row
    count enters as a Python float, which the tracer keeps as a constant."""

    def __init__(self, length_as_constant: bool = False) -> None:
        super().__init__()
        self.length_as_constant = length_as_constant
        self.eager_calls = 0

    def forward(self, query: torch.Tensor, filled: torch.Tensor) -> torch.Tensor:
        self.eager_calls += 1
        weights = torch.softmax(filled @ query, dim=0)
        out = weights @ filled
        if self.length_as_constant:
            out = out / float(len(filled))
        return out


@torch.inference_mode()
def test_a_varying_size_is_served_by_one_trace_confirmed_at_a_second_size():
    """``varying``: one trace for every length of the filled view; proven where it was
    traced, compared once more at the next length, then replayed alone."""
    module = AttendFilled()
    traces = ShapeTraces(module, name="attend", varying={1: 0})
    generator = torch.Generator().manual_seed(3)
    buffer = torch.randn(32, 8, generator=generator)
    query = torch.randn(8, generator=generator)
    eager_calls = []
    for length in range(3, 20):
        expected = module(query, buffer[:length])
        before = module.eager_calls
        assert torch.equal(traces(query, buffer[:length]), expected)
        eager_calls.append(module.eager_calls - before)
        assert traces.awaiting_confirmation == (length == 3)
    assert traces.traced == 1 and traces.eager_shapes == {}
    # the first length: the eager call and the tracing run; the next: the confirming call
    assert eager_calls[:2] == [2, 1] and set(eager_calls[2:]) == {0}
    # without ``varying`` each length is its own shape
    plain = ShapeTraces(AttendFilled(), name="attend")
    for length in (3, 4, 5):
        plain(query, buffer[:length])
    assert plain.traced == 3


@torch.inference_mode()
def test_a_trace_keeping_a_varying_size_as_a_constant_is_refused_at_the_next_size(caplog):
    module = AttendFilled(length_as_constant=True)
    traces = ShapeTraces(module, name="constant length", varying={1: 0})
    buffer = torch.randn(32, 8, generator=torch.Generator().manual_seed(4))
    query = buffer[0].clone()
    with caplog.at_level(logging.INFO, logger="mizuoto.runtime.shape_traces"):
        for length in range(3, 8):
            assert torch.equal(traces(query, buffer[:length]), module(query, buffer[:length]))
    assert traces.traced == 0
    (reason,) = traces.eager_shapes.values()
    assert "made at varying size (3,) differs from the eager call at (4,)" in reason
    assert "constant length" in caplog.text
