"""Seeds: use the caller's, or draw one and report it so the result can be replayed."""

from __future__ import annotations

import secrets

from mizuoto.contracts.requests import MAX_SEED


def resolve_seed(seed: int | None) -> tuple[int, bool]:
    """Return ``(seed, drawn)``: the caller's seed, or a fresh 32-bit one with ``drawn=True``."""
    if seed is not None:
        return seed, False
    return secrets.randbelow(MAX_SEED + 1), True
