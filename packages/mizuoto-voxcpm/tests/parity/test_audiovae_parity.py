"""AudioVAE parity with upstream voxcpm 2.0.3: the same random checkpoint, bit for bit.

Upstream's VAE is built and loaded as ``VoxCPMModel.from_local`` / ``VoxCPM2Model.from_local``
do: pydantic config from the config.json section, model cast to the LM dtype and back to
float32, then the file's state dict loaded non-strictly (we assert nothing is left out).
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
import torch

from mizuoto_voxcpm.audiovae import (
    AudioVAEConfig,
    AudioVAEV2Config,
    audio_vae_config_from_model_config,
    load_audio_vae,
)
from mizuoto_voxcpm.audiovae.fixture import (
    TINY_V1_16K,
    TINY_V1_44K,
    TINY_V2,
    VOXCPM1_5,
    VOXCPM2,
    VOXCPM_0_5B,
    write_random_audiovae,
)

pytestmark = pytest.mark.parity

CASES = {
    "v1-16k": (TINY_V1_16K, "pth"),
    "v1-44k": (TINY_V1_44K, "safetensors"),
    "v2": (TINY_V2, "safetensors"),
    "v1-noise-dense": (
        attrs.evolve(TINY_V1_16K, use_noise_block=True, depthwise=False, decoder_rates=(8, 5, 4, 4)),
        "pth",
    ),
    "v2-concat-noise": (
        attrs.evolve(
            TINY_V2, cond_type="concat", cond_dim=6, cond_out_layer=True, use_noise_block=True
        ),
        "pth",
    ),
    "v2-add": (attrs.evolve(TINY_V2, cond_type="add"), "pth"),
    "v2-unconditioned": (attrs.evolve(TINY_V2, sr_bin_boundaries=None), "pth"),
}


def _section(config: AudioVAEConfig | AudioVAEV2Config) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.asdict(config).items()}


def _write_model_dir(directory: Path, config, fmt: str, seed: int = 0) -> Path:
    architecture = "voxcpm2" if config.generation == 2 else "voxcpm"
    (directory / "config.json").write_text(
        json.dumps({"architecture": architecture, "audio_vae_config": _section(config)})
    )
    write_random_audiovae(directory, config, seed=seed, fmt=fmt)
    return directory


def _upstream_vae(directory: Path):
    from voxcpm.modules.audiovae import AudioVAE, AudioVAEConfig, AudioVAEConfigV2, AudioVAEV2

    raw = json.loads((directory / "config.json").read_text())
    if raw["architecture"] == "voxcpm2":
        vae = AudioVAEV2(config=AudioVAEConfigV2.model_validate(raw["audio_vae_config"]))
    else:
        vae = AudioVAE(config=AudioVAEConfig.model_validate(raw["audio_vae_config"]))
    if (directory / "audiovae.safetensors").exists():
        from safetensors.torch import load_file

        state = load_file(str(directory / "audiovae.safetensors"), device="cpu")
    else:
        checkpoint = torch.load(directory / "audiovae.pth", map_location="cpu", weights_only=True)
        state = checkpoint.get("state_dict", checkpoint)
    vae = vae.to(torch.bfloat16).to(torch.float32)
    missing, unexpected = vae.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return vae.eval()


V2_CASES = [name for name, (config, _) in CASES.items() if config.generation == 2]
_LOADED: dict[str, tuple] = {}


def _load_pair(name: str, tmp_path_factory):
    if name not in _LOADED:
        config, fmt = CASES[name]
        directory = _write_model_dir(tmp_path_factory.mktemp(name), config, fmt)
        ours_config = audio_vae_config_from_model_config(
            json.loads((directory / "config.json").read_text())
        )
        assert ours_config == config
        _LOADED[name] = (config, load_audio_vae(directory, ours_config), _upstream_vae(directory))
    return _LOADED[name]


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    return _load_pair(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=V2_CASES)
def v2_pair(request, tmp_path_factory):
    return _load_pair(request.param, tmp_path_factory)


def _audio(config, batch: int = 2, seconds: float = 0.3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    # a length that is not a whole number of hops, so the right padding is exercised
    samples = int(config.sample_rate * seconds) + 17
    return 0.3 * torch.randn(batch, samples, generator=generator)


def _latents(config, frames: int = 10) -> torch.Tensor:
    generator = torch.Generator().manual_seed(11)
    # upstream's "concat" condition repeats a batch-1 embedding: it only decodes batch 1
    batch = 1 if getattr(config, "cond_type", None) == "concat" else 2
    return torch.randn(batch, config.latent_dim, frames, generator=generator)


@torch.inference_mode()
def test_encode_is_bit_exact(pair):
    config, ours, upstream = pair
    audio = _audio(config)
    expected = upstream.encode(audio, config.sample_rate)
    assert torch.equal(ours.encode(audio, config.sample_rate), expected)
    # the (B, 1, T) form too
    assert torch.equal(ours.encode(audio[:1, None], None), upstream.encode(audio[:1, None], None))


@torch.inference_mode()
def test_decode_is_bit_exact(pair):
    config, ours, upstream = pair
    drawn = _latents(config)
    encoded = upstream.encode(_audio(config, batch=drawn.shape[0]), config.sample_rate)
    for latents in (drawn, encoded):
        torch.manual_seed(3)  # the noise block draws from the global generator
        expected = upstream.decode(latents)
        torch.manual_seed(3)
        actual = ours.decode(latents)
        assert actual.shape == (len(latents), 1, latents.shape[-1] * config.decode_hop_length)
        assert torch.isfinite(actual).all()
        assert torch.equal(actual, expected)


@torch.inference_mode()
@pytest.mark.parametrize("out_sample_rate", [16000, 24000, 44100, 48000])
def test_v2_decode_at_each_sample_rate_bucket(v2_pair, out_sample_rate):
    config, ours, upstream = v2_pair
    latents = _latents(config, frames=6)
    condition = torch.tensor([out_sample_rate], dtype=torch.int32)
    torch.manual_seed(5)
    expected = upstream.decode(latents, condition)
    torch.manual_seed(5)
    assert torch.equal(ours.decode(latents, out_sample_rate), expected)


@torch.inference_mode()
@pytest.mark.parametrize("chunks", [(4, 4, 4), (1, 2, 1, 3, 1, 4)], ids=["patches", "uneven"])
def test_v2_streaming_chunks_are_bit_exact(v2_pair, chunks):
    config, ours, upstream = v2_pair
    latents = _latents(config, frames=sum(chunks))
    bounds = torch.tensor((0, *chunks)).cumsum(0).tolist()
    spans = list(zip(bounds[:-1], bounds[1:], strict=True))
    expected, actual = [], []
    torch.manual_seed(9)
    with upstream.streaming_decode() as decoder:
        for start, end in spans:
            expected.append(decoder.decode_chunk(latents[..., start:end]))
    torch.manual_seed(9)
    with ours.streaming_decoder() as decoder:
        for start, end in spans:
            actual.append(decoder.decode_chunk(latents[..., start:end]))
    for ours_chunk, upstream_chunk in zip(actual, expected, strict=True):
        assert torch.equal(ours_chunk, upstream_chunk)
    # upstream restores its unpatched decoder afterwards: a whole decode is unaffected
    torch.manual_seed(1)
    whole = upstream.decode(latents)
    torch.manual_seed(1)
    assert torch.equal(ours.decode(latents), whole)


@pytest.mark.realsize
@torch.inference_mode()
@pytest.mark.parametrize(
    "config", [VOXCPM_0_5B, VOXCPM1_5, VOXCPM2], ids=["voxcpm-0.5b", "voxcpm1.5", "voxcpm2"]
)
def test_real_size_is_bit_exact(config, tmp_path):
    """Real-size random VAEs (75 M, 215 M, 94 M parameters): a short encode, decode and stream."""
    directory = _write_model_dir(tmp_path, config, "safetensors")
    ours = load_audio_vae(directory, config)
    upstream = _upstream_vae(directory)
    audio = _audio(config, batch=1, seconds=0.25)
    latents = upstream.encode(audio, config.sample_rate)
    assert torch.equal(ours.encode(audio, config.sample_rate), latents)
    assert torch.equal(ours.decode(latents), upstream.decode(latents))
    if config.generation == 2:
        with upstream.streaming_decode() as theirs, ours.streaming_decoder() as mine:
            for start in range(0, latents.shape[-1], 4):
                chunk = latents[..., start : start + 4]
                assert torch.equal(mine.decode_chunk(chunk), theirs.decode_chunk(chunk))


def test_snake_equals_upstreams_torchscript_function():
    """Upstream scripts snake; on CPU (no fuser) every call, warm or not, runs the same aten ops."""
    from voxcpm.modules.audiovae.audio_vae import snake as upstream_snake

    from mizuoto_voxcpm.audiovae.snake import snake

    generator = torch.Generator().manual_seed(0)
    for frames in (1, 7, 1000, 1000, 1000, 4097):  # past the profiling executor's warm-up
        x = 3 * torch.randn(2, 37, frames, generator=generator)
        alpha = torch.rand(1, 37, 1, generator=generator) + 0.05
        assert torch.equal(snake(x, alpha), upstream_snake(x, alpha))


@pytest.mark.realsize
@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize(
    "config, patch_size", [(VOXCPM_0_5B, 2), (VOXCPM1_5, 4), (VOXCPM2, 4)],
    ids=["voxcpm-0.5b", "voxcpm1.5", "voxcpm2"],
)
def test_real_size_stream_with_prepacked_upsampling_is_bit_exact(config, patch_size, threads,
                                                                 tmp_path):
    """compute.prepack's transposed convolutions, proven at load for a stream's shapes
    (``rehearse_stream_decode``), decode each streamed patch as upstream's VAE does, at each
    thread count (the proof is per thread count); the whole-utterance decode stays plain."""
    from mizuoto.runtime.prepack_conv_transpose import (
        conv_transpose_report,
        prepack_conv_transposes,
    )
    from mizuoto_voxcpm.decoding import rehearse_stream_decode, segment_decoder

    directory = _write_model_dir(tmp_path, config, "safetensors", seed=5)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ours = load_audio_vae(directory, config)
        prepack_conv_transposes({"vae": [ours]})
        v2 = config.generation == 2
        rehearse_stream_decode(ours, v2=v2, patch_size=patch_size, feat_dim=config.latent_dim)
        report = conv_transpose_report({"vae": [ours]})["vae"]
        upstream = _upstream_vae(directory)
        generator = torch.Generator().manual_seed(threads)
        patches = [torch.randn(1, patch_size, config.latent_dim, generator=generator)
                   for _ in range(5)]
        keep = patch_size * config.hop_length if not v2 else None
        with torch.inference_mode():
            # a zero-shot stream: the first generation's windows grow from one patch to three
            with segment_decoder(ours, context=[], v2=v2, patch_size=patch_size) as decode:
                mine = [decode(p) for p in patches]
            # and a cloned voice's: two patches of context from the start
            with segment_decoder(ours, context=[p.unsqueeze(0) for p in patches[:2]], v2=v2,
                                 patch_size=patch_size) as decode:
                mine += [decode(p) for p in patches[2:]]
            theirs = []
            if v2:
                for _ in range(2):
                    with upstream.streaming_decode() as decoder:
                        theirs += [decoder.decode_chunk(p.transpose(1, 2)).reshape(-1)
                                   for p in (patches if not theirs else patches[2:])]
            else:
                for newest in [*range(len(patches)), *range(2, len(patches))]:
                    window = torch.cat(patches[max(0, newest - 2):newest + 1], dim=1)
                    theirs.append(upstream.decode(window.transpose(1, 2))[..., -keep:]
                                  .reshape(-1))
            for index, (got, expected) in enumerate(zip(mine, theirs, strict=True)):
                assert torch.equal(got, expected), (index, report)
            whole = torch.cat(patches, dim=1).transpose(1, 2)
            assert torch.equal(ours.decode(whole), upstream.decode(whole))
    finally:
        torch.set_num_threads(before)
