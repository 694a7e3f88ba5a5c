"""The F5-TTS plugin registers its engine lazily: listing it imports no torch, and the
reference it registers matches the engine class and what its models can do."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mizuoto
from mizuoto.registry import contract_fixtures, engine_refs, get_engine
from mizuoto_f5tts.engine import F5Engine


def test_listing_the_plugin_imports_no_torch(tmp_path):
    code = ("import json, sys\n"
            "from mizuoto.registry import catalog, contract_fixtures, engine_refs\n"
            "refs, entries, fixtures = engine_refs(), catalog(), contract_fixtures()\n"
            "print(json.dumps({'engines': sorted(refs), 'heavy': [m for m in "
            "('torch', 'numpy', 'safetensors') if m in sys.modules]}))\n")
    env = {**os.environ, "MIZUOTO_PLUGINS": "f5tts"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"engines": ["f5tts"],
                                                                "heavy": []}


def test_the_reference_matches_the_engine_and_its_models(tmp_path):
    ref = engine_refs()["f5tts"]
    assert ref.load() is F5Engine and get_engine("f5tts") is F5Engine
    assert ref.options_class is F5Engine.options_class
    options = mizuoto.Options.from_mapping({"compute.device": "cpu", "compute.cpu_threads": 1})
    seen = set()
    for fixture in (f for f in contract_fixtures().values() if f.engine == "f5tts"):
        directory = tmp_path / fixture.name
        directory.mkdir()
        fixture.make(directory)
        capabilities = F5Engine.load(directory, options=options).info.capabilities
        assert capabilities <= ref.capabilities, fixture.id
        seen |= capabilities
    assert seen == ref.capabilities  # the listing promises nothing no model can do
