"""The page's routes and ``GET /v1/models``' cards, without a browser (the example plugin's toy
model, which loads in milliseconds); the page itself is driven in test_web_page.py."""

from __future__ import annotations

import re
from importlib import resources

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("mizuoto_example")

from mizuoto.serve import ServeConfig, serve_in_thread  # noqa: E402
from mizuoto.serve.page import FILES, page_url  # noqa: E402


@pytest.fixture(scope="module")
def toy_dirs(tmp_path_factory):
    from mizuoto_example.engine import write_tiny_model

    root = tmp_path_factory.mktemp("toys")
    write_tiny_model(root / "toy")
    write_tiny_model(root / "toy2", seed=1)
    return root


def test_the_page_is_open_without_the_key_and_the_api_is_not(toy_dirs, tmp_path):
    config = ServeConfig(models={"toy": str(toy_dirs / "toy")}, api_key="sesame",
                         voices_dir=tmp_path)
    with serve_in_thread(config) as url:
        page = httpx.get(f"{url}/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "connect-src 'self'" in policy
        for name in ("studio.js", "studio.css"):
            response = httpx.get(f"{url}/web/{name}")
            assert response.status_code == 200, name
            assert response.headers["content-type"] == FILES[name]
        for missing in ("index.html", "secret.txt", "..%2Fapp.py"):
            assert httpx.get(f"{url}/web/{missing}").status_code == 404, missing
        assert httpx.get(f"{url}/v1/models").status_code == 401
        # another path outside /web/ stays behind the key
        assert httpx.get(f"{url}/webx").status_code == 401
        # the open prefix leads nowhere else: dot segments sent as they are (no client
        # normalizing them) reach no API route
        for path in ("/web/../v1/models", "/web/%2e%2e/v1/models", "/web//v1/models"):
            status, body = _raw_get(url, path)
            assert status in (400, 404) and b'"data"' not in body, (path, status, body)


def _raw_get(url: str, path: str) -> tuple[int, bytes]:
    import socket

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                     .encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]), data


def test_the_page_loads_only_its_own_files():
    """Everything the page references is one of its files; nothing names another host."""
    web = resources.files("mizuoto.serve").joinpath("web")
    html = web.joinpath("index.html").read_text()
    referenced = re.findall(r'(?:src|href)="([^"#]+)"', html)
    assert sorted(referenced) == ["/web/studio.css", "/web/studio.js", "data:,"]
    for name in FILES:
        text = web.joinpath(name).read_text()
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.IGNORECASE), name


def test_the_pages_modules_are_its_folders_and_hold_no_server_value():
    """Each module the page imports is served from its folder (no list of files kept by
    hand), and no server value is written into the page: formats, limits, rates and the seed
    range come from GET /v1/models."""
    web = resources.files("mizuoto.serve").joinpath("web")
    on_disk = {item.name for item in web.iterdir() if item.is_file()}
    assert set(FILES) == on_disk
    for name in (n for n in FILES if n.endswith(".js")):
        text = web.joinpath(name).read_text()
        for imported in re.findall(r'^import .* from "\./([^"]+)";$', text, re.MULTILINE):
            assert imported in FILES, (name, imported)
        for value in ("24000", "4096", "4294967295", '"mp3"'):
            assert value not in text, (name, value)


