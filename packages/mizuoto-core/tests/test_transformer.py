"""F5-TTS network blocks without the upstream oracle: layouts, shapes, masking, caching."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mizuoto.nn.transformer import DiT, RotaryEmbedding, UNetT, apply_rotary
from mizuoto.nn.vocoders.istft import ISTFT

_TINY = dict(dim=64, heads=4, dim_head=16, text_num_embeds=20, mel_dim=100)


class TestRotary:
    def test_interleaved_pairs(self):
        rope = RotaryEmbedding(4)
        freqs = rope.from_seq_len(3)
        assert freqs.shape == (1, 3, 4)
        # pairs share a frequency: [f0, f0, f1, f1]
        assert torch.equal(freqs[..., 0], freqs[..., 1])
        assert torch.equal(freqs[..., 2], freqs[..., 3])
        x = torch.tensor([[1.0, 0.0, 0.0, 1.0]]).expand(3, 4)[None]  # (1, n, d)
        out = apply_rotary(x, freqs)
        angle0, angle1 = freqs[0, :, 0], freqs[0, :, 2]
        assert torch.allclose(out[0, :, 0], torch.cos(angle0)) and torch.allclose(
            out[0, :, 1], torch.sin(angle0)
        )
        assert torch.allclose(out[0, :, 2], -torch.sin(angle1)) and torch.allclose(
            out[0, :, 3], torch.cos(angle1)
        )

    def test_partial_rotation_and_position_zero(self):
        x = torch.randn(2, 3, 5, 8)
        freqs = RotaryEmbedding(4).from_seq_len(5)
        out = apply_rotary(x, freqs)
        assert torch.equal(out[..., 4:], x[..., 4:])  # beyond the rotary dims: untouched
        assert torch.equal(out[:, :, 0], x[:, :, 0])  # angle 0
        pair_norm = lambda t: t[..., :4].unflatten(-1, (2, 2)).norm(dim=-1)  # noqa: E731
        assert torch.allclose(pair_norm(out), pair_norm(x), atol=1e-6)

    def test_inv_freq_is_a_checkpoint_buffer(self):
        rope = RotaryEmbedding(16)
        assert list(rope.state_dict()) == ["inv_freq"]
        assert torch.allclose(rope.inv_freq, 10000 ** (-torch.arange(0, 16, 2) / 16))


@pytest.mark.parametrize("cls,extra", [
    (DiT, dict(depth=2, ff_mult=2, text_dim=32, conv_layers=2)),
    (DiT, dict(depth=2, ff_mult=2, text_dim=32, conv_layers=2, text_mask_padding=False,
               pe_attn_head=1)),
    (UNetT, dict(depth=4, text_mask_padding=False, pe_attn_head=1)),
])
class TestBackbones:
    def _model(self, cls, extra):
        torch.manual_seed(0)
        model = cls(**_TINY, **extra).eval()
        with torch.no_grad():  # leave the zero init so outputs depend on every layer
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        return model

    def test_shapes_and_cfg_batch(self, cls, extra):
        model = self._model(cls, extra)
        x, cond = torch.randn(2, 11, 100), torch.randn(2, 11, 100)
        text = torch.tensor([[1, 2, 3, -1], [4, 5, 6, 7]])
        with torch.no_grad():
            out = model(x, cond, text, torch.tensor(0.5))
            both = model(x, cond, text, torch.tensor(0.5), cfg_infer=True)
            uncond = model(x, cond, text, torch.tensor(0.5), drop_audio_cond=True, drop_text=True)
        assert out.shape == (2, 11, 100)
        assert torch.allclose(both[:2], out, atol=1e-6)
        assert torch.allclose(both[2:], uncond, atol=1e-6)
        assert not torch.allclose(out, uncond)

    def test_cache_gives_same_result(self, cls, extra):
        model = self._model(cls, extra)
        x, cond, text = torch.randn(1, 9, 100), torch.randn(1, 9, 100), torch.tensor([[1, 2, 3]])
        with torch.no_grad():
            plain = model(x, cond, text, torch.tensor(0.2), cfg_infer=True)
            first = model(x, cond, text, torch.tensor(0.2), cfg_infer=True, cache=True)
            again = model(x, cond, text, torch.tensor(0.2), cfg_infer=True, cache=True)
        model.clear_cache()
        assert torch.equal(plain, first) and torch.equal(first, again)

    def test_a_nested_run_has_its_own_text_cache(self, cls, extra):
        model = self._model(cls, extra)
        x, cond = torch.randn(1, 9, 100), torch.randn(1, 9, 100)
        outer_text, inner_text = torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5]])
        with torch.no_grad(), model.own_text_cache():
            model(x, cond, outer_text, torch.tensor(0.2), cfg_infer=True, cache=True)
            outer = dict(model._text_cache)
            with model.own_text_cache():
                assert model._text_cache == {}
                model(x, cond, inner_text, torch.tensor(0.2), cfg_infer=True, cache=True)
            assert model._text_cache.keys() == outer.keys()
            assert all(model._text_cache[k] is outer[k] for k in outer)
        assert model._text_cache == {}  # as before the outer run

    def test_padding_frames_are_zeroed_in_attention(self, cls, extra):
        model = self._model(cls, extra)
        x, cond = torch.randn(2, 10, 100), torch.randn(2, 10, 100)
        mask = torch.arange(10)[None] < torch.tensor([10, 6])[:, None]
        block = model.transformer_blocks[0] if cls is DiT else model.layers[0][2]
        attn = block.attn if cls is DiT else block
        h = torch.randn(2, 10, 64)
        with torch.no_grad():
            out = attn(h, mask=mask, rope=model.rotary_embed.from_seq_len(10))
            full = model(x, cond, torch.tensor([[1, 2], [3, 4]]), torch.tensor(0.3), mask=mask)
        assert torch.equal(out[1, 6:], torch.zeros(4, 64))
        assert torch.isfinite(full).all()


def test_state_dict_keys_follow_upstream():
    dit = DiT(**_TINY, depth=1, text_dim=32, conv_layers=1)
    keys = set(dit.state_dict())
    for key in (
        "time_embed.time_mlp.0.weight", "time_embed.time_mlp.2.weight",
        "text_embed.text_embed.weight", "text_embed.text_blocks.0.grn.gamma",
        "input_embed.proj.weight", "input_embed.conv_pos_embed.conv1d.2.weight",
        "rotary_embed.inv_freq", "transformer_blocks.0.attn_norm.linear.weight",
        "transformer_blocks.0.attn.to_out.0.weight", "transformer_blocks.0.ff.ff.0.0.weight",
        "transformer_blocks.0.ff.ff.2.weight", "norm_out.linear.weight", "proj_out.weight",
    ):
        assert key in keys, key
    assert not any("freqs_cis" in k for k in keys)  # recomputed, not stored
    unett = UNetT(**_TINY, depth=4)
    keys = set(unett.state_dict())
    assert "layers.2.0.weight" in keys and "layers.1.0.weight" not in keys  # skip projections
    assert {"layers.0.1.g", "layers.0.3.g", "norm_out.g", "layers.0.4.ff.0.0.weight"} <= keys


def test_dit_zero_init_outputs_zero():
    model = DiT(**_TINY, depth=1).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 5, 100), torch.randn(1, 5, 100), torch.tensor([[1]]),
                    torch.tensor(0.1))
    assert torch.equal(out, torch.zeros_like(out))


def test_istft_same_padding_inverts_a_same_padded_stft():
    n_fft, hop = 64, 16
    signal = torch.randn(2, 40 * hop)
    pad = (n_fft - hop) // 2
    window = torch.hann_window(n_fft)
    spec = torch.stft(F.pad(signal, (pad, pad)), n_fft, hop, window=window, center=False,
                      return_complex=True)
    audio = ISTFT(n_fft, hop, n_fft, padding="same")(spec)
    frames = spec.shape[-1]
    assert audio.shape == (2, frames * hop)
    # the outer half-hop at each end has a thin window envelope; the body reconstructs
    body = slice(n_fft, frames * hop - n_fft)
    assert torch.allclose(audio[:, body], signal[:, body], atol=1e-5)
    assert math.isclose(ISTFT(n_fft, hop, n_fft).window.sum().item(), n_fft / 2, rel_tol=1e-6)
