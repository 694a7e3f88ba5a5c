"""The F5-TTS plugin registers its engine lazily: listing it imports no torch, and the
reference it registers matches the engine class and what its models can do."""

from __future__ import annotations

from mizuoto_contract.registration import check_engine_ref, check_listing_imports_no_torch
from mizuoto_f5tts.engine import F5Engine


def test_listing_the_plugin_imports_no_torch(tmp_path):
    check_listing_imports_no_torch("f5tts", "f5tts", cwd=tmp_path)


def test_the_reference_matches_the_engine_and_its_models(tmp_path):
    check_engine_ref("f5tts", F5Engine, tmp_path)
