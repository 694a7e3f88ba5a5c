"""Property test: the ``mizuoto`` command given arbitrary arguments (with the in-test plugin)
exits with a documented code and a one-line error, never a traceback."""

from __future__ import annotations

import contextlib
import os
import tempfile

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mizuoto.cli import cli

EXIT_CODES = {0, 1, 2, 3, 4, 130}  # README, "Command line"
COMMANDS = ["say", "synth", "edit", "train", "plugins", "models", "random-model", "--help",
            "--version", "nope"]
OPTIONS = ["-m", "--model", "-e", "--engine", "-o", "--output", "--seed", "--steps", "--guidance",
           "--param", "--option", "--options-file", "--ref-audio", "--ref-text", "--voice",
           "--save-voice", "--instruction", "--stream", "-f", "--text-file", "--segment",
           "--method", "--data", "--learning-rate", "--batch-size", "--memory", "-q", "--debug"]
VALUES = ["model", "fake", "out.wav", "out.flac", "out.mp3", "text.txt", "ref.wav", "nan", "inf",
          "-inf", "1e999", "-1", "0", "1", "2.5", "1000", "1001", "4294967296", "9" * 40,
          "speed=inf", "speed=nan", "speed=1e999", "speed=[1", "level=-1", "label=x",
          "compute.cpu_threads=0", "compute.cpu_threads=99999", "compute.device=cuda:x",
          "compute.dtype=nan", "engines.fake.level=nan", "engines.fake.level=-3", "0:1",
          "1:0", "nan:inf", "a:b", "0.5:0.2", "fake/tiny", "fake/base", "dir", "x=1", "=",
          "full", "lora", "low", "héllo", "\u202e\u200b", "👩‍👩‍👧", "a\u0301" * 20]
SAFE_TEXT = st.text(max_size=20).filter(lambda s: not s.startswith("/") and ".." not in s
                                        and "\x00" not in s)
TOKENS = st.one_of(st.sampled_from(OPTIONS), st.sampled_from(VALUES), SAFE_TEXT)
ARGS = st.tuples(st.sampled_from(COMMANDS), st.lists(TOKENS, max_size=10)).map(
    lambda t: [t[0], *t[1]])
# Commands that reach the model: the in-test engine in "model", a reference and a text file.
SAY = st.lists(st.one_of(st.sampled_from(OPTIONS), st.sampled_from(VALUES)), max_size=8).map(
    lambda rest: ["say", "-m", "model", "-o", "out.wav", *rest, "hello"])


def _prepare(directory: str) -> None:
    import numpy as np
    import soundfile as sf

    os.makedirs(os.path.join(directory, "model"), exist_ok=True)
    with open(os.path.join(directory, "model", "fake.json"), "w") as handle:
        handle.write("{}")
    with open(os.path.join(directory, "text.txt"), "w", encoding="utf-8") as handle:
        handle.write("Words from a file.")
    sf.write(os.path.join(directory, "ref.wav"), np.full(800, 0.1, dtype=np.float32), 8000)


def _check(args) -> None:
    with tempfile.TemporaryDirectory() as directory, contextlib.chdir(directory):
        _prepare(".")
        result = CliRunner().invoke(cli, args, obj={})
    if "train" in args and isinstance(result.exception, NotImplementedError):
        return  # the in-test trainer does not train
    assert result.exit_code in EXIT_CODES, (args, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        (args, repr(result.exception))
    if "--debug" not in args:
        assert "Traceback" not in result.output, (args, result.output)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=ARGS)
def test_any_arguments_exit_with_a_documented_code(fake_plugin, monkeypatch, tmp_path, args):
    monkeypatch.setenv("MIZUOTO_HOME", str(tmp_path))
    _check(args)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=SAY)
def test_say_with_any_settings_exits_with_a_documented_code(fake_plugin, args):
    _check(args)
