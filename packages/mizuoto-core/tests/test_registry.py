"""The registry: what plugins registered, duplicate names, and errors when nothing is there."""

from __future__ import annotations

import pytest
from conftest import FAKE_ENTRY, FAKE_FIXTURE, FakeEngine, FakeTrainer, make_plugin

import mizuoto
from mizuoto import registry
from mizuoto.errors import EngineNotFound, InvalidOption, MizuotoError, ModelNotFound


def test_collects_what_the_plugin_registered(fake_plugin):
    assert registry.engines() == {"fake": FakeEngine}
    assert registry.trainers() == {("fake", "FakeTrainer"): FakeTrainer}
    assert registry.catalog() == {"fake/base": FAKE_ENTRY}
    assert registry.contract_fixtures() == {"fake/tiny": FAKE_FIXTURE}
    assert registry.get_engine("fake") is FakeEngine
    assert registry.get_trainer("fake") is FakeTrainer


def test_results_are_cached_until_cleared(fake_plugin):
    assert registry.engines() is registry.engines()
    fake_plugin.register(make_plugin("more", engines=(type("More", (FakeEngine,),
                                                           {"name": "more"}),),
                                     trainers=(), models=(), fixtures=()), name="more")
    assert "more" not in registry.engines()
    registry.clear_cache()
    assert sorted(registry.engines()) == ["fake", "more"]


def test_the_same_class_from_two_plugins_is_not_a_clash(fake_plugin):
    fake_plugin.register(make_plugin("again"), name="again")
    registry.clear_cache()
    assert registry.engines() == {"fake": FakeEngine}


@pytest.mark.parametrize("kind, plugin_kwargs, collect", [
    ("engine", {"engines": (type("Other", (FakeEngine,), {}),)}, registry.engines),
    ("model", {"models": (mizuoto.CatalogEntry("fake/base", "fake", {}, "MIT"),)},
     registry.catalog),
    ("contract fixture", {"fixtures": (mizuoto.ContractFixture("fake", "tiny", print),)},
     registry.contract_fixtures),
])
def test_duplicate_names_are_an_error(fake_plugin, kind, plugin_kwargs, collect):
    empty = {"engines": (), "trainers": (), "models": (), "fixtures": ()}
    fake_plugin.register(make_plugin("clash", **{**empty, **plugin_kwargs}), name="clash")
    registry.clear_cache()
    with pytest.raises(MizuotoError, match=f"two plugins register the {kind} 'fake"):
        collect()


def test_no_engine_installed_says_how_to_install_one(no_plugins):
    assert registry.engines() == {}
    with pytest.raises(EngineNotFound, match="no engine is: pip install ./packages/mizuoto-f5tts "):
        registry.get_engine("f5tts")
    with pytest.raises(EngineNotFound, match="no trainer is installed for engine 'f5tts'"):
        registry.get_trainer("f5tts")


def test_unknown_engine_lists_the_installed_ones(fake_plugin):
    with pytest.raises(EngineNotFound, match="'voxcpm' is not installed; installed: fake"):
        registry.get_engine("voxcpm")


def test_load_picks_the_engine_that_recognizes_the_directory(fake_plugin, tmp_path):
    (tmp_path / "fake.json").write_text("{}")
    engine = mizuoto.load(tmp_path)
    assert isinstance(engine, FakeEngine)
    assert engine.info.model == str(tmp_path.resolve())
    options = mizuoto.Options.from_mapping({"engines.fake.level": 3})
    assert mizuoto.load(tmp_path, engine="fake", options=options).options.level == 3


def test_load_refuses_to_guess(fake_plugin, tmp_path):
    with pytest.raises(EngineNotFound, match=r"no installed engine \(fake\) recognizes .* "
                       r"name the engine \(-e NAME in the CLI, engine=NAME in Python\)"):
        mizuoto.load(tmp_path)


@pytest.mark.parametrize(("files", "package"), [
    (("vocos/config.yaml", "model_1200000.safetensors"), "mizuoto-f5tts"),
    (("config.json", "audiovae.pth", "model.safetensors"), "mizuoto-voxcpm"),
])
def test_a_published_engines_folder_names_the_package_to_install(no_plugins, tmp_path, files,
                                                                 package):
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    with pytest.raises(EngineNotFound, match=rf"installed: none\): pip install \./packages/{package} "):
        mizuoto.load(tmp_path)


def test_an_unknown_folder_without_engines_says_to_install_one(no_plugins, tmp_path):
    with pytest.raises(EngineNotFound,
                       match="no engine is installed .*pip install ./packages/mizuoto-f5tts"):
        mizuoto.load(tmp_path)


def test_load_checks_engine_options_before_loading(fake_plugin, tmp_path):
    options = mizuoto.Options(engines={"fake": {"no_such_option": 1}})
    with pytest.raises(InvalidOption, match="engines.fake.no_such_option"):
        mizuoto.load(tmp_path, engine="fake", options=options)


def test_load_of_an_unknown_id_lists_the_catalog(fake_plugin):
    with pytest.raises(ModelNotFound, match="known ids: fake/base"):
        mizuoto.load("fake/nothing")
