"""Model resolution: local directories, catalog ids, the MIZUOTO_HOME cache, offline errors."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
from conftest import FAKE_ENTRY

from mizuoto import CatalogEntry, HubFile, catalog, resolve_model
from mizuoto.errors import ModelFilesMissing, ModelNotFound

CATALOG = {FAKE_ENTRY.id: FAKE_ENTRY}


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty MIZUOTO_HOME, no hub reachable, and a download that must not happen."""
    monkeypatch.setenv("MIZUOTO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MIZUOTO_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(catalog, "_hub_cached", lambda hub_file, filename: None)
    return tmp_path / "home"


def _fake_hub(monkeypatch) -> types.ModuleType:
    """Online, with a stand-in huggingface_hub whose download the test provides."""
    monkeypatch.delenv("MIZUOTO_OFFLINE")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    module = types.ModuleType("huggingface_hub")
    monkeypatch.setitem(sys.modules, "huggingface_hub", module)
    return module


def _fill(directory: Path, names) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_text(name)


def test_a_local_directory_is_used_as_is(tmp_path, home):
    resolved = resolve_model(tmp_path, catalog=CATALOG)
    assert resolved.path == tmp_path.resolve() and resolved.entry is None
    assert resolved.id == str(tmp_path.resolve())
    assert resolve_model(str(tmp_path), catalog={}).path == tmp_path.resolve()


def test_unknown_id_lists_known_ids(home):
    with pytest.raises(ModelNotFound, match="'fake/large' is neither a directory nor a catalog "
                                            "id: no such directory .*; known ids: fake/base"):
        resolve_model("fake/large", catalog=CATALOG)
    with pytest.raises(ModelNotFound, match=r"none \(no engine installed\)"):
        resolve_model("fake/large", catalog={})


def test_a_mistyped_directory_names_the_nearest_one(tmp_path, home, monkeypatch):
    (tmp_path / "models" / "f5-random").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFound, match=r"no such directory \(did you mean "
                                            r"models/f5-random\?\)"):
        resolve_model("models/f5-randon", catalog=CATALOG)
    with pytest.raises(ModelNotFound, match=r"did you mean fake/base\?"):
        resolve_model("fake/bse", catalog=CATALOG)


def test_the_registered_catalog_is_used_by_default(fake_plugin, home):
    with pytest.raises(ModelNotFound, match="known ids: fake/base"):
        resolve_model("fake/large")
    with pytest.raises(ModelFilesMissing):
        resolve_model("fake/base")


def test_offline_lists_missing_files_and_the_local_directory_hint(home):
    _fill(catalog.model_cache_dir(FAKE_ENTRY), ["fake.json"])
    with pytest.raises(ModelFilesMissing) as raised:
        resolve_model("fake/base", catalog=CATALOG)
    error = raised.value
    assert error.location == "fake/base"
    # repository and file apart, so that a URL can be built from them
    assert error.missing == ["weights.bin (repository mizuoto-test/fake, file weights.bin)"]
    assert "put the files in a directory and pass it instead of the id" in str(error)
    assert "`mizuoto models fake/base` names each file's URL" in str(error)
    assert "--model /path/to/fake-base" in str(error)


def test_files_in_mizuoto_home_resolve_without_network(home, monkeypatch):
    def no_download(*args, **kwargs):
        raise AssertionError("nothing is missing: no download may be tried")

    monkeypatch.setattr(catalog, "_download", no_download)
    directory = home / "models" / "fake--base"
    _fill(directory, ["fake.json", "weights.bin"])
    resolved = resolve_model("fake/base", catalog=CATALOG)
    assert resolved.path == directory and resolved.entry is FAKE_ENTRY
    assert resolved.id == "fake/base"


def test_optional_files_may_be_missing(home):
    entry = CatalogEntry("fake/lite", "fake",
                         {"fake.json": HubFile("r", "fake.json"), "vocab.txt": HubFile("r", "v")},
                         "MIT", optional={"vocab.txt"})
    _fill(catalog.model_cache_dir(entry), ["fake.json"])
    assert resolve_model("fake/lite", catalog={entry.id: entry}).entry is entry


def test_files_in_the_hub_cache_are_linked_into_mizuoto_home(home, monkeypatch, tmp_path):
    hub = tmp_path / "hub"
    _fill(hub, ["fake.json", "weights.bin"])
    monkeypatch.setattr(catalog, "_hub_cached", lambda hub_file, filename: hub / filename)
    resolved = resolve_model("fake/base", catalog=CATALOG)
    link = resolved.path / "weights.bin"
    assert link.is_symlink() and link.resolve() == (hub / "weights.bin").resolve()
    assert link.read_text() == "weights.bin"


def test_online_downloads_the_missing_files(home, monkeypatch, tmp_path):
    huggingface_hub = _fake_hub(monkeypatch)
    monkeypatch.setattr(catalog, "_hub_reachable", lambda: True)
    fetched = []

    def fake_download(repo, filename, revision=None):
        fetched.append((repo, filename))
        _fill(tmp_path / "hub", [filename])
        return str(tmp_path / "hub" / filename)

    huggingface_hub.hf_hub_download = fake_download
    progress = []
    resolved = resolve_model("fake/base", catalog=CATALOG, progress=progress.append)
    assert sorted(fetched) == [("mizuoto-test/fake", "fake.json"),
                               ("mizuoto-test/fake", "weights.bin")]
    assert (resolved.path / "fake.json").read_text() == "fake.json"
    assert progress[-1].stage == "download" and progress[-1].done == progress[-1].total == 2


