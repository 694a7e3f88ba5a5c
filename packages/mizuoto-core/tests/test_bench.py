"""``mizuoto bench``: the command on the example plugin's toy engine (fresh child processes, one
run each: no timing is asserted), its schedule and summary, and its argument errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from mizuoto.benchmarking.child import FIELDS
from mizuoto.benchmarking.report import summarize, table
from mizuoto.benchmarking.runner import Configuration, parse_compare, schedule
from mizuoto.cli import cli
from mizuoto.errors import InvalidRequest

pytest.importorskip("mizuoto_example", reason="the example plugin (docs/examples) is needed")


def _bench(*args):
    return CliRunner().invoke(cli, ["--quiet", "bench", *args], obj={}, catch_exceptions=False)


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy engine's random model, in a directory of this test's own."""
    monkeypatch.setenv("MIZUOTO_HOME", str(tmp_path / "home"))
    return ["random:toy/tiny", "--random-dir", str(tmp_path / "toy")]


def test_bench_measures_each_configuration_in_its_own_process(toy):
    result = _bench(*toy, "--runs", "1", "--json", "--stream", "--threads", "1",
                    "--compare", "breathy:engines.toy.breathiness=0.5",
                    "--compare", "same:engines.toy.breathiness=0.1")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["engine"] == "toy" and report["stream"] and report["threads"] == 1
    entries = {entry["name"]: entry for entry in report["configurations"]}
    assert list(entries) == ["base", "breathy", "same"]
    for entry in entries.values():
        (run,) = entry["runs"]
        assert set(run) == set(FIELDS)
        assert run["side"] == "mizuoto" and run["threads"] == 1
        assert run["first_audio_s"] <= run["request_s"] and run["audio_s"] > 0
        assert run["samples"] == sum(run["chunks"]) and run["peak_rss_mb"] > 0
        assert entry["deterministic"]
    assert entries["breathy"]["options"] == ["engines.toy.breathiness=0.5"]
    assert entries["same"]["identical_to_base"] is True
    assert entries["breathy"]["identical_to_base"] is False
    assert entries["base"]["ratio_to_base"]["request_s"] == 1.0
    assert entries["base"]["identical_to_upstream"] is None
    # side by side with the base, from the audio each child saved (no timing asserted)
    assert entries["base"]["against_base"] is None
    assert entries["same"]["against_base"]["identical"] is True
    breathy = entries["breathy"]["against_base"]
    assert breathy["identical"] is False and breathy["speedup"] > 0
    assert math.isfinite(breathy["waveform_snr_db"]) and math.isfinite(breathy["mel_snr_db"])
    assert breathy["stop"]["unit"] == "samples" and breathy["stop"]["moved"] is False


def test_an_option_the_engine_refuses_fails_naming_the_configuration(toy):
    result = _bench(*toy, "--runs", "1", "--compare", "compiled:compute.compile=true")
    assert result.exit_code == 2
    assert "configuration 'compiled' failed" in result.output
    assert "compute.compile" in result.output


@pytest.mark.parametrize("args, exit_code, message", [
    (["random:toy/nope"], 2, "no random model 'toy/nope' (known: "),
    (["--compare", "nameless"], 2, "must be NAME:key=value"),
    (["--compare", "base:compute.dtype=float32"], 2, "'base' names a configuration"),
    (["--compare", "a:compute.dtype=float32", "--compare", "a:compute.dtype=auto"], 2,
     "two configurations are named 'a'"),
    (["--compare", "x:compute.colour=red"], 2, "compute.colour"),
    (["--option", "compute.cpu_threads=0"], 2, "compute.cpu_threads"),
    (["--against-upstream"], 2, "engine 'toy' registers no upstream baseline"),
    (["--ref-text", "words"], 2, "--ref-text: needs --ref-audio"),
    (["--runs", "0"], 2, "--runs"),
])
def test_bad_arguments_fail_before_any_run(toy, args, exit_code, message):
    model, *rest = toy
    if args[0].startswith("random:"):
        model, args = args[0], args[1:]
    result = _bench(model, *rest, *args)
    assert result.exit_code == exit_code
    assert message in result.output
    assert "run 1/" not in result.output


def test_streaming_is_measured_for_streaming_engines_only(tmp_path, monkeypatch):
    import attrs

    from mizuoto import Capability, registry

    monkeypatch.setenv("MIZUOTO_HOME", str(tmp_path))
    pytest.importorskip("mizuoto_f5tts")
    # every bundled engine streams: F5-TTS registered as one that does not
    refs = dict(registry.engine_refs())
    refs["f5tts"] = attrs.evolve(refs["f5tts"],
                                 capabilities=refs["f5tts"].capabilities - {Capability.STREAM})
    monkeypatch.setattr(registry, "engine_refs", lambda: refs)
    result = _bench("random:f5tts/tiny-v1-base", "--stream")
    assert result.exit_code == 4
    assert "engine 'f5tts' does not stream" in result.output


def test_configurations_take_turns_in_every_position():
    a, b, c = (Configuration(name) for name in "abc")
    order = [config.name for _, config in schedule([a, b, c], 3)]
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert [run for run, _ in schedule([a, b], 2)] == [0, 0, 1, 1]


