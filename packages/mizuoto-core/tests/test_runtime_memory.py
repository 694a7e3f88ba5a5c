"""The memory guards' figure: what this process has freed counts as available."""

import pytest
import torch

from mizuoto.runtime import memory


def test_a_short_figure_is_read_again_after_giving_freed_memory_back(monkeypatch):
    readings = iter([100, 500])
    released = []
    monkeypatch.setattr(memory, "_mem_available", lambda: next(readings))
    monkeypatch.setattr(memory, "release_freed_memory", lambda: released.append(True))
    assert memory.available_memory(300) == 500 and released == [True]


def test_enough_memory_or_no_need_reads_once_and_releases_nothing(monkeypatch):
    monkeypatch.setattr(memory, "_mem_available", lambda: 1000)
    monkeypatch.setattr(memory, "release_freed_memory", lambda: pytest.fail("released"))
    assert memory.available_memory(300) == 1000
    assert memory.available_memory() == 1000


def test_an_unknown_figure_stays_unknown(monkeypatch):
    monkeypatch.setattr(memory, "_mem_available", lambda: None)
    assert memory.available_memory(10**12) is None


def test_releasing_keeps_live_objects():
    kept = torch.arange(1 << 20, dtype=torch.float32)
    memory.release_freed_memory()
    assert torch.equal(kept, torch.arange(1 << 20, dtype=torch.float32))


def _resident_mib() -> int:
    with open("/proc/self/status", encoding="ascii") as handle:
        return next(int(line.split()[1]) // 1024 for line in handle
                    if line.startswith("VmRSS:"))


@pytest.mark.skipif(memory._malloc_trim() is None, reason="glibc's malloc_trim is not here")
def test_freed_tensors_held_by_the_heap_are_given_back():
    """1 MiB tensors (a model's weights and optimiser state) freed between small live ones:
    the heap keeps the holes (resident, counted as taken by MemAvailable) until trimmed."""
    big, small = [], []
    for _ in range(1024):
        big.append(torch.ones(256, 1024))
        small.append(torch.ones(16))
    held = _resident_mib()
    del big
    memory.release_freed_memory()
    assert _resident_mib() < held - 768  # of the 1024 MiB freed
    assert all(torch.equal(t, torch.ones(16)) for t in small)
