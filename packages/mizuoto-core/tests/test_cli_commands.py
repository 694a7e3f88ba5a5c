"""The command line as a package of commands: the group adds every module's ``COMMANDS``, so
that a new command is one new file; and a plugin's command is built from the same toolkit
(``mizuoto.plugin``'s ``model_options``, ``command_progress``, ``report_written`` ...), as
docs/plugins.md shows."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click
import pytest
import soundfile as sf
from click.testing import CliRunner

import mizuoto.commands
from mizuoto.cli import builtin_commands, cli

_BUILTIN = {"batch", "bench", "bench-run", "edit", "models", "plugins", "random-model", "say",
            "serve", "synth", "train", "wyoming"}


def test_the_group_holds_the_commands_of_the_command_modules():
    found = builtin_commands()
    assert set(found) == _BUILTIN
    assert all(cli.commands[name] is command for name, command in found.items())
    assert found["synth"].hidden and found["synth"].callback is found["say"].callback


@pytest.fixture
def extra_command_module(tmp_path, monkeypatch):
    """Where a new command module can be written: a folder searched as part of
    ``mizuoto.commands`` (its modules forgotten afterwards)."""
    monkeypatch.setattr(mizuoto.commands, "__path__", [*mizuoto.commands.__path__,
                                                       str(tmp_path)])
    yield tmp_path
    for name in [name for name in sys.modules if name.startswith("mizuoto.commands.")]:
        if getattr(sys.modules[name], "__file__", "").startswith(str(tmp_path)):
            del sys.modules[name]


def test_a_new_command_is_one_new_module(extra_command_module):
    (extra_command_module / "hum.py").write_text(
        "import click\n\n\n"
        "@click.command()\n@click.argument('tune')\n"
        "def hum(tune):\n    \"\"\"Hum TUNE.\"\"\"\n    click.echo(f'hmm {tune}')\n\n\n"
        "COMMANDS = (hum,)\n")
    found = builtin_commands()
    assert set(found) == _BUILTIN | {"hum"}
    result = CliRunner().invoke(click.Group(commands=found), ["hum", "la"])
    assert result.exit_code == 0 and result.output == "hmm la\n"


def test_two_commands_of_one_name_are_refused(extra_command_module):
    (extra_command_module / "again.py").write_text(
        "import click\n\n\n@click.command()\ndef say():\n    \"\"\"Another say.\"\"\"\n\n\n"
        "COMMANDS = (say,)\n")
    with pytest.raises(RuntimeError, match="two commands named 'say'"):
        builtin_commands()


def _documented_register_commands():
    """The ``register_commands`` of docs/plugins.md's example built from the toolkit, run as
    written there."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "plugins.md").read_text()
    [block] = [block for block in re.findall(r"^```python\n(.*?)^```$", text,
                                             re.MULTILINE | re.DOTALL)
               if "@model_options" in block]
    namespace = {"__name__": "docs_block"}
    exec(compile(block, "<docs/plugins.md>", "exec"), namespace)
    return namespace["register_commands"]


def test_a_plugin_command_from_the_toolkit_speaks_and_reports_as_say_does(fake_plugin,
                                                                          tmp_path):
    group = click.Group()
    _documented_register_commands()(group)
    (tmp_path / "fake.json").write_text("{}")
    out = tmp_path / "hum.wav"
    runner = CliRunner()
    result = runner.invoke(group, ["hum", "-m", str(tmp_path), "-o", str(out), "--seed", "5",
                                   "hello"], obj={"quiet": False})
    assert result.exit_code == 0, result.output
    assert f"Wrote {out}  seed=5  dtype=float32" in result.output
    assert sf.info(str(out)).frames == 8000
    # a request field an engine refuses is named by the flag that sets it
    bad = runner.invoke(group, ["hum", "-m", str(tmp_path), "-o", str(out), "--param",
                                "nope=1", "hello"], obj={"quiet": True})
    assert bad.exit_code != 0 and "--param nope" in str(bad.exception)
    # an output no writer knows is refused before any model loads
    refused = runner.invoke(group, ["hum", "-m", str(tmp_path), "-o", str(tmp_path / "x.txt"),
                                    "hello"], obj={"quiet": True})
    assert "--output" in str(refused.exception)
