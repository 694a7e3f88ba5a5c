"""jemalloc, tcmalloc and thread pinning leave VoxCPM's audio bit-identical: each in a fresh
process started as ``mizuoto`` restarts itself, against a plain start (torch.equal)."""

from __future__ import annotations

import pytest

from mizuoto_contract.startup import STARTUP_VARIANTS, check_startup_variant_keeps_audio
from mizuoto_voxcpm.fixtures import write_random_model

# a few patches: the language models, the local DiT and the audio VAE all run
REQUEST = {"text": "Same bytes.", "seed": 7,
           "params": {"max_len": 4, "inference_timesteps": 3}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("voxcpm2"), "voxcpm2", dtype="float32")


@pytest.mark.parametrize("variant", STARTUP_VARIANTS)
def test_cpu_startup_options_keep_audio(variant, model_dir, tmp_path):
    check_startup_variant_keeps_audio("voxcpm", model_dir, REQUEST, variant, tmp_path)
