"""``mizuoto bench --against-upstream`` on a tiny random F5-TTS model: Mizuoto and upstream
f5-tts, each in its own process, give the same samples (no timing is asserted)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mizuoto.benchmarking.child import FIELDS
from mizuoto.cli import cli

pytestmark = pytest.mark.parity


def test_bench_against_upstream_reports_identical_audio(tmp_path, monkeypatch):
    monkeypatch.setenv("MIZUOTO_HOME", str(tmp_path))
    result = CliRunner().invoke(cli, ["--quiet", "bench", "random:f5tts/tiny-v1-base",
                                      "--runs", "1", "--threads", "1", "--json",
                                      "--against-upstream"], obj={}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    base, upstream = json.loads(result.output)["configurations"]
    assert (base["name"], upstream["name"]) == ("base", "upstream")
    (ours,), (theirs,) = base["runs"], upstream["runs"]
    assert set(ours) == set(theirs) == set(FIELDS)
    assert theirs["upstream_version"] == "1.1.22" and ours["upstream_version"] is None
    assert ours["samples"] == theirs["samples"] > 0 and ours["threads"] == 1
    assert base["identical_to_upstream"] is True and upstream["identical_to_base"] is True
