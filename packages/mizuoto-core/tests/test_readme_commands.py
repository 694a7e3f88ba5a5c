"""The README's and the docs' offline commands run as written, in order, in one directory.

Every ```bash block of README.md preceded by ``<!-- offline-check -->`` is run line by line
with ``bash`` in a temporary directory, then those of the docs pages (``docs/**/*.md``, in
name order, in the same directory: they use the README's random models; a command already run
is not run again); a marked ```python block runs as a script there (``/tmp/`` in the commands becomes that directory, the
model home is empty and no hub is reached), after dropping the set-up steps this environment
has already done (``python -m venv``, activating it, ``pip install``). Each command must exit
0 and write the files it names with ``-o``. ``mizuoto serve`` runs in the background on a
free port (the README's 8000 becomes it) until the walk ends. The times (wall and CPU) are
printed (``-s``), not asserted: the README promises seconds, a test run on a loaded machine
cannot.
"""

from __future__ import annotations

import os
import re
import resource
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("mizuoto_f5tts", reason="the README's commands use both engines")
pytest.importorskip("mizuoto_voxcpm", reason="the README's commands use both engines")

README = Path(__file__).resolve().parents[3] / "README.md"
_MARKED = re.compile(r"<!-- offline-check -->\s*```bash\n(?P<body>.*?)```", re.DOTALL)
_SETUP = ("python -m venv", ". .venv/bin/activate", "pip install")
_MAGIC = {".wav": b"RIFF", ".flac": b"fLaC"}
HANG_GUARD_S = 900  # a stuck command fails the test instead of holding CI
DOCS = README.parent / "docs"
_PYTHON = re.compile(r"<!-- offline-check -->\s*```python\n(?P<body>.*?)```", re.DOTALL)
_SAVED = re.compile(r"\.save\(\"(?P<name>[^\"]+)\"\)")
#: The one warning a README command prints on purpose: F5-TTS says whose voice it spoke with.
_EXPECTED_WARNINGS = ("Warning: no reference given: spoke with the default voice",)


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
    """The files a command names with ``-o`` (directories with ``/``), or a Python block
    saves."""
    if command.startswith("python _block"):
        return []
    words = shlex.split(command)
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word == "-o"]


def doc_pages() -> list[Path]:
    """README.md, then every docs page, in the order their commands run."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def all_commands(work: Path) -> list[tuple[str, list[str]]]:
    """``(command, files it writes)`` of every page's marked blocks, each command once: bash
    lines as :func:`readme_commands` gives them, a Python block written into ``work`` as a
    script run with ``python``."""
    found, seen = [], set()
    for page in doc_pages():
        text = page.read_text(encoding="utf-8")
        for command in readme_commands(text):
            if command not in seen:
                seen.add(command)
                found.append((command, _outputs(command)))
        for block in _PYTHON.finditer(text):
            script = work / f"_block{len(found)}.py"
            script.write_text(block["body"])
            found.append((f"python {script.name}", _SAVED.findall(block["body"])))
    return found


def _unexpected_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if ("Warning" in line or "Traceback" in line)
            and not line.startswith(_EXPECTED_WARNINGS)]


def test_the_readme_marks_the_offline_paths():
    commands = readme_commands(README.read_text(encoding="utf-8"))
    joined = "\n".join(commands)
    for needed in ("random-model f5tts/", "random-model voxcpm/", " --stream ", "--save-voice",
                   "--voice ", "mizuoto batch ", " -f story.txt", "--steps 4 --section-chars",
                   "mizuoto edit ", "mizuoto train ", "mizuoto bench random:",
                   "mizuoto serve ", "/v1/audio/speech"):
        assert needed in joined, f"README.md's offline commands have no {needed.strip()!r}"
    assert not any(step.startswith(_SETUP) for c in commands for step in c.split(" && "))
    # the reference cloning takes, for F5 too; the fine-tuning runs without a warning
    assert "--ref-audio vox-noise.wav --ref-text" in joined and "warmup_updates=" in joined
    assert _PYTHON.search(README.read_text(encoding="utf-8")), "the Python example is run"


def test_the_docs_task_pages_have_offline_commands():
    for page in ("first-speech.md", "cloning.md", "training.md", "weights.md"):
        text = (DOCS / page).read_text(encoding="utf-8")
        assert readme_commands(text), f"docs/{page} has no <!-- offline-check --> block"


def _children_cpu() -> float:
    """CPU seconds of the finished child processes so far (a loaded machine stretches wall
    time, not this)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _serving(server: subprocess.Popen, port: int) -> None:
    """Wait until the server answers ``/health`` (or has died, or the guard ran out)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        assert server.poll() is None, f"mizuoto serve exited: {server.stderr.read()[-3000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail("mizuoto serve did not answer /health")


def test_readme_offline_commands_run(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    commands = all_commands(work)
    bin_dir = str(Path(sys.executable).parent)  # this environment's mizuoto and python
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
           "MIZUOTO_HOME": str(tmp_path / "home"), "MIZUOTO_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1"}
    port, server, times = _free_port(), None, []
    try:
        for command, outputs in commands:
            command = command.replace("/tmp/", f"{tmp_path}/").replace("127.0.0.1:8000",
                                                                       f"127.0.0.1:{port}")
            if command.startswith("python _block"):
                script = work / command.split()[1]
                script.write_text(script.read_text().replace("/tmp/", f"{tmp_path}/"))
            started, cpu = time.monotonic(), _children_cpu()
            command, _, serve = command.partition(" && mizuoto serve ")
            if command.startswith("mizuoto serve "):
                command, serve = "true", command.removeprefix("mizuoto serve ")
            done = subprocess.run(["bash", "-c", command], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=HANG_GUARD_S)
            assert done.returncode == 0, \
                f"{command}\nexit {done.returncode}\n{done.stderr[-3000:]}"
            assert not _unexpected_warnings(done.stderr), f"{command}\n{done.stderr[-3000:]}"
            if serve:
                assert server is None, "one server at a time"
                server = subprocess.Popen(["bash", "-c", f"exec mizuoto serve {serve} --port "
                                           f"{port}"], cwd=work, env=env, text=True,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                _serving(server, port)
                command += f" && mizuoto serve {serve}"
            times.append((time.monotonic() - started, _children_cpu() - cpu, command))
            for output in outputs:
                path = work / output
                assert path.exists() and (path.is_dir() or path.stat().st_size > 0), \
                    f"{command} did not write {output}"
                magic = _MAGIC.get(path.suffix)
                assert magic is None or path.read_bytes()[:4] == magic, \
                    f"{command}: {output} is not a {path.suffix} file"
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
    assert server is not None, "the README's serve example was not run"
    for seconds, cpu, command in times:
        print(f"{seconds:6.1f} s wall {cpu:6.1f} s CPU  {command}")
