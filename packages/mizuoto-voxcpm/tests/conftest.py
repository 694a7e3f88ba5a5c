"""Shared by the VoxCPM unit and parity tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """CPU results depend on the thread count (1 vs 2 differ by ~1e-6): every test, and every
    oracle it compares against, runs on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
