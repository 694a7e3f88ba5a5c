"""Checks of how a plugin registers its engine, for the plugin's own tests.

    from mizuoto_contract.registration import check_listing_imports_no_torch, check_engine_ref

``check_listing_imports_no_torch`` lists the plugin's engines, catalog and fixtures in a fresh
interpreter and fails if torch, numpy or safetensors got imported (a lazy ``EngineRef`` keeps
``mizuoto plugins`` fast). ``check_engine_ref`` loads every contract fixture of the engine and
checks that the registered reference names the class, its options class and exactly the
capabilities its models have (each model's within the reference's; together all of them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HEAVY_MODULES = ("torch", "numpy", "safetensors")


def check_listing_imports_no_torch(plugin: str, engine: str, cwd: str | Path) -> None:
    """``plugin``: the entry-point name (``MIZUOTO_PLUGINS``); ``engine``: what it registers."""
    code = ("import json, sys\n"
            "from mizuoto.registry import catalog, contract_fixtures, engine_refs\n"
            "refs, entries, fixtures = engine_refs(), catalog(), contract_fixtures()\n"
            "print(json.dumps({'engines': sorted(refs), 'heavy': [m for m in "
            f"{HEAVY_MODULES!r} if m in sys.modules]}}))\n")
    env = {**os.environ, "MIZUOTO_PLUGINS": plugin}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120, check=True)
    listed = json.loads(done.stdout.strip().splitlines()[-1])
    assert listed == {"engines": [engine], "heavy": []}, (
        f"listing plugin {plugin!r} gave {listed}: register an EngineRef and import the engine "
        "(and torch) only inside it")


def check_engine_ref(engine: str, engine_cls: type, directory: str | Path) -> None:
    """Load each contract fixture of ``engine`` under ``directory`` and compare capabilities."""
    import mizuoto
    from mizuoto.registry import contract_fixtures, engine_refs, get_engine

    ref = engine_refs()[engine]
    assert ref.load() is engine_cls and get_engine(engine) is engine_cls
    assert ref.options_class is engine_cls.options_class
    options = mizuoto.Options.from_mapping({"compute.device": "cpu", "compute.cpu_threads": 1})
    seen = set()
    for fixture in (f for f in contract_fixtures().values() if f.engine == engine):
        model_dir = Path(directory) / fixture.name
        model_dir.mkdir(parents=True, exist_ok=True)
        fixture.make(model_dir)
        capabilities = engine_cls.load(model_dir, options=options).info.capabilities
        assert capabilities <= ref.capabilities, f"{fixture.id} can do more than registered"
        seen |= capabilities
    assert seen == ref.capabilities, "the listing promises what no model of the engine can do"