def test_models_carry_the_card_the_page_needs(toy_dirs, tmp_path):
    config = ServeConfig(models={"toy": str(toy_dirs / "toy"), "toy2": str(toy_dirs / "toy2")},
                         voices_dir=tmp_path, max_loaded=1)
    with serve_in_thread(config) as url:
        entries = {e["id"]: e for e in httpx.get(f"{url}/v1/models").json()["data"]}
        toy = entries["toy"]
        assert {k: toy[k] for k in ("object", "created", "owned_by", "state")} == {
            "object": "model", "created": 0, "owned_by": "mizuoto-toy", "state": "ready"}
        assert toy["mizuoto"] == {
            "engine": "toy", "variant": "tiny", "sample_rate": 16000, "pcm_sample_rate": 24000,
            "capabilities": ["clone", "stream", "voice_cache", "zero_shot"], "streams": True,
            "license": "Apache-2.0", "non_commercial": False, "random_init": False,
            "max_input_chars": 4096,
            "sampler": {},
            "params": [{"name": "char_seconds", "default": 0.06, "kind": "float",
                        "model_default": False},
                       {"name": "max_seconds", "default": 30.0, "kind": "float",
                        "model_default": False}],
            "formats": toy["mizuoto"]["formats"],
        }
        assert sorted(toy["mizuoto"]["formats"]) == ["aac", "flac", "mp3", "opus", "pcm", "wav"]
        # not loaded yet (the second of --max-loaded 1): no card until it is
        assert entries["toy2"]["state"] == "unloaded" and entries["toy2"]["mizuoto"] is None
        # what every model shares, for a client without the card yet
        assert httpx.get(f"{url}/v1/models").json()["mizuoto"] == {
            "pcm_sample_rate": 24000, "max_input_chars": 4096, "seed_range": [0, 2**32 - 1],
            "formats": toy["mizuoto"]["formats"]}
        speech = httpx.post(f"{url}/v1/audio/speech", json={
            "model": "toy2", "input": "Hi.", "voice": "default", "response_format": "pcm"})
        assert speech.status_code == 200
        entries = {e["id"]: e for e in httpx.get(f"{url}/v1/models").json()["data"]}
        assert entries["toy2"]["mizuoto"]["engine"] == "toy"
        # the toy was unloaded to make room: it keeps the card it had
        assert entries["toy"]["state"] == "unloaded"
        assert entries["toy"]["mizuoto"] == toy["mizuoto"]


def test_a_model_directorys_defaults_are_the_cards(toy_dirs, tmp_path):
    import shutil

    from mizuoto.contracts.model_defaults import write_model_defaults

    shutil.copytree(toy_dirs / "toy", tmp_path / "slow")
    write_model_defaults(tmp_path / "slow", {"char_seconds": 0.1}, "a slower demo")
    config = ServeConfig(models={"slow": str(tmp_path / "slow")}, voices_dir=tmp_path / "v")
    with serve_in_thread(config) as url:
        card = httpx.get(f"{url}/v1/models").json()["data"][0]["mizuoto"]
    assert card["params"][0] == {"name": "char_seconds", "default": 0.1, "kind": "float",
                                 "model_default": True}
    assert card["params"][1]["model_default"] is False


def test_a_random_model_says_so_in_its_card(toy_dirs, tmp_path):
    """``mizuoto random-model`` marks the directory of a fixture declared random-init (the
    example's toy is, by the default); the card of a marked directory says random_init, that
    of a directory written otherwise does not."""
    from click.testing import CliRunner

    from mizuoto.cli import cli
    from mizuoto.contracts.fixtures import RANDOM_INIT_FILE
    from mizuoto.registry import random_models

    assert random_models()["toy/tiny"].random_init
    result = CliRunner().invoke(cli, ["random-model", "toy/tiny", str(tmp_path / "noise")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "noise" / RANDOM_INIT_FILE).is_file()
    config = ServeConfig(models={"noise": str(tmp_path / "noise"), "toy": str(toy_dirs / "toy")},
                         voices_dir=tmp_path / "v")
    with serve_in_thread(config) as url:
        cards = {e["id"]: e["mizuoto"] for e in httpx.get(f"{url}/v1/models").json()["data"]}
    assert cards["noise"]["random_init"] is True and cards["toy"]["random_init"] is False


def test_the_page_url_for_each_host():
    assert page_url("127.0.0.1", 8000) == "http://127.0.0.1:8000/"
    assert page_url("0.0.0.0", 9000) == "http://127.0.0.1:9000/"
    assert page_url("::1", 80) == "http://[::1]:80/"
    assert page_url("studio.lan", 8000) == "http://studio.lan:8000/"


def test_mizuoto_serve_prints_the_pages_url(monkeypatch, tmp_path):
    from click.testing import CliRunner

    import mizuoto.serve.app
    from mizuoto.cli import cli

    served = []
    monkeypatch.setattr(mizuoto.serve.app, "run", served.append)
    (tmp_path / "toy").mkdir()
    result = CliRunner().invoke(cli, ["serve", "-m", str(tmp_path / "toy"), "--port", "8123"],
                                obj={})
    assert result.exit_code == 0, result.output
    assert "http://127.0.0.1:8123/" in result.output
    assert served[0].port == 8123 and dict(served[0].models) == {"toy": str(tmp_path / "toy")}
