"""Bit-exact comparisons whose failure says what differs and what usually causes it.

``assert torch.equal(a, b)`` fails with a bare ``assert False``; :func:`assert_same` names the
shapes, the first differing index, the largest difference and the likely cause, so that a
plugin author knows what to change.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def difference(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    """``None`` when the tensors are equal (``torch.equal``), else what differs, in words."""
    if torch.equal(actual, expected):
        return None
    if actual.shape != expected.shape:
        return (f"shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)} "
                f"({actual.numel()} vs {expected.numel()} values)")
    if actual.dtype != expected.dtype:
        return f"dtypes differ: {actual.dtype} vs {expected.dtype}"
    a, b = actual.detach().cpu(), expected.detach().cpu()
    unequal = (a != b) & ~(torch.isnan(a) & torch.isnan(b)) if a.is_floating_point() \
        else a != b
    first = tuple(int(i) for i in unequal.nonzero()[0])
    count = int(unequal.sum())
    if a.is_floating_point() or a.is_complex():
        gap = (a.double() - b.double()).abs()
        largest = float(gap[unequal].max())
    else:
        largest = float((a.long() - b.long()).abs().max())
    return (f"shape {tuple(a.shape)}, {count} of {a.numel()} values differ, the first at index "
            f"{first} ({a[first].item()!r} vs {b[first].item()!r}), max |diff| {largest:.3g}")


# One step of 16-bit PCM in [-1, 1]: a difference of about this size, and no larger, is one
# side rounded to int16.
INT16_STEP = 1 / 32768


def _int16_sized(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    if not (actual.is_floating_point() and actual.shape == expected.shape):
        return False
    largest = float((actual.double() - expected.double()).abs().max())
    return 0.25 * INT16_STEP <= largest <= 1.01 * INT16_STEP


def assert_same(actual: torch.Tensor, expected: torch.Tensor, what: str, cause: str,
                diagnose: Callable[[], str | None] | None = None) -> None:
    """Fail, naming ``what`` differs, how, and its likely ``cause``, unless bit-identical
    (where the difference is at most one int16 step, that is named as the cause instead).
    ``diagnose``, called only when they differ, may return the cause it found by a further
    experiment (a voice that changes nothing, a global RNG), which then replaces ``cause``."""
    differs = difference(actual, expected)
    if differs is None:
        return
    if _int16_sized(actual.detach().cpu(), expected.detach().cpu()):
        cause = ("the differences are within one int16 step (1/32768): one side is quantised "
                 "to 16-bit PCM (e.g. stream chunks rounded to int16); keep the samples "
                 "float32 throughout")
    elif diagnose is not None:
        cause = diagnose() or cause
    raise AssertionError(f"{what} differ: {differs}. Likely cause: {cause}")


def first_differing_tensor(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]
                           ) -> str | None:
    """The first name (sorted) whose tensor differs or exists on one side only, with what
    differs; ``None`` when every tensor is identical."""
    for name in sorted(set(actual) | set(expected)):
        if name not in actual or name not in expected:
            side = "the first" if name in actual else "the second"
            return f"{name!r} exists only in {side}"
        differs = difference(actual[name], expected[name])
        if differs is not None:
            return f"{name!r}: {differs}"
    return None
