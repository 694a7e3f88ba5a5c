"""Shared by the VoxCPM unit and parity tests."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """CPU results depend on the thread count (1 vs 2 differ by ~1e-6): every test, and every
    oracle it compares against, runs on one thread -- or on MIZUOTO_TEST_THREADS, to prove the
    parity at another count (``MIZUOTO_TEST_THREADS=4 nox -s parity -- --realsize``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("MIZUOTO_TEST_THREADS", "1")))
    yield
    torch.set_num_threads(threads)
