"""AudioVAE: configs, strict loading, shapes, streaming, fixtures (no upstream needed)."""

from __future__ import annotations

import attrs
import pytest
import torch

from mizuoto.errors import CheckpointMismatch, ModelFilesMissing
from mizuoto_voxcpm.audiovae import (
    AudioVAE,
    AudioVAEConfig,
    AudioVAEV2,
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
    random_audiovae_state_dict,
    write_random_audiovae,
)
from mizuoto_voxcpm.audiovae.snake import snake


@pytest.fixture(scope="module")
def v2_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("v2")
    write_random_audiovae(directory, TINY_V2, seed=0, fmt="safetensors")
    return directory


@pytest.fixture(scope="module")
def v2(v2_dir):
    return load_audio_vae(v2_dir, TINY_V2)


def _latents(config, batch=2, frames=9, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, config.latent_dim, frames, generator=generator)


# --- configs ---------------------------------------------------------------------------------


def test_config_generation_follows_architecture():
    assert audio_vae_config_from_model_config({}) == AudioVAEConfig()
    assert audio_vae_config_from_model_config({"architecture": "VoxCPM"}) == AudioVAEConfig()
    assert audio_vae_config_from_model_config({"architecture": "voxcpm2"}) == AudioVAEV2Config()
    with pytest.raises(ValueError, match="architecture"):
        audio_vae_config_from_model_config({"architecture": "voxcpm3"})


def test_config_defaults_are_upstreams():
    v1, v2 = AudioVAEConfig(), AudioVAEV2Config()
    assert (v1.hop_length, v1.decode_hop_length, v1.out_sample_rate) == (640, 640, 16000)
    assert v1.decoder_dim == 1536 and v1.depthwise and not v1.use_noise_block
    assert (v2.hop_length, v2.decode_hop_length) == (640, 1920)
    assert (v2.sample_rate, v2.out_sample_rate) == (16000, 48000)
    assert v2.sr_bin_boundaries == (20000, 30000, 40000) and v2.cond_type == "scale_bias"


@pytest.mark.parametrize("section", [None, {}])
def test_config_missing_section_means_defaults(section):
    model = {"architecture": "voxcpm2", "audio_vae_config": section}
    assert audio_vae_config_from_model_config(model) == AudioVAEV2Config()


def test_config_reads_lists_and_ignores_unknown_keys():
    section = {"encoder_rates": [2, 3, 6, 7, 7], "sample_rate": 44100, "chunk_size": 1764}
    config = audio_vae_config_from_model_config({"audio_vae_config": section})
    assert config.encoder_rates == (2, 3, 6, 7, 7)
    assert config.hop_length == 1764 and config.sample_rate == 44100


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"latent_dim": 0}, "latent_dim"),
        ({"latent_dim": None}, "latent_dim"),
        ({"encoder_rates": []}, "encoder_rates"),
        ({"decoder_rates": [8, "2"]}, "decoder_rates"),
        ({"depthwise": 1}, "depthwise"),
        ({"cond_type": "film"}, "cond_type"),
        ({"cond_type": "concat"}, "cond_type"),
    ],
)
def test_config_errors_name_the_field(section, field):
    with pytest.raises(ValueError, match=f"audio_vae_config.{field}"):
        AudioVAEV2Config.from_dict(section)


def test_real_size_configs():
    assert VOXCPM_0_5B.hop_length == 640 and VOXCPM_0_5B.sample_rate == 16000
    assert VOXCPM1_5.hop_length == VOXCPM1_5.decode_hop_length == 1764
    assert VOXCPM1_5.sample_rate // VOXCPM1_5.hop_length == 25
    assert VOXCPM2.decode_hop_length == 3 * VOXCPM2.hop_length


# --- snake -----------------------------------------------------------------------------------


def test_snake_formula():
    x = torch.linspace(-3, 3, 24).reshape(2, 3, 4)
    alpha = torch.tensor([0.5, 1.0, 2.0]).reshape(1, 3, 1)
    expected = x + torch.sin(alpha * x) ** 2 / alpha
    torch.testing.assert_close(snake(x, alpha), expected, rtol=1e-6, atol=1e-6)
    assert snake(x[..., None], alpha).shape == (2, 3, 4, 1)


