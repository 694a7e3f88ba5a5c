"""``compute.prepack=auto`` (the default) keeps upstream's bits at 1, 2 and 4 threads: the same
waveform as ``compute.prepack=off`` and as upstream voxcpm 2.0.3, on the tiny random models.

The thread count changes how a matrix product splits its sums, so a packed kernel is proven
per thread count (``mizuoto.runtime.prepack``); each case runs all three at that count.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import mizuoto
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import with_dtype, write_random_model

pytestmark = pytest.mark.parity

voxcpm_core = pytest.importorskip("voxcpm.core")

SEED = 1234
TEXT = "Hello world, this is a test."
_engines: dict = {}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("voxcpm-prepack")
    dirs = {}
    for generation in ("voxcpm-0.5b", "voxcpm2"):
        base = write_random_model(root / generation, generation, seed=3)
        dirs[generation, "bfloat16"] = base
        dirs[generation, "float32"] = with_dtype(base, root / f"{generation}-fp32", "float32")
    return dirs


def _upstream_audio(directory: Path) -> np.ndarray:
    key = ("up", directory)
    if key not in _engines:
        _engines[key] = voxcpm_core.VoxCPM(voxcpm_model_path=str(directory),
                                           enable_denoiser=False, optimize=False)
    torch.manual_seed(SEED)  # 2.0.3 takes no seed: its first attempt draws from the global one
    return _engines[key].generate(text=TEXT, max_len=5, retry_badcase=False)


def _ours(directory: Path, mode: str):
    key = (mode, directory)
    if key not in _engines:
        options = mizuoto.Options.from_mapping({"compute.prepack": mode})
        _engines[key] = VoxCPMEngine.load(directory, options=options)
    return _engines[key].synthesize(mizuoto.SynthesisRequest(
        text=TEXT, seed=SEED, params={"max_len": 5, "retry_badcase": False}))


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("generation", ["voxcpm-0.5b", "voxcpm2"])
def test_prepacked_matches_plain_and_upstream(model_dirs, generation, dtype, threads):
    directory = model_dirs[generation, dtype]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        upstream = _upstream_audio(directory)
        packed, plain = _ours(directory, "auto"), _ours(directory, "off")
    finally:
        torch.set_num_threads(before)
    assert torch.equal(packed.audio.samples, plain.audio.samples)
    assert np.array_equal(packed.audio.samples.numpy(), upstream)
    assert packed.applied.compute["prepack"]["mode"] == "auto"
    assert set(packed.applied.compute["prepack"]["modules"]) >= {"base_lm", "residual_lm",
                                                                 "encoder", "dit"}
    assert plain.applied.compute["prepack"] == {"mode": "off"}
