"""jemalloc, tcmalloc and thread pinning leave F5's audio bit-identical: each in a fresh
process started as ``mizuoto`` restarts itself, against a plain start (torch.equal)."""

from __future__ import annotations

import pytest

from mizuoto_contract.startup import STARTUP_VARIANTS, check_startup_variant_keeps_audio

REQUEST = {"text": "Same bytes.", "seed": 7, "steps": 4}


@pytest.mark.parametrize("variant", STARTUP_VARIANTS)
def test_cpu_startup_options_keep_audio(variant, model_dir, tmp_path):
    check_startup_variant_keeps_audio("f5tts", model_dir, REQUEST, variant, tmp_path)
