"""The out-of-memory fallback of the AudioVAE decode: receptive fields, tiled decoding of whole
utterances, and the engine's ``compute.oom_fallback`` (no upstream needed)."""

from __future__ import annotations

import pytest
import torch

from mizuoto import Options, SynthesisRequest
from mizuoto_voxcpm.audiovae import load_audio_vae
from mizuoto_voxcpm.audiovae.fixture import TINY_V1_16K, TINY_V1_44K, TINY_V2, write_random_audiovae
from mizuoto_voxcpm.decoding import VAE_TILE_FRAMES, VAE_TILED, decode_utterance, vae_tile_overlap
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import write_random_model

FAST = {"max_len": 3, "inference_timesteps": 2}
CONFIGS = {"v1-16k": TINY_V1_16K, "v1-44k": TINY_V1_44K, "v2": TINY_V2}
# the causal decoders' reach in latent frames, walked from the layers (released strides)
RECEPTIVE_FIELDS = {"v1-16k": 19, "v1-44k": 21, "v2": 20}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def vae(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    write_random_audiovae(directory, CONFIGS[request.param], seed=3)
    vae = load_audio_vae(directory, CONFIGS[request.param])
    vae.name = request.param
    return vae


def _patches(vae, frames: int, patch_size: int = 2, seed: int = 0) -> torch.Tensor:
    """``(1, frames / patch_size, patch_size, latent_dim)`` latent patches, as generated."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, frames // patch_size, patch_size, vae.latent_dim, generator=generator)


def _decode(vae, patches, **kwargs) -> tuple[torch.Tensor, list[str]]:
    fallbacks: list[str] = []
    audio = decode_utterance(vae, patches, context=0, v2=vae.name == "v2", patch_size=2,
                             fallbacks=fallbacks, **kwargs)
    return audio, fallbacks


def test_receptive_field_is_the_decoders_reach(vae):
    """Changing latent frame k changes samples of frames k .. k + R only (R tight)."""
    field = vae.decoder_receptive_field
    assert field == RECEPTIVE_FIELDS[vae.name]
    hop, k = vae.decode_hop_length, 5
    latents = torch.randn(1, vae.latent_dim, k + field + 6, generator=torch.Generator()
                          .manual_seed(1))
    changed = latents.clone()
    changed[..., k] += 1.0
    with torch.inference_mode():
        differs = (vae.decode(latents) != vae.decode(changed)).reshape(-1).nonzero()
    assert differs.min() >= k * hop  # causal
    assert differs.max() < (k + field + 1) * hop  # nothing past the receptive field
    assert differs.max() >= (k + field) * hop  # and frame k + R is reached
    assert vae_tile_overlap(vae) == 4 * field


def test_one_tile_is_the_whole_decode(vae):
    patches = _patches(vae, VAE_TILE_FRAMES)
    whole, untouched = _decode(vae, patches)
    tiled, fallbacks = _decode(vae, patches, tiled=True)
    assert untouched == [] and fallbacks == [VAE_TILED]
    assert torch.equal(tiled, whole)


def test_tiles_match_the_whole_decode_up_to_rounding(vae):
    """Three tiles: the overlap covers four receptive fields, so the crossfade blends samples
    both tiles decoded with their full context."""
    patches = _patches(vae, 2 * VAE_TILE_FRAMES, seed=4)
    whole, _ = _decode(vae, patches)
    tiled, fallbacks = _decode(vae, patches, tiled=True)
    assert fallbacks == [VAE_TILED]
    assert tiled.shape == whole.shape == (2 * VAE_TILE_FRAMES * vae.decode_hop_length,)
    assert (tiled - whole).abs().max() <= 1e-5 * whole.abs().max()


def test_out_of_memory_falls_back_to_tiles_and_can_be_refused(vae, monkeypatch):
    patches = _patches(vae, 3 * VAE_TILE_FRAMES // 2, seed=5)
    whole, _ = _decode(vae, patches)
    original, calls = vae.decode, []

    def decode(latents):
        calls.append(latents.shape[-1])
        if latents.shape[-1] > VAE_TILE_FRAMES:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. "
                               "DefaultCPUAllocator: can't allocate memory: you tried to allocate")
        return original(latents)

    monkeypatch.setattr(vae, "decode", decode)
    fallen_back, fallbacks = _decode(vae, patches)
    assert fallbacks == [VAE_TILED] and calls == [3 * VAE_TILE_FRAMES // 2, 256, 128 + 4 * (
        vae.decoder_receptive_field)]
    assert (fallen_back - whole).abs().max() <= 1e-5 * whole.abs().max()
    with pytest.raises(RuntimeError, match="DefaultCPUAllocator"):
        _decode(vae, patches, oom_fallback=False)


def test_other_errors_are_not_taken_for_out_of_memory(vae, monkeypatch):
    def decode(latents):
        raise RuntimeError("Given groups=1, weight of size [8, 8, 7], expected input ...")

    monkeypatch.setattr(vae, "decode", decode)
    with pytest.raises(RuntimeError, match="groups=1"):
        _decode(vae, _patches(vae, 8))


# --- through the engine ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("v2"), "voxcpm2", dtype="float32")


def _running_out_of_memory_once(engine, monkeypatch) -> list[int]:
    """Make the engine's VAE raise ``torch.OutOfMemoryError`` on its first decode only."""
    original, calls = engine.vae.decode, []

    def decode(latents):
        calls.append(latents.shape[-1])
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return original(latents)

    monkeypatch.setattr(engine.vae, "decode", decode)
    return calls


def test_engine_records_the_fallback(model_dir, monkeypatch):
    engine = VoxCPMEngine.load(model_dir)
    request = SynthesisRequest("hello world", seed=5, params=FAST)
    plain = engine.synthesize(request)
    assert plain.applied.fallbacks == () and plain.applied.compute["oom_fallback"] is True
    forced = engine.synthesize(SynthesisRequest("hello world", seed=5,
                                                params={**FAST, "tiled_decode": True}))
    calls = _running_out_of_memory_once(engine, monkeypatch)
    fallen_back = engine.synthesize(request)
    assert len(calls) == 2  # the whole utterance, then its one tile
    for result in (forced, fallen_back):
        assert result.applied.fallbacks == (VAE_TILED,)
        # a short utterance is one tile: the same decoder call as without the fallback
        assert torch.equal(result.audio.samples, plain.audio.samples)


def test_engine_without_fallback_raises_the_out_of_memory_error(model_dir, monkeypatch):
    engine = VoxCPMEngine.load(model_dir, options=Options.from_mapping(
        {"compute": {"oom_fallback": False}}))
    _running_out_of_memory_once(engine, monkeypatch)
    with pytest.raises(torch.OutOfMemoryError):
        engine.synthesize(SynthesisRequest("hello world", seed=5, params=FAST))
    result = engine.synthesize(SynthesisRequest("hello world", seed=5, params=FAST))
    assert result.applied.compute["oom_fallback"] is False and result.applied.fallbacks == ()
