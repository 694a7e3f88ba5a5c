"""OpenMP's wait policy is set before torch is imported, on every path that loads a model.

OpenMP reads ``OMP_WAIT_POLICY`` once, when torch is imported; a path that imports torch first
(``say --voice`` once read the voice file before setting it) runs with libgomp's spinning
default, which on a busy machine takes the cores the request waits on. Each path runs in a
fresh process whose import of torch is intercepted: the process prints the policy in its
environment at that moment and exits, so no model loads and the check takes a second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mizuoto_example", reason="the toy engine is the model these paths load")

#: Run first in the child: stops it at its first import of torch, printing the policy then.
_WATCH = """
import importlib.abc, os, sys

class _Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.stdout.write("POLICY-AT-TORCH " + os.environ.get("OMP_WAIT_POLICY", "unset")
                             + "\\n")
            sys.stdout.flush()
            os._exit(0)
        return None

sys.meta_path.insert(0, _Watch())
"""

_CLI = _WATCH + """
sys.argv = ["mizuoto", *__ARGS__]
from mizuoto.cli import main
main()
"""

_PASSIVE = ["--option", "compute.cpu_wait_policy=passive"]


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    from mizuoto_example.engine import write_tiny_model

    folder = tmp_path_factory.mktemp("toy")
    write_tiny_model(folder / "model")
    # a voice file's tensors are read as torch tensors: the header is all this needs
    from safetensors.numpy import save_file

    save_file({"waveform": np.zeros(4, np.float32)}, str(folder / "voice.safetensors"),
              metadata={"format": "mizuoto-voice"})
    (folder / "ref.wav").write_bytes(b"")
    (folder / "lines.txt").write_text("Hello.\n")
    return folder


def _policy_at_torch(code: str, cwd: Path) -> str:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("OMP_WAIT_POLICY", "LD_PRELOAD", "OMP_PROC_BIND", "OMP_PLACES")}
    environment.update(MIZUOTO_PLUGINS="toy", MIZUOTO_HOME=str(cwd / "home"),
                       MIZUOTO_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("POLICY-AT-TORCH ")]
    assert lines, f"torch was never imported (exit {done.returncode}): {done.stderr[-2000:]}"
    return lines[0].split()[1]


#: (arguments, the policy asked for: explicit passive, or a long-lived command's auto)
COMMANDS = {
    "say": ["say", "-m", "model", "-o", "out.wav", *_PASSIVE, "Hello."],
    "say --voice": ["say", "-m", "model", "--voice", "voice.safetensors", "-o", "out.wav",
                    *_PASSIVE, "Hello."],
    "edit": ["edit", "-m", "model", "--ref-audio", "ref.wav", "--ref-text", "Hi.", "--segment",
             "0:0.1", "-o", "out.wav", *_PASSIVE, "Hello."],
    "batch": ["batch", "lines.txt", "-m", "model", "-o", "out"],
    "serve": ["serve", "-m", "model", "--port", "65432"],
    "wyoming": ["wyoming", "-m", "model", "--port", "65432"],
    "train": ["train", "-e", "toy", "-m", "model", "--data", "lines.txt", "--output", "run",
              *_PASSIVE],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_sets_the_policy_before_torch(toy, name):
    if name == "wyoming":
        pytest.importorskip("wyoming", reason="mizuoto wyoming needs the wyoming extra")
    if name == "serve":
        pytest.importorskip("fastapi", reason="mizuoto serve needs the serve extra")
    code = _CLI.replace("__ARGS__", json.dumps(COMMANDS[name]))
    assert _policy_at_torch(code, toy) == "PASSIVE"


@pytest.mark.parametrize("call", [
    "mizuoto.load('model', options={'compute': {'cpu_wait_policy': 'passive'}})",
    "mizuoto.Voice.load('voice.safetensors')",
])
def test_the_python_api_sets_the_policy_before_torch(toy, call):
    """The library's first torch-importing call sets it too (``auto`` here: passive on a busy
    machine, active on an idle one; an explicit choice is taken as asked)."""
    seen = _policy_at_torch(_WATCH + f"import mizuoto\n{call}\n", toy)
    assert seen == "PASSIVE" if "passive" in call else seen in ("PASSIVE", "ACTIVE")


def test_say_voice_reports_the_passive_policy_it_asked_for(toy, tmp_path):
    """End to end: a saved voice read before the model loads, then the result reports the
    policy in effect; asking for passive explicitly is not refused."""
    from mizuoto_example.engine import write_tiny_model

    write_tiny_model(tmp_path / "model")
    environment = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    environment.update(MIZUOTO_PLUGINS="toy", MIZUOTO_HOME=str(tmp_path / "home"))
    base = [sys.executable, "-m", "mizuoto", "say", "-m", str(tmp_path / "model"), "--seed", "1",
            *_PASSIVE]
    made = subprocess.run([*base, "--ref-audio", str(_tone(tmp_path / "ref.wav")),
                           "--save-voice", str(tmp_path / "v.safetensors"), "-o",
                           str(tmp_path / "a.wav"), "Hello."],
                          env=environment, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    again = subprocess.run([*base, "--voice", str(tmp_path / "v.safetensors"), "-o",
                            str(tmp_path / "b.wav"), "Hello again."],
                           env=environment, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "cpu_wait_policy=passive" in again.stderr, again.stderr


def _tone(path: Path) -> Path:
    import numpy as np
    import soundfile

    t = np.arange(16000) / 16000
    soundfile.write(path, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000)
    return path
