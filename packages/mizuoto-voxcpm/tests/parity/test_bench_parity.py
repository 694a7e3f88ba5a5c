"""``mizuoto bench --against-upstream`` on a tiny random VoxCPM model: Mizuoto and upstream
voxcpm, each in its own process, stream the same chunks (no timing is asserted)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mizuoto.benchmarking.child import FIELDS
from mizuoto.cli import cli

pytestmark = pytest.mark.parity


def test_bench_against_upstream_streams_identical_chunks(tmp_path, monkeypatch):
    monkeypatch.setenv("MIZUOTO_HOME", str(tmp_path))
    result = CliRunner().invoke(cli, ["--quiet", "bench", "random:voxcpm/tiny-0.5b",
                                      "--runs", "1", "--threads", "1", "--json", "--stream",
                                      "--against-upstream"], obj={}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    base, upstream = json.loads(result.output)["configurations"]
    (ours,), (theirs,) = base["runs"], upstream["runs"]
    assert set(ours) == set(theirs) == set(FIELDS)
    assert theirs["upstream_version"] == "2.0.3"
    assert ours["chunks"] == theirs["chunks"] and len(ours["chunks"]) > 1
    assert ours["first_audio_s"] is not None and theirs["first_audio_s"] is not None
    assert base["identical_to_upstream"] is True and upstream["identical_to_base"] is True
