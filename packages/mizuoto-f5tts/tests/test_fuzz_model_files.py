"""Property tests (nox -s fuzz): an F5-TTS checkpoint whose tensors claim any sizes (empty tensors
cost nothing in the file) and a voice file of any shape, rate and text are either what this
package builds or refused by name; nothing else escapes and nothing is built for them."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mizuoto.errors import CheckpointMismatch, InvalidRequest
from mizuoto.nn.transformer import RotaryEmbedding
from mizuoto_f5tts.checkpoint import _MOST, detect_variant
from mizuoto_f5tts.reference import check_voice
from mizuoto_f5tts.variants import get_variant

_SIZE = st.one_of(st.integers(min_value=0, max_value=4), st.integers(min_value=0, max_value=10**7))


def _state(dim, dim_head, text_dim, mel_dim, inner, ff_inner, depth):
    """Key layout of a v1 DiT, every tensor empty but for the sizes the variant is read from."""
    state = {"transformer.time_embed.time_mlp.2.weight": torch.empty(dim, 0),
             "transformer.proj_out.weight": torch.empty(mel_dim, 0),
             "transformer.rotary_embed.inv_freq": torch.empty(dim_head // 2),
             "transformer.text_embed.text_embed.weight": torch.empty(0, text_dim)}
    for index in range(depth):
        block = f"transformer.transformer_blocks.{index}."
        state[block + "attn.to_q.weight"] = torch.empty(inner, 0)
        state[block + "ff.ff.0.0.weight"] = torch.empty(ff_inner, 0)
    return state


@settings(max_examples=150, deadline=None)
@given(dim=_SIZE, dim_head=_SIZE, text_dim=_SIZE, mel_dim=st.sampled_from([0, 80, 100, 10**6]),
       inner=_SIZE, ff_inner=_SIZE, depth=st.integers(min_value=0, max_value=300))
def test_hostile_checkpoint_sizes_are_read_or_named(dim, dim_head, text_dim, mel_dim, inner,
                                                    ff_inner, depth):
    try:
        variant = detect_variant(_state(dim, dim_head, text_dim, mel_dim, inner, ff_inner,
                                        depth), "v1_base")
    except CheckpointMismatch as exc:
        assert "F5-TTS" in str(exc) or "multiple" in str(exc) or "mel" in str(exc)
    else:
        assert variant.dim <= _MOST["dim"] and variant.depth <= _MOST["depth"]
        assert variant.heads * variant.dim_head == inner and variant.mel_dim == 100


def test_the_generator_builds_a_real_layout():
    """The generator above is the real layout: a tiny v1 checkpoint's sizes pass through it."""
    tiny = get_variant("v1_base", "tiny")
    found = detect_variant(_state(tiny.dim, tiny.dim_head, tiny.text_dim, 100,
                                  tiny.heads * tiny.dim_head, tiny.dim * 2, tiny.depth),
                           "v1_base")
    assert (found.dim, found.depth, found.heads) == (tiny.dim, tiny.depth, tiny.heads)
    assert RotaryEmbedding(tiny.dim_head).inv_freq.numel() == tiny.dim_head // 2


@settings(max_examples=150, deadline=None)
@given(shape=st.lists(st.integers(min_value=0, max_value=40), max_size=3),
       rate=st.integers(min_value=-5, max_value=10**6), text=st.sampled_from(["", " \n", "Hi."]),
       fill=st.sampled_from([0.0, 0.5, float("nan"), float("inf")]),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.int16]))
def test_hostile_voice_waveforms_are_accepted_only_as_build_voice_makes_them(shape, rate, text,
                                                                            fill, dtype):
    waveform = torch.full(shape, fill).to(dtype) if dtype.is_floating_point else \
        torch.zeros(shape, dtype=dtype)
    try:
        check_voice(waveform, rate, text)
    except InvalidRequest as exc:
        assert exc.field == "voice" and exc.fix
    else:
        assert len(shape) == 2 and shape[1] > 0 and fill == 0.5 and text.strip()