@pytest.mark.parametrize("shape", [(1, 7, 1), (2, 37, 1000), (1, 64, 4097)])
def test_snake_in_place_without_autograd_equals_the_autograd_expression(shape):
    generator = torch.Generator().manual_seed(0)
    x = 3 * torch.randn(*shape, generator=generator)
    alpha = (torch.rand(1, shape[1], 1, generator=generator) + 0.05).requires_grad_()
    tracked = snake(x, alpha)  # autograd records: the out-of-place expression
    assert tracked.requires_grad
    tracked.sum().backward()
    assert alpha.grad is not None and torch.isfinite(alpha.grad).all()
    before = x.clone()
    with torch.inference_mode():
        in_place = snake(x, alpha.detach())
    assert torch.equal(in_place, tracked.detach()) and torch.equal(x, before)  # x untouched


# --- loading ---------------------------------------------------------------------------------


def test_load_builds_the_generation_of_the_config(tmp_path):
    write_random_audiovae(tmp_path, TINY_V1_16K)
    vae = load_audio_vae(tmp_path, TINY_V1_16K, "cpu")
    assert type(vae) is AudioVAE and not vae.training
    # requires_grad stays as upstream leaves it; decoding runs under inference_mode
    assert all(p.dtype == torch.float32 and p.requires_grad for p in vae.parameters())
    assert isinstance(load_audio_vae(str(tmp_path), TINY_V1_16K), AudioVAE)


def test_load_without_checkpoint(tmp_path):
    with pytest.raises(ModelFilesMissing, match="audiovae.safetensors"):
        load_audio_vae(tmp_path, TINY_V2)


def test_load_prefers_safetensors_like_upstream(tmp_path, v2):
    write_random_audiovae(tmp_path, TINY_V2, seed=0, fmt="safetensors")
    write_random_audiovae(tmp_path, TINY_V2, seed=1, fmt="pth")
    loaded = load_audio_vae(tmp_path, TINY_V2)
    latents = _latents(TINY_V2)
    assert torch.equal(loaded.decode(latents), v2.decode(latents))


def test_pth_and_safetensors_load_the_same_weights(tmp_path, v2):
    write_random_audiovae(tmp_path, TINY_V2, seed=0, fmt="pth")
    loaded = load_audio_vae(tmp_path, TINY_V2)
    for (name, ours), (_, theirs) in zip(
        loaded.state_dict().items(), v2.state_dict().items(), strict=True
    ):
        assert torch.equal(ours, theirs), name


def test_pth_wrapped_in_state_dict(tmp_path, v2):
    torch.save({"state_dict": random_audiovae_state_dict(TINY_V2)}, tmp_path / "audiovae.pth")
    latents = _latents(TINY_V2)
    assert torch.equal(load_audio_vae(tmp_path, TINY_V2).decode(latents), v2.decode(latents))


def test_weight_norm_is_folded(tmp_path):
    state = random_audiovae_state_dict(TINY_V1_16K)
    torch.save(state, tmp_path / "audiovae.pth")
    vae = load_audio_vae(tmp_path, TINY_V1_16K)
    for key, weight in (
        ("decoder.model.1", vae.decoder.model[1].weight),  # conv: g per output channel
        ("decoder.model.2.block.1", vae.decoder.model[2].block[1].weight),  # transposed: per input
    ):
        g, v = state[f"{key}.weight_g"], state[f"{key}.weight_v"]
        expected = g * v / v.flatten(1).norm(dim=1).reshape(-1, 1, 1)
        torch.testing.assert_close(weight, expected, rtol=1e-6, atol=1e-7)


def _save(tmp_path, state):
    torch.save(state, tmp_path / "audiovae.pth")
    return tmp_path


def test_missing_key_is_named(tmp_path):
    state = random_audiovae_state_dict(TINY_V2)
    del state["encoder.fc_logvar.weight_v"]
    del state["decoder.sr_cond_model.2.bias_embed.weight"]
    with pytest.raises(CheckpointMismatch, match="missing keys") as caught:
        load_audio_vae(_save(tmp_path, state), TINY_V2)
    assert set(caught.value.missing) == {
        "encoder.fc_logvar.weight_v",
        "decoder.sr_cond_model.2.bias_embed.weight",
    }


