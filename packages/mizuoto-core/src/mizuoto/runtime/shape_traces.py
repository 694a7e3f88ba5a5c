"""A module's inference calls replayed as TorchScript traces, one per input shape.

A trace runs the same aten operations in the same order as the eager call, without the Python
between them (module calls, attribute lookups, flags). That pays where an evaluation is many
small operations around a few products at a fixed shape: a fast profile's VoxCPM local DiT
evaluation (10 rows, some 500 operations) runs in 0.76 of its eager time on two AVX2 cores,
bit for bit (``benchmarks/cpu/shape_traces.py``).

Each shape is traced on its first call and proven there: the trace's output must equal the
eager call's (``torch.equal``) on each run up to the graph TorchScript optimizes and then
keeps (the second: those runs are slow, and made then, not in a later call), or that shape
stays eager, with the reason logged and kept in
:attr:`ShapeTraces.eager_shapes`. Where the tracer warns that a tensor became a Python
constant (a branch on a size, which the shape key makes safe, or on data, which it does
not), the trace must also equal the eager call on other values of that shape. That check is
a sample, not a proof: a module qualifies whose operations depend on its inputs' shapes,
dtypes and devices only, not their values. Calls run eager, untraced, where a trace would be
wrong or unproven: with autograd enabled, while a Python hook is registered on the module or
inside it (a profile's counters: a trace skips hooks), past ``max_shapes`` shapes, and
everywhere when torch has no ``torch.jit.trace``. A trace reads the module's parameters where
they live (in-place changes show) but keeps other tensors it met, such as packed weights, as
constants: build the traces after any rewrite of the layers.

A size that changes from call to call without changing the operations (a decode step's view
of a cache's filled positions, one longer each step) can be named ``varying``: one trace then
serves every size of it. It is proven as above at the size it was traced at, and confirmed
against the eager call at the first call of another size (a size the tracer kept as a
constant, such as a slice's end, shows there); until then other sizes run through that check.

``torch.jit.trace`` is deprecated in torch 2.x in favour of ``torch.compile`` and
``torch.export``; on two CPU cores the compiler costs minutes at load and neither captures
fbgemm's packed int8 matrix without a custom op (see docs/performance.md's levers), so this
uses the tracer, hiding its deprecation warning, until torch removes it.
"""

from __future__ import annotations

import collections
import inspect
import logging
import threading
import warnings
from collections.abc import Hashable, Iterable, Mapping

import torch
from torch import nn

logger = logging.getLogger(__name__)

#: beyond this many shapes, new ones run eager (a trace holds its graph: bounded memory)
MAX_SHAPES = 64


def calls_run_eager_for_hooks(modules: Iterable[nn.Module]) -> dict[str, int]:
    """Per trace name, how many calls of the traces that ``modules`` (or modules under them)
    hold have run eager (untraced) because a Python hook sat on the module or inside it: a
    profile's clocks are hooks, so what it timed is then not what a plain request runs.
    Counted per :class:`ShapeTraces`, so two engines in one process keep apart; compare
    two snapshots around a block."""
    counts: collections.Counter[str] = collections.Counter()
    seen: set[int] = set()
    for module in modules:
        if not isinstance(module, nn.Module):
            continue
        for inner in module.modules():
            for value in vars(inner).values():
                if isinstance(value, ShapeTraces) and id(value) not in seen:
                    seen.add(id(value))
                    counts[value.name] += value.eager_for_hooks
    return dict(counts)


_NO_DEFAULT = object()


def _shape_key(inputs: tuple[torch.Tensor, ...], static: dict[str, Hashable],
               defaults: dict[str, object], varying: dict[int, int]) -> Hashable:
    # an option given at its default keys as if unset: one trace for the same operations
    options = tuple(sorted((name, value) for name, value in static.items()
                           if not _is_default(value, defaults.get(name, _NO_DEFAULT))))
    return (tuple((_shape(t, varying.get(index)), t.stride(), t.dtype, t.device)
                  for index, t in enumerate(inputs)), options)


def _shape(tensor: torch.Tensor, varying_dim: int | None) -> tuple[int | None, ...]:
    shape = list(tensor.shape)
    if varying_dim is not None:
        shape[varying_dim] = None  # any size: one trace serves them all
    return tuple(shape)


def _varying_sizes(inputs: tuple[torch.Tensor, ...], varying: dict[int, int]
                   ) -> tuple[int, ...]:
    return tuple(inputs[index].size(dim) for index, dim in sorted(varying.items()))


def _is_default(value: object, default: object) -> bool:
    return value is default or (type(value) is type(default) and value == default)


