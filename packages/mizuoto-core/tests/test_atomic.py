"""Atomic directories: an export appears whole, replaces the last one, or nothing changes."""

from __future__ import annotations

import os

import pytest

from mizuoto.runtime import atomic
from mizuoto.runtime.atomic import atomic_directory


def _write(directory, files):
    for name, text in files.items():
        (directory / name).write_text(text)


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "move-aside"])
def test_a_directory_is_written_and_replaces_an_existing_one(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(atomic, "_exchange", lambda first, second: False)
    target = tmp_path / "export"
    with atomic_directory(target) as part:
        assert part.parent == tmp_path and not target.exists()
        _write(part, {"model.safetensors": "one", "config.json": "{}"})
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    with atomic_directory(target) as part:
        _write(part, {"model.safetensors": "two"})
        assert (target / "config.json").exists()  # the old one stays until the new is whole
    assert [p.name for p in target.iterdir()] == ["model.safetensors"]
    assert (target / "model.safetensors").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # nothing left beside


def test_an_error_leaves_the_old_directory_and_no_debris(tmp_path):
    target = tmp_path / "export"
    target.mkdir()
    _write(target, {"model.safetensors": "old"})
    with pytest.raises(RuntimeError), atomic_directory(target) as part:
        _write(part, {"model.safetensors": "half"})
        raise RuntimeError("killed mid-export")
    assert (target / "model.safetensors").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_the_directory_gets_the_permissions_of_a_plain_mkdir(tmp_path):
    previous = os.umask(0o022)
    try:
        with atomic_directory(tmp_path / "export") as part:
            _write(part, {"a": "b"})
    finally:
        os.umask(previous)
    assert (tmp_path / "export").stat().st_mode & 0o777 == 0o755


def test_a_fixed_staging_name_is_cleared_of_a_crashed_attempt_and_used(tmp_path):
    debris = tmp_path / ".latest.staging"
    debris.mkdir()
    _write(debris, {"half.pt": "from a killed run"})
    with atomic_directory(tmp_path / "latest", staging=".latest.staging", durable=True) as part:
        assert part == debris and list(part.iterdir()) == []
        _write(part, {"state.pt": "whole"})
    assert [p.name for p in (tmp_path / "latest").iterdir()] == ["state.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]


def test_the_old_directory_moved_aside_by_a_crash_is_found(tmp_path, monkeypatch):
    target = tmp_path / "latest"
    target.mkdir()
    _write(target, {"step": "4"})
    assert atomic.left_aside(target) is None
    monkeypatch.setattr(atomic, "_exchange", lambda first, second: False)
    real_replace = os.replace

    def killed_after_moving_aside(source, destination):
        real_replace(source, destination)
        if os.fspath(source) == os.fspath(target):
            raise KeyboardInterrupt("killed between the two renames")

    monkeypatch.setattr(atomic.os, "replace", killed_after_moving_aside)
    with pytest.raises(KeyboardInterrupt), atomic_directory(target) as part:
        _write(part, {"step": "5"})
    aside = atomic.left_aside(target)
    assert not target.exists() and (aside / "step").read_text() == "4"