def test_unexpected_key_is_ignored_with_a_warning(tmp_path, caplog):
    # upstream loads with strict=False; a released file carrying extra tensors must still load
    state = random_audiovae_state_dict(TINY_V1_16K)
    state["discriminator.weight"] = torch.zeros(1)
    with caplog.at_level("WARNING"):
        vae = load_audio_vae(_save(tmp_path, state), TINY_V1_16K)
    assert "discriminator.weight" in caplog.text
    assert "discriminator.weight" not in vae.state_dict()


def test_config_of_the_wrong_generation_is_a_mismatch(tmp_path):
    write_random_audiovae(tmp_path, TINY_V2)
    with pytest.raises(CheckpointMismatch) as caught:
        load_audio_vae(tmp_path, attrs.evolve(TINY_V1_16K, decoder_dim=128))
    assert caught.value.shapes or caught.value.missing
    assert "VAE configuration" in str(caught.value)


def test_shape_mismatch_is_named(tmp_path):
    write_random_audiovae(tmp_path, TINY_V1_16K)
    with pytest.raises(CheckpointMismatch, match="shape mismatches") as caught:
        load_audio_vae(tmp_path, attrs.evolve(TINY_V1_16K, latent_dim=16))
    assert any(entry.startswith("encoder.fc_mu.weight_g") for entry in caught.value.shapes)


def test_sample_rate_boundaries_buffer_is_optional_and_the_file_wins(tmp_path, v2):
    state = random_audiovae_state_dict(TINY_V2)
    del state["decoder.sr_bin_boundaries"]
    vae = load_audio_vae(_save(tmp_path, state), TINY_V2)
    assert vae.decoder.sr_bin_boundaries.tolist() == [20000, 30000, 40000]
    assert vae.decoder.sr_bin_boundaries.dtype == torch.int32
    latents = _latents(TINY_V2)
    assert torch.equal(vae.decode(latents), v2.decode(latents))

    state["decoder.sr_bin_boundaries"] = torch.tensor([50000, 60000, 70000])
    vae = load_audio_vae(_save(tmp_path, state), TINY_V2)
    assert vae.decoder.sr_bin_boundaries.dtype == torch.int32
    # 48 kHz now falls in bucket 0, as 16 kHz does with the configured boundaries
    assert torch.equal(vae.decode(latents), v2.decode(latents, 16000))


# --- shapes and behaviour -------------------------------------------------------------------


