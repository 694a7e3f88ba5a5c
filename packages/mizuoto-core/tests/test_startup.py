"""Fast start: ``import mizuoto`` and the listing commands import no torch, engines registered
as ``EngineRef`` are imported on first use, and progress is drawn only on a terminal.

The import checks run in a fresh interpreter: in this process other tests have imported torch.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner
from conftest import FakeEngine, FakeOptions, make_plugin

import mizuoto
from mizuoto import Capability, EngineRef, Progress, registry
from mizuoto.cli import cli
from mizuoto.commands.toolkit import ProgressBars, ProgressLog, command_progress
from mizuoto.errors import EngineNotFound, InvalidOption, MizuotoError

# Modules that take a second or more, or tens of MB, to import.
HEAVY = ("torch", "numpy", "scipy", "librosa", "soundfile", "soxr", "safetensors",
         "huggingface_hub", "transformers")


def _heavy_modules_after(code: str, tmp_path) -> dict:
    """Run ``code`` in a fresh interpreter; which HEAVY modules it imported, and its stdout."""
    script = textwrap.dedent(code) + textwrap.dedent(f"""
        import json, sys
        print(json.dumps({{"heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
    """)
    env = {**os.environ, "MIZUOTO_HOME": str(tmp_path / "home"),
           "HF_HUB_CACHE": str(tmp_path / "hub")}
    env.pop("MIZUOTO_PLUGINS", None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    *output, last = done.stdout.strip().splitlines()
    return {**json.loads(last), "output": "\n".join(output)}


def test_import_mizuoto_imports_no_torch(tmp_path):
    assert _heavy_modules_after("import mizuoto", tmp_path)["heavy"] == []


def test_listing_commands_import_no_torch(tmp_path):
    """With every installed plugin loaded (the real engines where they are installed)."""
    found = _heavy_modules_after("""
        from click.testing import CliRunner
        from mizuoto.cli import cli
        for args in (["--help"], ["plugins"], ["models"], ["random-model", "--help"],
                     ["bench", "--help"]):
            result = CliRunner().invoke(cli, args, obj={}, catch_exceptions=False)
            assert result.exit_code == 0, (args, result.output)
            print(result.output)
    """, tmp_path)
    assert found["heavy"] == []
    installed = registry.engine_refs()
    for name in installed:
        assert f"  {name}: " in found["output"] or not installed[name].capabilities


# --- EngineRef: registered by location, imported on first use --------------------------------

LAZY_OPTIONS = '''
import attrs

@attrs.frozen
class LazyOptions:
    level: int = attrs.field(default=1, validator=attrs.validators.ge(0))
'''
LAZY_ENGINE = '''
from mizuoto import Engine
from mizuoto_test_lazy_options import LazyOptions

class LazyEngine(Engine):
    name = "lazy"
    options_class = LazyOptions

    @classmethod
    def load(cls, model_dir, *, options=None, model_id=None, progress=None):
        raise NotImplementedError

    info = None

    def synthesize(self, request, *, progress=None):
        raise NotImplementedError
'''


@pytest.fixture
def lazy_plugin(fake_plugin, tmp_path, monkeypatch):
    """The fake plugin plus one registering ``lazy`` by location, in a module not yet imported
    (its options class in a module of its own, as a plugin keeps it apart from the engine)."""
    (tmp_path / "mizuoto_test_lazy_engine.py").write_text(LAZY_ENGINE)
    (tmp_path / "mizuoto_test_lazy_options.py").write_text(LAZY_OPTIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("mizuoto_test_lazy_engine", "mizuoto_test_lazy_options"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    ref = EngineRef("lazy", "mizuoto_test_lazy_engine:LazyEngine",
                    capabilities={Capability.ZERO_SHOT, Capability.STREAM},
                    options="mizuoto_test_lazy_options:LazyOptions")
    fake_plugin.register(make_plugin("lazy_plugin", engines=(ref,), trainers=(), models=(),
                                     fixtures=()), name="lazy_plugin")
    registry.clear_cache()
    yield ref
    for name in ("mizuoto_test_lazy_engine", "mizuoto_test_lazy_options"):
        sys.modules.pop(name, None)


def test_listing_engines_imports_none(lazy_plugin):
    refs = registry.engine_refs()
    assert refs["lazy"] == lazy_plugin and refs["fake"].load() is FakeEngine
    result = CliRunner().invoke(cli, ["plugins"], obj={}, catch_exceptions=False)
    assert "engines: fake, lazy" in result.output
    assert "  lazy: stream, zero_shot" in result.output
    assert "mizuoto_test_lazy_engine" not in sys.modules


def test_get_engine_imports_it(lazy_plugin):
    engine = registry.get_engine("lazy")
    assert engine.__name__ == "LazyEngine" and engine.__module__ == "mizuoto_test_lazy_engine"
    assert registry.engines()["lazy"] is engine


def test_engine_options_are_checked_with_the_options_class_alone(lazy_plugin):
    def check(values):
        options = mizuoto.Options.from_mapping(values)
        registry.validate_engine_options(options)
        return options

    assert check({"engines.lazy.level": 2}).engine("lazy")["level"] == 2
    with pytest.raises(InvalidOption, match="engines.lazy.*level"):
        check({"engines.lazy.level": -1})
    with pytest.raises(InvalidOption, match="engines.lazy.colour"):
        check({"engines.lazy.colour": "red"})
    assert "mizuoto_test_lazy_options" in sys.modules
    assert "mizuoto_test_lazy_engine" not in sys.modules


def test_a_class_registered_directly_is_its_own_reference(fake_plugin):
    ref = registry.engine_refs()["fake"]
    assert ref == EngineRef.of(FakeEngine) and ref.options_class is FakeOptions
    assert ref.target == "conftest:FakeEngine" and ref.load() is FakeEngine


@pytest.mark.parametrize("target, options, error, message", [
    ("mizuoto_test_no_such_module:X", None, EngineNotFound,
     "engine 'lazy' could not be imported from mizuoto_test_no_such_module:X"),
    ("mizuoto_test_lazy_engine:Missing", None, EngineNotFound, "could not be imported"),
    ("mizuoto_test_lazy_options:LazyOptions", None, MizuotoError, "is not an Engine subclass"),
    ("mizuoto_test_lazy_engine:LazyEngine", None, MizuotoError, "registered with options=None"),
])
def test_a_reference_that_does_not_match_its_class_is_an_error(lazy_plugin, target, options,
                                                                error, message):
    with pytest.raises(error, match=message):
        EngineRef("lazy", target, options=options).load()


def test_a_reference_with_another_name_is_an_error(lazy_plugin):
    ref = EngineRef("other", "mizuoto_test_lazy_engine:LazyEngine",
                    options="mizuoto_test_lazy_options:LazyOptions")
    with pytest.raises(MizuotoError, match="is named 'lazy'"):
        ref.load()


def test_a_target_must_name_module_and_class():
    with pytest.raises(MizuotoError, match="'module:Class'"):
        EngineRef("lazy", "mizuoto_test_lazy_engine.LazyEngine")


def test_registering_something_else_is_an_error(fake_plugin):
    fake_plugin.register(make_plugin("odd", engines=("lazy",), trainers=(), models=(),
                                     fixtures=()), name="odd")
    registry.clear_cache()
    with pytest.raises(MizuotoError, match="register an Engine subclass or an EngineRef"):
        registry.engine_refs()


# --- progress: bars on a terminal only, one log line per chunk elsewhere -----------------------

def test_quiet_means_no_progress_at_all():
    with command_progress(quiet=True) as progress:
        assert progress is None


def test_not_a_terminal_logs_one_line_per_chunk(caplog):
    with command_progress(quiet=False) as progress:  # pytest's stderr is not a terminal
        assert isinstance(progress, ProgressLog)
        with caplog.at_level(logging.INFO, logger="mizuoto"):
            for chunk in range(3):
                progress(Progress("chunk", chunk, 3))
                for step in range(1, 33):
                    progress(Progress("sampling", step, 32))
            progress(Progress("chunk", 3, 3))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == [
        "chunk 1/3 done", "chunk 2/3 done", "chunk 3/3 done"]
    assert "\r" not in caplog.text


def test_nested_bars_close_before_the_result_is_printed():
    stream = io.StringIO()
    bars = ProgressBars(stream)
    bars(Progress("chunk", 0, 2))
    bars(Progress("sampling", 5, 32))  # sampling stopped early: its bar is still open
    assert list(bars._bars) == ["chunk", "sampling"]
    bars(Progress("chunk", 1, 2))  # the next chunk: the previous chunk's sampling is over
    assert list(bars._bars) == ["chunk"]
    bars(Progress("sampling 1/2", 3, 10))
    bars(Progress("sampling 2/2", 1, 10))  # a stage of the same kind replaces the last one
    assert list(bars._bars) == ["chunk", "sampling 2/2"]
    bars(Progress("decoding", 0, None))
    bars.close()
    assert bars._bars == {}
    # every bar cleared its line: what was drawn last leaves the cursor on an empty line
    assert stream.getvalue().endswith("\r") or stream.getvalue().endswith("\x1b[A")
