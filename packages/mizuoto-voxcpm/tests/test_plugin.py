"""The VoxCPM plugin registers its engine lazily: listing it imports no torch, and the
reference it registers matches the engine class and what its models can do."""

from __future__ import annotations

from mizuoto_contract.registration import check_engine_ref, check_listing_imports_no_torch
from mizuoto_voxcpm.engine import VoxCPMEngine


def test_listing_the_plugin_imports_no_torch(tmp_path):
    check_listing_imports_no_torch("voxcpm", "voxcpm", cwd=tmp_path)


def test_the_reference_matches_the_engine_and_its_models(tmp_path):
    check_engine_ref("voxcpm", VoxCPMEngine, tmp_path)
