"""docs/weights.md's offline recipes, followed end to end on files laid out as the real ones.

The weights are random and the model tiny (``mizuoto random-model f5tts/tiny-v1-base``), but
every file has the name and place the real ``f5tts/v1-base`` has on the hub: a copied
Hugging Face cache is found, and so is a folder filled by ``mizuoto models ID --curl``'s
downloads (copied here instead of downloaded) and copied to ``$MIZUOTO_HOME/models/``.
``mizuoto models ID`` is the one command that verifies either. Also: the hub probe goes
through huggingface_hub's session, so a proxy in the environment is used as the download
would use it.
"""

from __future__ import annotations

import http.server
import os
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("mizuoto_f5tts", reason="the recipe is followed for f5tts/v1-base")
pytest.importorskip("huggingface_hub", reason="a Hugging Face cache is read with it")

MODEL = "f5tts/v1-base"
_COMMIT = "0123456789abcdef0123456789abcdef01234567"  # a snapshot's name: a commit hash


def _mizuoto(*args: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mizuoto", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def random_files(tmp_path_factory) -> Path:
    """A tiny random F5 model directory with the real model's file names."""
    folder = tmp_path_factory.mktemp("weights") / "f5-random"
    done = _mizuoto("random-model", "f5tts/tiny-v1-base", str(folder), env=_offline({}),
                    cwd=folder.parent)
    assert done.returncode == 0, done.stderr
    return folder


def _offline(extra: dict) -> dict:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return {**environment, "HF_HUB_OFFLINE": "1", "MIZUOTO_OFFLINE": "1", **extra}


def _entry():
    from mizuoto.registry import catalog

    return catalog()[MODEL]


def test_a_copied_hugging_face_cache_is_found_and_speaks(random_files, tmp_path):
    # the cache as huggingface_hub leaves it: models--ORG--NAME/snapshots/COMMIT/FILE, and
    # refs/main naming the commit (blobs are where the snapshot's links point; copies do too)
    cache = tmp_path / "hf" / "hub"
    for name, hub_file in _entry().files.items():
        repo = cache / f"models--{hub_file.repo.replace('/', '--')}"
        target = repo / "snapshots" / _COMMIT / hub_file.filename
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(random_files / name, target)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(_COMMIT)
    env = _offline({"HF_HUB_CACHE": str(cache), "MIZUOTO_HOME": str(tmp_path / "home")})

    listed = _mizuoto("models", MODEL, env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert f"{MODEL}: 4 of 4 files here" in listed.stdout, listed.stdout
    assert "missing" not in listed.stdout
    spoken = _mizuoto("say", "-m", MODEL, "--seed", "1", "Hello.", "-o", "out.wav", env=env,
                      cwd=tmp_path)
    assert spoken.returncode == 0, spoken.stderr
    assert (tmp_path / "out.wav").read_bytes()[:4] == b"RIFF"


def test_the_curl_downloads_copied_to_the_model_home_are_found(random_files, tmp_path):
    home = tmp_path / "home"
    env = _offline({"MIZUOTO_HOME": str(home), "HF_HUB_CACHE": str(tmp_path / "empty")})
    before = _mizuoto("models", MODEL, env=env, cwd=tmp_path)
    assert "0 of 4 files here" in before.stdout, before.stdout
    for name, hub_file in _entry().files.items():  # every file: its URL and its destination
        assert f"  {name}  missing" in before.stdout
        assert (f"https://huggingface.co/{hub_file.repo}/resolve/main/{hub_file.filename}"
                in before.stdout)
        assert f"goes to {home / 'models' / 'f5tts--v1-base' / name}" in before.stdout

    script = _mizuoto("models", MODEL, "--curl", env=env, cwd=tmp_path).stdout.splitlines()
    assert len(script) == 4
    elsewhere = tmp_path / "elsewhere"  # the machine with a network: each download, copied
    for line in script:
        words = shlex.split(line)
        assert words[:4] == ["curl", "-L", "--create-dirs", "-o"]
        destination, url = words[4], words[5]
        name = destination.split("/", 1)[1]
        assert url == f"https://huggingface.co/{_entry().files[name].repo}/resolve/main/" \
            f"{_entry().files[name].filename}"
        (elsewhere / destination).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(random_files / name, elsewhere / destination)
    (home / "models").mkdir(parents=True)
    shutil.copytree(elsewhere / "f5tts--v1-base", home / "models" / "f5tts--v1-base")

    after = _mizuoto("models", MODEL, env=env, cwd=tmp_path)
    assert "4 of 4 files here" in after.stdout, after.stdout
    listing = _mizuoto("models", env=env, cwd=tmp_path).stdout
    assert any(line.startswith(MODEL) and "downloaded" in line for line in listing.splitlines())


def test_a_mirror_names_its_urls(tmp_path):
    env = _offline({"MIZUOTO_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(tmp_path),
                    "HF_ENDPOINT": "https://mirror.example/"})
    listed = _mizuoto("models", MODEL, "--curl", env=env, cwd=tmp_path).stdout
    assert "https://mirror.example/SWivid/F5-TTS/resolve/main/F5TTS_v1_Base/" in listed


class _Proxy(http.server.BaseHTTPRequestHandler):
    """A forward proxy that answers every request itself (the hub beyond it is not needed)."""

    seen: list[str] = []

    def do_HEAD(self):
        _Proxy.seen.append(self.path)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


_PROBE = """
from mizuoto import catalog
print("REACHABLE" if catalog._hub_reachable(timeout=10) else "UNREACHABLE")
"""


def test_the_hub_probe_goes_through_the_environments_proxy(tmp_path):
    """An endpoint that only the proxy can reach (a name that never resolves): a direct
    connection would call the hub unreachable; huggingface_hub's session asks the proxy."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = {k: v for k, v in os.environ.items()
                if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
                and not k.startswith("HF_")}
        base["HF_ENDPOINT"] = "http://hub.mizuoto.invalid"
        direct = subprocess.run([sys.executable, "-c", _PROBE], env=base, capture_output=True,
                                text=True, timeout=120)
        assert direct.stdout.strip() == "UNREACHABLE", direct.stderr
        proxied = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120,
            env={**base, "HTTP_PROXY": f"http://127.0.0.1:{server.server_address[1]}"})
        assert proxied.stdout.strip() == "REACHABLE", proxied.stderr
        assert any("hub.mizuoto.invalid" in path for path in _Proxy.seen)
    finally:
        server.shutdown()
