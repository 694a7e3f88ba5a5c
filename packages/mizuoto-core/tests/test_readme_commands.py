"""The README's offline commands run as written, in order, in one fresh directory.

Every ```bash block of README.md preceded by ``<!-- offline-check -->`` is run line by line
with ``bash`` in a temporary directory (``/tmp/`` in the commands becomes that directory, the
model home is empty and no hub is reached), after dropping the set-up steps this environment
has already done (``python -m venv``, activating it, ``pip install``). Each command must exit
0 and write the files it names with ``-o``. The times are printed (``-s``), not asserted: the
README promises seconds, a test run on a loaded machine cannot.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mizuoto_f5tts", reason="the README's commands use both engines")
pytest.importorskip("mizuoto_voxcpm", reason="the README's commands use both engines")

README = Path(__file__).resolve().parents[3] / "README.md"
_MARKED = re.compile(r"<!-- offline-check -->\s*```bash\n(?P<body>.*?)```", re.DOTALL)
_SETUP = ("python -m venv", ". .venv/bin/activate", "pip install")
HANG_GUARD_S = 900  # a stuck command fails the test instead of holding CI


def readme_commands(text: str) -> list[str]:
    """The marked blocks' commands, one per line, without the set-up steps."""
    commands = []
    for block in _MARKED.finditer(text):
        for line in block["body"].splitlines():
            steps = [step.strip() for step in line.split(" && ")]
            kept = [step for step in steps if step and not step.startswith(_SETUP)]
            if kept:
                commands.append(" && ".join(kept))
    return commands


def _outputs(command: str) -> list[str]:
    """The files a command names with ``-o`` (directories with ``/``)."""
    words = shlex.split(command)
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word == "-o"]


def test_the_readme_marks_the_offline_paths():
    commands = readme_commands(README.read_text(encoding="utf-8"))
    joined = "\n".join(commands)
    for needed in ("random-model f5tts/", "random-model voxcpm/", " --stream ", "--save-voice",
                   "--voice ", "mizuoto batch ", " -f story.txt", "--steps 4 --section-chars",
                   "mizuoto edit ", "mizuoto train ", "mizuoto bench random:"):
        assert needed in joined, f"README.md's offline commands have no {needed.strip()!r}"
    assert not any(step.startswith(_SETUP) for c in commands for step in c.split(" && "))


def test_readme_offline_commands_run(tmp_path):
    commands = readme_commands(README.read_text(encoding="utf-8"))
    work = tmp_path / "work"
    work.mkdir()
    bin_dir = str(Path(sys.executable).parent)  # this environment's mizuoto and python
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
           "MIZUOTO_HOME": str(tmp_path / "home"), "MIZUOTO_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1"}
    times = []
    for command in commands:
        command = command.replace("/tmp/", f"{tmp_path}/")
        started = time.monotonic()
        done = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True,
                              text=True, timeout=HANG_GUARD_S)
        times.append((time.monotonic() - started, command))
        assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stderr[-3000:]}"
        for output in _outputs(command):
            path = work / output
            assert path.exists() and (path.is_dir() or path.stat().st_size > 0), \
                f"{command} did not write {output}"
    for seconds, command in times:
        print(f"{seconds:6.1f} s  {command}")