def _keyword_defaults(module: nn.Module) -> dict[str, object]:
    """The defaults of the options ``module``'s call takes by keyword (for a
    :class:`MethodCall`, its method's, less the fixed ones)."""
    if isinstance(module, MethodCall):
        target, fixed = getattr(module.owner, module.method), module.fixed
    else:
        target, fixed = module.forward, {}
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # no signature to read: options key as given
        return {}
    return {p.name: p.default for p in parameters if p.default is not p.empty
            and p.name not in fixed
            and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


class MethodCall(nn.Module):
    """``owner.<method>(*tensors, **fixed)`` as a module of tensors only (what the tracer
    takes), for a module whose ``forward`` dispatches to its traces and whose eager body is
    that method. Not registered under ``owner``: the modules stay the owner's."""

    def __init__(self, owner: nn.Module, method: str, **fixed: object) -> None:
        super().__init__()
        self.owner = owner
        self.method = method
        self.fixed = fixed

    def forward(self, *inputs: torch.Tensor, **static: object) -> torch.Tensor:
        return getattr(self.owner, self.method)(*inputs, **self.fixed, **static)


class ShapeTraces:
    """Calls ``module`` (whose ``forward`` takes tensors, plus keyword options that change
    its operations, and returns one tensor) through a proven trace of its input shapes where
    one exists; see the module docstring. Each value of the keyword options (hashable, such
    as a flag) gets its own traces. :meth:`of_method` builds one for a method of a module.

    ``varying``: input index -> a dimension of that input whose size may differ from call to
    call with the same operations (see the module docstring); its inputs must keep their
    strides as it changes (a view into a fixed buffer), or each size keys apart."""

    def __init__(self, module: nn.Module, *, name: str, max_shapes: int = MAX_SHAPES,
                 varying: Mapping[int, int] | None = None) -> None:
        self.module = module
        self.name = name
        self.max_shapes = max_shapes
        self.varying = dict(varying or {})
        self._traces: dict[Hashable, nn.Module] = {}
        #: shape key -> the varying sizes its trace was proven at, until another size
        #: confirms it (:meth:`_confirm`)
        self._unconfirmed: dict[Hashable, tuple[int, ...]] = {}
        #: shape key -> why that shape runs eager (a failed or unequal trace)
        self.eager_shapes: dict[Hashable, str] = {}
        self._defaults = _keyword_defaults(module)
        #: calls run eager because a hook was registered (:func:`calls_run_eager_for_hooks`)
        self.eager_for_hooks = 0
        # a trace runs no Python hook: calls go eager while one is registered (the dicts are
        # gathered once; a hook is added into them, so a check is one pass over the list)
        self._hook_dicts = [hooks for m in module.modules()
                            for hooks in (m._forward_hooks, m._forward_pre_hooks)]
        self._hook_dicts += [getattr(nn.modules.module, name, {}) for name in (
            "_global_forward_hooks", "_global_forward_pre_hooks")]  # torch's, on every module
        self._lock = threading.Lock()

    @classmethod
    def of_method(cls, owner: nn.Module, method: str, *, name: str,
                  varying: Mapping[int, int] | None = None, **fixed: object) -> ShapeTraces:
        """Traces of ``owner.<method>(*tensors, **fixed)``."""
        return cls(MethodCall(owner, method, **fixed), name=name, varying=varying)

    @property
    def traced(self) -> int:
        """How many input shapes replay a proven trace."""
        return len(self._traces)

    @property
    def awaiting_confirmation(self) -> int:
        """How many of those traces still wait for a second varying size (``varying``)."""
        return len(self._unconfirmed)

    def __call__(self, *inputs: torch.Tensor, **static: Hashable) -> torch.Tensor:
        if torch.is_grad_enabled():
            return self.module(*inputs, **static)
        if any(self._hook_dicts):
            self.eager_for_hooks += 1
            return self.module(*inputs, **static)
        key = _shape_key(inputs, static, self._defaults, self.varying)
        trace = self._traces.get(key)
        if trace is not None:
            # .get: another thread may confirm (pop) it meanwhile; _confirm checks again
            proven_at = self._unconfirmed.get(key) if self._unconfirmed else None
            if proven_at is not None and proven_at != _varying_sizes(inputs, self.varying):
                with self._lock:
                    return self._confirm(key, inputs, static)
            return trace(*inputs)
        if key in self.eager_shapes or not hasattr(torch.jit, "trace"):
            return self.module(*inputs, **static)
        with self._lock:
            return self._trace_and_prove(key, inputs, static)

    def _trace_and_prove(self, key: Hashable, inputs: tuple[torch.Tensor, ...],
                         static: dict[str, Hashable]) -> torch.Tensor:
        eager = MethodCall(self.module, "forward", **static) if static else self.module
        if key in self._traces or key in self.eager_shapes:  # another thread did meanwhile
            return eager(*inputs)
        if len(self._traces) >= self.max_shapes:
            self.eager_shapes[key] = f"more than {self.max_shapes} shapes"
            return eager(*inputs)
        # the tracing run and each trial replay get copies of the inputs as they were: a
        # module may write into them (a decode step's cache and position), which the real
        # call does once
        pristine = _copies(inputs)
        expected = eager(*inputs)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")  # kept here: the tracer's deprecation too
                trace = torch.jit.trace(eager, _copies(pristine), check_trace=False)
                # every run up to the optimized graph the later calls replay, each on fresh
                # copies made in turn (a decode step's are its cache: one at a time)
                replayed = all(_replays(trace, pristine, inputs, expected)
                               for _ in range(_runs_until_optimized()))
        except Exception as exc:  # any tracer failure means: stay eager
            reason = f"tracing failed: {type(exc).__name__}: {exc}"
        else:
            warned = [str(w.message) for w in caught
                      if issubclass(w.category, torch.jit.TracerWarning)]
            if not replayed:
                reason = "the trace's output (or what it wrote) differs from the eager call's"
            elif warned and not _agrees_elsewhere(trace, eager, inputs):
                reason = f"depends on input values: {warned[0]}"
            else:
                self._traces[key] = trace
                if self.varying:
                    self._unconfirmed[key] = _varying_sizes(inputs, self.varying)
                return expected
        self.eager_shapes[key] = reason
        logger.info("%s: shape %s%s runs eager (%s)", self.name,
                    [tuple(t.shape) for t in inputs], f" {static}" if static else "", reason)
        return expected

    def _confirm(self, key: Hashable, inputs: tuple[torch.Tensor, ...],
                 static: dict[str, Hashable]) -> torch.Tensor:
        """The first call of a varying size other than the one a trace was proven at: the
        eager call, and the trace on copies of the inputs as they were, compared; the trace
        serves every size from then on, or the shape runs eager."""
        eager = MethodCall(self.module, "forward", **static) if static else self.module
        if key not in self._unconfirmed:  # another thread confirmed it (or refused it)
            trace = self._traces.get(key)
            return trace(*inputs) if trace is not None else eager(*inputs)
        proven_at = self._unconfirmed.pop(key)
        pristine = _copies(inputs)
        expected = eager(*inputs)
        try:
            agrees = _replays(self._traces[key], pristine, inputs, expected)
        except Exception as exc:  # a size the trace cannot take
            agrees, failure = False, f": {type(exc).__name__}: {exc}"
        else:
            failure = ""
        if not agrees:
            del self._traces[key]
            sizes = _varying_sizes(inputs, self.varying)
            self.eager_shapes[key] = (f"the trace made at varying size {proven_at} differs "
                                      f"from the eager call at {sizes}{failure}")
            logger.info("%s: %s", self.name, self.eager_shapes[key])
        return expected


def _replays(trace: nn.Module, pristine: tuple[torch.Tensor, ...],
             written: tuple[torch.Tensor, ...], expected: torch.Tensor) -> bool:
    """Whether the trace, run on copies of the inputs as they were before the eager call
    (``pristine``), gives its output ``expected`` and leaves its copies as the eager call
    left the inputs (``written``)."""
    trial = _copies(pristine)
    got = trace(*trial)
    return (isinstance(got, torch.Tensor) and torch.equal(got, expected)
            and all(map(torch.equal, trial, written)))


def _runs_until_optimized() -> int:
    """How many runs a new trace takes to reach the graph it then keeps: TorchScript's graph
    executor profiles the first runs (1 by default) and optimizes on the next. Both are slow
    (a VoxCPM-0.5B base LM step: 680 and 370 ms, then 30 ms), so the proof makes them all,
    each compared with the eager call: the first request meets the optimized graph, and the
    graph proven is the one replayed."""
    profiled = getattr(torch._C, "_jit_get_num_profiled_runs", None)
    return (profiled() if profiled is not None else 1) + 1


def _agrees_elsewhere(trace: nn.Module, eager: nn.Module,
                      inputs: tuple[torch.Tensor, ...]) -> bool:
    """Where the tracer warned that a value became a constant (it also warns for a branch
    on a size, which the shape key makes safe): whether the trace still equals the eager
    call on other values of the same shape (floating inputs negated and scaled), which a
    branch on data or a value read with ``.item()`` would not."""
    other = tuple(-1.7 * t if t.is_floating_point() else t for t in inputs)
    mine, theirs = _copies(other), _copies(other)
    return torch.equal(trace(*mine), eager(*theirs)) and all(map(torch.equal, mine, theirs))


def _copies(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Copies with the inputs' shapes and strides (a view into a larger cache keeps its
    strides), for trial runs that may write into them."""
    copies = []
    for tensor in inputs:
        if any(stride == 0 and size > 1 for stride, size in zip(tensor.stride(), tensor.shape,
                                                                 strict=True)):
            copies.append(tensor.clone())  # an expanded input: its elements share memory
            continue
        copy = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype,
                                   device=tensor.device)
        copies.append(copy.copy_(tensor))
    return tuple(copies)
