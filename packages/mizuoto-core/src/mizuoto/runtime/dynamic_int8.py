"""Dynamic int8 linear layers: the kernels of the engines' opt-in int8 fast profiles (never
exact).

torch's eager ``quantize_dynamic`` swaps each ``nn.Linear`` for one holding an int8 weight (per
tensor) that quantizes its input per call; on the CPU fbgemm runs it (AVX2 and up; qnnpack on
ARM). torch marks that API deprecated in favour of torchao but still ships it; a build without
it, or without a quantized engine, would only fail at the first product, so an engine checks
:func:`require_dynamic_int8` with its option's name before it reads a checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterable

import torch
from torch import nn

from mizuoto.errors import InvalidOption


@contextlib.contextmanager
def _quiet():
    """torch.ao's eager quantization warns (DeprecationWarning, and a UserWarning for each
    quantized tensor it makes) that it moves to torchao; it still runs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        yield


@functools.cache
def dynamic_int8_unavailable() -> str | None:
    """Why this torch cannot run dynamic int8 linears (``None``: it can), from one 8 × 8
    trial per process."""
    try:
        from torch.ao.quantization import quantize_dynamic
    except ImportError as exc:
        return f"this torch {torch.__version__} has no torch.ao.quantization ({exc})"
    try:
        with _quiet(), torch.no_grad():
            layer = quantize_dynamic(nn.Sequential(nn.Linear(8, 8)), {nn.Linear},
                                     dtype=torch.qint8)
            layer(torch.ones(2, 8))
    except (RuntimeError, NotImplementedError, AssertionError) as exc:
        engines = ", ".join(torch.backends.quantized.supported_engines)
        first_line = str(exc).splitlines()[0] if str(exc) else repr(exc)
        return (f"this torch {torch.__version__} has no int8 kernel for this CPU (quantized "
                f"engines: {engines}; {first_line})")
    return None


def require_dynamic_int8(option: str) -> None:
    """Refuse ``option`` (an engine's fast-profile option) where dynamic int8 cannot run."""
    reason = dynamic_int8_unavailable()
    if reason is not None:
        raise InvalidOption(option, f"an int8 profile needs torch's dynamic int8 linear "
                            f"layers: {reason}; install a CPU build of torch with fbgemm "
                            f"(x86) or qnnpack (ARM), or set {option}=off")


def quantize_linears(roots: Iterable[nn.Module]) -> int:
    """Make every ``nn.Linear`` inside each of ``roots`` a dynamic int8 one in place; how many
    were. A root that is itself a bare ``nn.Linear`` is kept (``quantize_dynamic`` replaces
    children, not the module it is given)."""
    from torch.ao.quantization import quantize_dynamic

    count = 0
    with _quiet():
        for root in roots:
            if type(root) is nn.Linear:
                continue
            count += sum(type(m) is nn.Linear for m in root.modules())
            quantize_dynamic(root, {nn.Linear}, dtype=torch.qint8, inplace=True)
    return count