def test_an_unreachable_hub_fails_before_any_download(home, monkeypatch):
    huggingface_hub = _fake_hub(monkeypatch)
    monkeypatch.setattr(catalog, "_hub_reachable", lambda: False)
    tried = []
    huggingface_hub.hf_hub_download = lambda repo, filename, revision=None: tried.append(filename)
    with pytest.raises(ModelFilesMissing) as raised:
        resolve_model("fake/base", catalog=CATALOG)
    assert tried == []
    assert len(raised.value.missing) == 2


def test_an_alternative_file_name_is_used_when_the_first_is_absent(home, monkeypatch, tmp_path):
    huggingface_hub = _fake_hub(monkeypatch)
    monkeypatch.setattr(catalog, "_hub_reachable", lambda: True)
    entry = CatalogEntry(id="fake/alt", engine="fake", license="MIT", files={
        "model.safetensors": HubFile("mizuoto-test/fake", "model.safetensors",
                                     alternatives=["pytorch_model.bin"])})

    def only_bin(repo, filename, revision=None):
        if filename != "pytorch_model.bin":
            raise FileNotFoundError(filename)
        _fill(tmp_path / "hub", [filename])
        return str(tmp_path / "hub" / filename)

    huggingface_hub.hf_hub_download = only_bin
    resolved = resolve_model("fake/alt", catalog={"fake/alt": entry})
    assert (resolved.path / "pytorch_model.bin").read_text() == "pytorch_model.bin"
    assert not (resolved.path / "model.safetensors").exists()


def test_download_false_never_downloads(home, monkeypatch):
    monkeypatch.delenv("MIZUOTO_OFFLINE")
    monkeypatch.setattr(catalog, "_download", lambda *a: pytest.fail("download attempted"))
    with pytest.raises(ModelFilesMissing):
        resolve_model("fake/base", catalog=CATALOG, download=False)


def test_a_stale_link_in_mizuoto_home_is_replaced(home, monkeypatch, tmp_path):
    hub = tmp_path / "hub"
    _fill(hub, ["fake.json", "weights.bin"])
    directory = catalog.model_cache_dir(FAKE_ENTRY)
    directory.mkdir(parents=True)
    (directory / "weights.bin").symlink_to(tmp_path / "deleted-blob")  # e.g. a cleared hub cache
    monkeypatch.setattr(catalog, "_hub_cached", lambda hub_file, filename: hub / filename)
    resolved = resolve_model("fake/base", catalog=CATALOG)
    assert (resolved.path / "weights.bin").read_text() == "weights.bin"


def test_hub_cache_is_read_only_for_repositories_it_holds(tmp_path, monkeypatch):
    """A file in huggingface_hub's cache is found; a repository with no folder there is
    answered without asking huggingface_hub (importing it costs `mizuoto models` time)."""
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    snapshot = tmp_path / "models--acme--tts" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--acme--tts" / "refs").mkdir()
    (tmp_path / "models--acme--tts" / "refs" / "main").write_text("abc123")
    assert catalog._hub_cached(HubFile("acme/tts", "config.json"), "config.json") == \
        snapshot / "config.json"
    monkeypatch.delitem(sys.modules, "huggingface_hub")  # imported again if it were asked
    assert catalog._hub_cached(HubFile("acme/other", "config.json"), "config.json") is None
    assert "huggingface_hub" not in sys.modules


def test_an_entry_without_files_resolves_to_an_existing_directory(home):
    entry = CatalogEntry(id="rules/en", engine="rules", files={}, license="MIT")
    resolved = resolve_model("rules/en", catalog={"rules/en": entry}, download=False)
    assert resolved.path.is_dir() and resolved.entry is entry


def _missing_hint() -> str:
    with pytest.raises(ModelFilesMissing) as raised:
        resolve_model("fake/base", catalog=CATALOG)
    return str(raised.value)


def test_offline_by_setting_says_so(home, monkeypatch):
    hint = _missing_hint()
    # the hint is a sentence of its own: it starts with a capital
    assert ". Downloads are off (HF_HUB_OFFLINE or MIZUOTO_OFFLINE is set)." in hint
    assert "No model hub is reachable" not in hint and "not installed" not in hint


def test_without_huggingface_hub_says_it_is_not_installed(home, monkeypatch):
    monkeypatch.delenv("MIZUOTO_OFFLINE")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    monkeypatch.setattr(catalog, "_hub_reachable", lambda: pytest.fail("hub tried"))
    hint = _missing_hint()
    assert "The huggingface_hub package is not installed (pip install 'mizuoto-core[hub]')" in hint
    assert "reachable" not in hint


def test_an_unreachable_hub_says_so_and_not_that_the_hub_is_missing(home, monkeypatch):
    _fake_hub(monkeypatch)
    monkeypatch.setattr(catalog, "_hub_reachable", lambda: False)
    hint = _missing_hint()
    assert "No model hub is reachable from here (" in hint
    assert "HTTPS_PROXY for a proxy or HF_ENDPOINT for a mirror" in hint
    assert "not installed" not in hint


def test_a_failed_download_says_it_failed(home, monkeypatch):
    huggingface_hub = _fake_hub(monkeypatch)
    monkeypatch.setattr(catalog, "_hub_reachable", lambda: True)

    def refuse(repo, filename, revision=None):
        raise OSError("403")

    huggingface_hub.hf_hub_download = refuse
    hint = _missing_hint()
    assert "The download failed" in hint and "reachable" not in hint
