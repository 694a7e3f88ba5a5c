"""``mizuoto serve`` as a process: it starts on a random-init model offline, and SIGTERM lets
the request in flight finish before the process exits. Also ``mizuoto say -o`` in the
server's lossy formats."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("mizuoto_f5tts")

import soundfile as sf  # noqa: E402

from mizuoto.serve.app import wait_healthy  # noqa: E402


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _running(url: str) -> bool:
    return 'mizuoto_queue_depth{model="f5"} 1' in httpx.get(f"{url}/metrics").text


@pytest.fixture(scope="module")
def f5_dir(tmp_path_factory):
    from mizuoto_f5tts.fixtures import write_random_model_dir

    directory = tmp_path_factory.mktemp("serve-process") / "f5"
    write_random_model_dir(directory, "v1_base", size="tiny")
    return directory


@pytest.mark.parametrize("suffix", [".mp3", ".ogg", ".opus"])
def test_say_writes_mp3_and_opus(f5_dir, tmp_path, suffix):
    from click.testing import CliRunner

    from mizuoto.cli import cli

    output = tmp_path / f"out{suffix}"
    result = CliRunner().invoke(cli, ["say", "-m", str(f5_dir), "Hello.", "--steps", "2",
                                      "--seed", "1", "-o", str(output)], obj={})
    assert result.exit_code == 0, result.output
    info = sf.info(str(output))
    assert info.samplerate == 24000 and info.frames > 0


def test_sigterm_finishes_the_request_in_flight(f5_dir, tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MIZUOTO_HOME": str(tmp_path / "home"), "MIZUOTO_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "mizuoto", "serve", "-m", str(f5_dir), "--port",
         str(port), "--grace", "60"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_healthy(url, process)
        outcome = {}

        def speak() -> None:
            body = {"model": "f5", "input": "A request that is in flight at shutdown.",
                    "voice": "default", "response_format": "wav",
                    "mizuoto": {"seed": 1, "steps": 24, "stream": False}}
            outcome["response"] = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=120)

        thread = threading.Thread(target=speak)
        thread.start()
        deadline = time.monotonic() + 30
        while not _running(url) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _running(url), "the request never started"
        process.send_signal(signal.SIGTERM)
        thread.join(120)
        response = outcome["response"]
        assert response.status_code == 200
        assert sf.info(io.BytesIO(response.content)).frames > 0
        # uvicorn re-raises the signal once it has shut down: the process ends by SIGTERM
        assert process.wait(60) in (0, -signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