def test_compare_parses_name_and_overrides():
    assert parse_compare("fast: compute.attention=fast , compute.cpu_threads=2") == \
        Configuration("fast", "mizuoto", ("compute.attention=fast", "compute.cpu_threads=2"))
    with pytest.raises(InvalidRequest, match="sets no option"):
        parse_compare("empty:")
    with pytest.raises(InvalidRequest, match="must be written key=value"):
        parse_compare("x:compute.compile")


def _run(sha: str, request_s: float, chunks=None) -> dict:
    return {"audio_sha256": sha, "chunks": chunks, "request_s": request_s, "load_s": 1.0,
            "same_audio_every_request": True}


def test_summary_ratios_and_identity():
    configurations = [Configuration("base"), Configuration("other"),
                      Configuration("upstream", "upstream")]
    measured = {"base": [_run("a", 2.0), _run("a", 4.0), _run("a", 3.0)],
                "other": [_run("a", 1.5), _run("b", 1.5)],
                "upstream": [_run("a", 6.0)]}
    entries = {e["name"]: e for e in summarize(configurations, measured)}
    assert entries["base"]["summary"]["request_s"] == {"min": 2.0, "median": 3.0, "max": 4.0}
    assert entries["base"]["ratio_to_upstream"]["request_s"] == 0.5
    assert entries["base"]["identical_to_upstream"] is True
    assert entries["other"]["ratio_to_base"]["request_s"] == 0.5
    assert not entries["other"]["deterministic"]
    assert entries["other"]["identical_to_base"] is False  # two outputs: not identical
    streamed = summarize([Configuration("base"), Configuration("x")],
                         {"base": [_run("a", 1.0, [2, 2])], "x": [_run("a", 1.0, [1, 3])]})
    assert streamed[1]["identical_to_base"] is False  # same samples, other chunk boundaries


def test_the_table_flags_identical_and_different_audio():
    entries = summarize([Configuration("base"), Configuration("other"),
                         Configuration("upstream", "upstream")],
                        {"base": [_run("a", 2.0)], "other": [_run("b", 1.0)],
                         "upstream": [_run("a", 4.0)]})
    header = {"model": "random:toy/tiny", "engine": "toy", "stream": False, "runs": 1,
              "requests": 1, "threads": 1,
              "load_average": {"before": [1.5, 1, 1], "after": [2.25, 1, 1]}}
    lines = table(header, entries).splitlines()
    assert lines[0] == ("mizuoto bench: random:toy/tiny (toy), synthesize, 1 run(s) per "
                        "configuration, 1 request(s) per run, 1 thread(s), load average 1.50 "
                        "before, 2.25 after")
    rows = {line.split()[0]: line for line in lines[3:6]}
    assert rows["base"].endswith("1.000   0.500       identical to upstream")
    assert rows["other"].endswith("0.500   0.250       differs from base")
    assert rows["upstream"].endswith("2.000   1.000       identical to base")


def test_a_child_measures_its_own_peak_not_its_parents():
    """On Linux ``ru_maxrss`` starts at the parent's peak (it survives fork and exec): a bench
    that built a model in its own process would have every child report at least that."""
    import subprocess
    import sys

    from mizuoto.benchmarking.child import _peak_rss_mb

    ballast = bytearray(400 << 20)
    ballast[::4096] = b"\1" * len(ballast[::4096])  # touched: resident
    assert _peak_rss_mb() >= 400
    code = "from mizuoto.benchmarking.child import _peak_rss_mb; print(_peak_rss_mb())"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True)
    del ballast
    assert float(child.stdout) < 200, child.stdout


def test_a_random_model_is_written_outside_the_bench_process(toy, monkeypatch):
    import subprocess

    from mizuoto.benchmarking import command

    calls = []
    real_run = subprocess.run

    def spy(args, **kwargs):
        calls.append(list(args))
        return real_run(args, **kwargs)

    monkeypatch.setattr(subprocess, "run", spy)
    from mizuoto.registry import random_models

    fixture = random_models()["toy/tiny"]
    directory = Path(toy[-1])
    command._write_random(fixture, directory)
    assert any(call[-3:] == ["random-model", "toy/tiny", str(directory)] for call in calls)
    assert (directory / command._COMPLETE).read_text().strip() == "toy/tiny"
    calls.clear()
    command._write_random(fixture, directory)  # complete: reused, nothing run
    assert calls == []


def test_the_table_has_no_audio_column_when_there_is_nothing_to_say():
    entries = summarize([Configuration("base")], {"base": [_run("a", 2.0)]})
    header = {"model": "random:toy/tiny", "engine": "toy", "stream": False, "runs": 1,
              "requests": 1, "threads": 1,
              "load_average": {"before": [1.0, 1, 1], "after": [1.0, 1, 1]}}
    lines = table(header, entries).splitlines()
    assert lines[2].split() == ["configuration", "load", "s", "request", "s", "RTF", "peak",
                                "RSS", "MB", "x", "base"]
    assert not lines[3].rstrip().endswith("-")
