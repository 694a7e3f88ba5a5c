"""Checks of how a plugin registers its engine, for the plugin's own tests.

    from mizuoto_contract.registration import check_listing_imports_no_torch, check_engine_ref

``check_listing_imports_no_torch`` lists the plugin's engines, catalog and fixtures in a fresh
interpreter and fails if torch, numpy or safetensors got imported (a lazy ``EngineRef`` keeps
``mizuoto plugins`` fast). ``check_engine_ref`` loads every contract fixture of the engine and
checks that the registered reference names the class, its options class and exactly the
capabilities its models have (each model's within the reference's; together all of them).
The contract suite runs both for every selected engine (``test_plugin_contract``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Collection, Mapping
from pathlib import Path

HEAVY_MODULES = ("torch", "numpy", "safetensors")


def check_listing_imports_no_torch(plugin: str, engine: str | Collection[str],
                                   cwd: str | Path) -> None:
    """``plugin``: the entry-point name (``MIZUOTO_PLUGINS``); ``engine``: what it registers
    (a name, or every name when it registers several)."""
    code = ("import json, sys\n"
            "from mizuoto.registry import catalog, contract_fixtures, engine_refs\n"
            "refs, entries, fixtures = engine_refs(), catalog(), contract_fixtures()\n"
            "print(json.dumps({'engines': sorted(refs), 'heavy': [m for m in "
            f"{HEAVY_MODULES!r} if m in sys.modules]}}))\n")
    env = {**os.environ, "MIZUOTO_PLUGINS": plugin}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120, check=True)
    listed = json.loads(done.stdout.strip().splitlines()[-1])
    engines = [engine] if isinstance(engine, str) else sorted(engine)
    assert listed == {"engines": engines, "heavy": []}, (
        f"listing plugin {plugin!r} gave {listed}. Likely cause: the plugin module imports its "
        f"engine (and so torch) at registration; register an EngineRef('name', "
        f"'package.engine:Class', ...) and import torch only in the engine's module")


def registered_by(engine: str) -> tuple[str, list[str]]:
    """The plugin (entry-point name) that registers ``engine``, and every engine it registers."""
    from mizuoto.plugins import load_plugins, pm

    load_plugins()
    for impl in pm.hook.register_engines.get_hookimpls():
        registered: list = []  # EngineRefs or Engine classes: each has a name
        try:
            impl.function(register=registered.append)
        except Exception:  # its own test (test_the_plugin_loads_and_its_hooks_run) says why
            continue
        names = sorted(item.name for item in registered)
        if engine in names:
            return impl.plugin_name, names
    raise LookupError(f"no loaded plugin registers the engine {engine!r}")


def check_engine_ref(engine: str, engine_cls: type, directory: str | Path) -> None:
    """Load each contract fixture of ``engine`` under ``directory`` and compare capabilities."""
    import mizuoto
    from mizuoto.registry import contract_fixtures, engine_refs

    options = mizuoto.Options.from_mapping({"compute.device": "cpu", "compute.cpu_threads": 1})
    capabilities = {}
    for fixture in (f for f in contract_fixtures().values() if f.engine == engine):
        model_dir = Path(directory) / fixture.name
        model_dir.mkdir(parents=True, exist_ok=True)
        fixture.make(model_dir)
        capabilities[fixture.id] = engine_cls.load(model_dir, options=options).info.capabilities
    check_ref_against_models(engine_refs()[engine], engine_cls, capabilities)


def check_ref_against_models(ref, engine_cls: type,
                             capabilities: Mapping[str, frozenset]) -> None:
    """The registered reference ``ref`` names ``engine_cls`` and its options class, and
    exactly the capabilities of its loaded models (``capabilities``: per fixture id)."""
    from mizuoto.registry import get_engine

    assert ref.load() is engine_cls and get_engine(ref.name) is engine_cls, (
        f"the EngineRef of {ref.name!r} names {ref.load()!r}, its models load as {engine_cls!r}")
    assert ref.options_class is engine_cls.options_class, (
        f"the EngineRef of {ref.name!r} names the options class {ref.options_class!r}; the "
        f"engine's is {engine_cls.options_class!r}")
    seen: set = set()
    for fixture_id, model_capabilities in capabilities.items():
        extra = sorted(c.value for c in model_capabilities - ref.capabilities)
        assert not extra, (
            f"{fixture_id} can do more than registered: {', '.join(extra)}. Likely cause: the "
            f"EngineRef's capabilities= were not updated with the engine; list every "
            f"capability a model of the engine can have")
        seen |= model_capabilities
    promised = sorted(c.value for c in ref.capabilities - seen)
    assert not promised, (f"the listing of {ref.name!r} promises what no model of the engine "
                          f"can do: {', '.join(promised)}. Likely cause: the EngineRef's "
                          f"capabilities= list more than the models declare; remove them, "
                          f"or declare them in the loaded ModelInfo")
