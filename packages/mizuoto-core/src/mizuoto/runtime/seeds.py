"""Seeds: use the caller's, or draw one and report it so the result can be replayed."""

from __future__ import annotations

import secrets

#: Largest seed a request may give (seeds are 32-bit).
MAX_SEED = 2**32 - 1


def resolve_seed(seed: int | None) -> tuple[int, bool]:
    """Return ``(seed, drawn)``: the caller's seed, or a fresh 32-bit one with ``drawn=True``."""
    if seed is not None:
        return seed, False
    return secrets.randbelow(MAX_SEED + 1), True


def keyed_seed(seed: int, key: str) -> int:
    """A 63-bit seed derived from ``(seed, key)``: stable across runs, machines and versions."""
    import hashlib

    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def keyed_generator(seed: int, key: str):
    """A CPU ``torch.Generator`` seeded by ``(seed, key)``.

    Random-init fixtures draw each tensor from the generator of its state-dict key, so the
    weights do not depend on the order in which modules are built, and the same directory loads
    into upstream and into Mizuoto with the same values.
    """
    import torch

    return torch.Generator().manual_seed(keyed_seed(seed, key))
