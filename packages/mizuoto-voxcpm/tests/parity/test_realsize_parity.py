"""Whole requests on real-size random-init models, float32 and bfloat16 (``-m realsize``).

Slow (a real-size load takes 10-30 s, VoxCPM2 holds 2.4 B parameters), so not in CI: run with
``nox -s parity -- --realsize``. Upstream runs first and is freed before Mizuoto loads, so peak
memory is one model, not two.
"""

from __future__ import annotations

import contextlib
import gc
import io

import numpy as np
import pytest
import torch

import mizuoto
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import with_dtype, write_random_model

pytestmark = [pytest.mark.parity, pytest.mark.realsize]

voxcpm_core = pytest.importorskip("voxcpm.core")

TEXT = "Real sizes, same bits."
PARAMS = {"max_len": 3, "retry_badcase": False}


@pytest.fixture(scope="module")
def realsize_root(tmp_path_factory):
    return tmp_path_factory.mktemp("voxcpm-realsize")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("generation", ["voxcpm-0.5b", "voxcpm-1.5", "voxcpm2"])
@pytest.mark.parametrize("seed", [1, 77])
def test_request(realsize_root, generation, dtype, seed):
    base = realsize_root / generation
    if not (base / "config.json").is_file():
        write_random_model(base, generation, seed=8, size="realsize")
    directory = base if dtype == "bfloat16" else with_dtype(base, realsize_root / f"{generation}-"
                                                           "fp32", "float32")
    with contextlib.redirect_stderr(io.StringIO()):
        upstream = voxcpm_core.VoxCPM(voxcpm_model_path=str(directory), enable_denoiser=False,
                                      optimize=False)
    torch.manual_seed(seed)
    expected = upstream.generate(text=TEXT, **PARAMS)
    del upstream
    gc.collect()
    engine = VoxCPMEngine.load(directory)
    result = engine.synthesize(mizuoto.SynthesisRequest(text=TEXT, seed=seed, params=PARAMS))
    got = result.audio.samples.numpy()
    assert expected.shape == got.shape
    assert np.array_equal(expected, got), f"max diff {np.abs(expected - got).max()}"


@pytest.mark.parametrize("generation", ["voxcpm-0.5b", "voxcpm-1.5", "voxcpm2"])
def test_stream(realsize_root, generation):
    """A stream at real size: each chunk as upstream's ``generate_streaming`` yields it. The
    VAE's transposed convolutions run packed at a stream's shapes (proven at load), so this is
    where ``compute.prepack`` reaches the VAE."""
    base = realsize_root / generation
    if not (base / "config.json").is_file():
        write_random_model(base, generation, seed=8, size="realsize")
    with contextlib.redirect_stderr(io.StringIO()):
        upstream = voxcpm_core.VoxCPM(voxcpm_model_path=str(base), enable_denoiser=False,
                                      optimize=False)
    torch.manual_seed(5)
    expected = list(upstream.generate_streaming(text=TEXT, **PARAMS))
    del upstream
    gc.collect()
    engine = VoxCPMEngine.load(base)
    chunks = list(engine.stream(mizuoto.SynthesisRequest(text=TEXT, seed=5, params=PARAMS)))
    assert [c.audio.num_samples for c in chunks] == [len(e) for e in expected]
    for want, got in zip(expected, chunks, strict=True):
        assert np.array_equal(want, got.audio.samples.numpy())
    assert "vae" in chunks[-1].applied.compute["prepack"]["modules"]