@pytest.mark.parametrize("config", [TINY_V1_16K, TINY_V1_44K, TINY_V2], ids=["16k", "44k", "v2"])
def test_encode_decode_shapes(tmp_path, config):
    write_random_audiovae(tmp_path, config)
    vae = load_audio_vae(tmp_path, config)
    samples = 3 * config.hop_length + 1
    audio = 0.1 * torch.randn(2, samples, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        latents = vae.encode(audio, config.sample_rate)
        assert latents.shape == (2, config.latent_dim, 4)  # ceil(samples / hop)
        assert torch.equal(vae.encode(audio[:, None, :]), latents)
        audio_out = vae.decode(latents)
    assert audio_out.shape == (2, 1, 4 * config.decode_hop_length)
    assert audio_out.abs().max() <= 1 and audio_out.std() > 1e-3


def test_encode_pads_right_with_zeros(v2):
    audio = 0.1 * torch.randn(1, 2 * TINY_V2.hop_length - 5)
    padded = torch.nn.functional.pad(audio, (0, 5))
    assert torch.equal(v2.encode(audio), v2.encode(padded))


def test_encode_rejects_another_sample_rate(v2):
    with pytest.raises(ValueError, match="sample_rate.*16000"):
        v2.encode(torch.zeros(1, 640), 48000)


def test_encoder_is_causal(v2):
    audio = 0.1 * torch.randn(1, 6 * TINY_V2.hop_length, generator=torch.Generator().manual_seed(1))
    changed = audio.clone()
    changed[:, 4 * TINY_V2.hop_length :] = 0.5
    before, after = v2.encode(audio), v2.encode(changed)
    torch.testing.assert_close(before[..., :4], after[..., :4], rtol=0, atol=1e-6)
    assert not torch.allclose(before[..., 4:], after[..., 4:])


def test_v2_sample_rate_condition(v2):
    latents = _latents(TINY_V2)
    default = v2.decode(latents)
    assert torch.equal(v2.decode(latents, 48000), default)
    assert torch.equal(v2.decode(latents, torch.tensor([40001], dtype=torch.int32)), default)
    assert v2.decode(latents, 16000).shape == default.shape  # length never depends on it
    assert not torch.equal(v2.decode(latents, 16000), default)


# --- streaming -------------------------------------------------------------------------------


def test_streaming_matches_a_whole_decode(v2):
    """Upstream's relation: the chunks are the whole decode, regrouped (equal up to rounding)."""
    latents = _latents(TINY_V2, frames=12)
    whole = v2.decode(latents)
    for sizes in ((4, 4, 4), (1, 2, 1, 3, 1, 4), (12,)):
        with v2.streaming_decoder() as decoder:
            chunks, start = [], 0
            for size in sizes:
                chunk = decoder.decode_chunk(latents[..., start : start + size])
                assert chunk.shape[-1] == size * TINY_V2.decode_hop_length
                chunks.append(chunk)
                start += size
        torch.testing.assert_close(torch.cat(chunks, dim=-1), whole, rtol=0, atol=1e-5)


def test_streaming_first_chunk_is_a_fresh_decode(v2):
    latents = _latents(TINY_V2, frames=8)
    with v2.streaming_decoder() as decoder:
        first = decoder.decode_chunk(latents[..., :4])
        second = decoder.decode_chunk(latents[..., 4:])
        assert len(decoder.state) > 0
        decoder.reset()
        assert len(decoder.state) == 0
        again = decoder.decode_chunk(latents[..., :4])
    torch.testing.assert_close(first, v2.decode(latents[..., :4]), rtol=0, atol=1e-5)
    assert torch.equal(again, first)
    # the second chunk depends on the first: it is not a fresh decode of its own latents
    assert not torch.allclose(second, v2.decode(latents[..., 4:]), atol=1e-4)


def test_streaming_context_manager_resets(v2):
    latents = _latents(TINY_V2, frames=4)
    decoder = v2.streaming_decoder()
    with decoder:
        first = decoder.decode_chunk(latents)
    assert len(decoder.state) == 0
    with decoder:
        assert torch.equal(decoder.decode_chunk(latents), first)


def test_noise_block_draws_from_the_global_generator(tmp_path):
    config = attrs.evolve(TINY_V1_16K, use_noise_block=True)
    write_random_audiovae(tmp_path, config)
    vae = load_audio_vae(tmp_path, config)
    latents = _latents(config)
    torch.manual_seed(0)
    first = vae.decode(latents)
    torch.manual_seed(0)
    assert torch.equal(vae.decode(latents), first)
    assert not torch.equal(vae.decode(latents), first)


# --- fixtures --------------------------------------------------------------------------------


def test_fixture_is_deterministic_and_independent_of_module_order():
    a = random_audiovae_state_dict(TINY_V1_16K, seed=3)
    b = random_audiovae_state_dict(TINY_V1_16K, seed=3)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    c = random_audiovae_state_dict(TINY_V1_16K, seed=4)
    assert not torch.equal(a["encoder.block.0.weight_v"], c["encoder.block.0.weight_v"])
    # a noise block inserted mid-decoder shifts module indices but not the shared keys' values
    noisy = random_audiovae_state_dict(attrs.evolve(TINY_V1_16K, use_noise_block=True), seed=3)
    assert torch.equal(noisy["encoder.fc_mu.weight_v"], a["encoder.fc_mu.weight_v"])
    assert "decoder.model.2.block.2.linear.weight_v" in noisy


def test_fixture_writes_upstream_dtypes(tmp_path):
    state = random_audiovae_state_dict(TINY_V2)
    assert state["decoder.sr_bin_boundaries"].dtype == torch.int32
    assert all(t.dtype == torch.float32 for k, t in state.items() if k != "decoder.sr_bin_boundaries")
    with pytest.raises(ValueError, match="fmt"):
        write_random_audiovae(tmp_path, TINY_V2, fmt="bin")


def test_v2_is_its_own_class(v2):
    assert type(v2) is AudioVAEV2 and v2.out_sample_rate == 48000
