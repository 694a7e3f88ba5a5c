"""One known-keys rule for a request's params (``contracts.engine.check_param_keys``): the
same refusal, word for word, before the model loads (``mizuoto.load(request=...)``, batch's
``ModelLoader.check``, ``mizuoto edit``'s ``check_params_before_load``) and in
``Engine.plan``."""

from __future__ import annotations

import pytest
from conftest import FakeEngine, make_plugin
from stub_engines import StubEngine

import mizuoto
from mizuoto import Applied, Audio, SynthesisRequest, SynthesisResult, registry
from mizuoto.batch import ModelLoader
from mizuoto.errors import InvalidRequest
from mizuoto.loading import check_params_before_load


class Silent(StubEngine):
    """Plugin API 1.1 without a ``params_class``: it takes no params."""

    name = "silent"

    def _synthesize(self, request, params, generator, progress):
        raise AssertionError("the tests only plan")


class ReadsItsOwn(StubEngine):
    """Plugin API 1.0 without a ``params_class``: it reads ``request.params`` itself."""

    name = "reads-its-own"

    def synthesize(self, request, *, progress=None):
        applied = Applied(self.name, "m", 0, False, "float32", "cpu")
        return SynthesisResult(Audio([0.0] * 80, 8000), applied)


@pytest.fixture
def model_dir(no_plugins, tmp_path):
    no_plugins.register(make_plugin("keys_plugin", engines=(FakeEngine, Silent, ReadsItsOwn),
                                    trainers=(), models=(), fixtures=()), name="keys_plugin")
    registry.clear_cache()
    (tmp_path / "model").mkdir()
    return tmp_path / "model"


def _refusals(model_dir, engine, params):
    """Each path's refusal of ``params`` (its message), or None where they pass."""
    request = SynthesisRequest("Hello.", params=params)
    paths = {
        "load": lambda: mizuoto.load(model_dir, engine=engine, request=request),
        "batch": lambda: ModelLoader(model_dir, engine=engine).check(params),
        "edit": lambda: check_params_before_load(model_dir, params, engine=engine),
        "plan": lambda: mizuoto.load(model_dir, engine=engine).plan(request),
    }
    refusals = {}
    for path, call in paths.items():
        try:
            call()
        except InvalidRequest as exc:
            refusals[path] = (exc.field, str(exc))
        else:
            refusals[path] = None
    return refusals


def test_an_unknown_key_is_refused_alike_before_the_load_and_in_plan(model_dir):
    refusals = _refusals(model_dir, "fake", {"sped": 2.0})
    assert len(set(refusals.values())) == 1, refusals
    field, message = refusals["plan"]
    assert field == "params.sped" and "did you mean speed?" in message


def test_an_engine_without_params_refuses_every_key_on_every_path(model_dir):
    """Batch's check used to let these through (it checked a ``params_class`` only), to
    fail every line at the engine's plan."""
    refusals = _refusals(model_dir, "silent", {"speed": 1.0})
    assert len(set(refusals.values())) == 1, refusals
    field, message = refusals["batch"]
    assert field == "params.speed" and "this engine takes none" in message


def test_an_api_1_0_engine_reading_its_own_params_is_asked_at_the_request(model_dir):
    assert _refusals(model_dir, "reads-its-own", {"anything": 1}) == dict.fromkeys(
        ("load", "batch", "edit", "plan"))
