"""Text up to the model card's max_input_chars is spoken at any speed, even without sentence
punctuation (upstream's splitter leaves it one chunk the model's positions cannot cover);
chunks that fit stay as upstream makes them (issue 33, 4)."""

from __future__ import annotations

import pytest

from mizuoto import SynthesisRequest
from mizuoto.serve.routes import MAX_INPUT_CHARS
from mizuoto_f5tts import engine as engine_module
from mizuoto_f5tts.chunking import chunk_text, split_to_fit


@pytest.mark.parametrize("text,limit", [("word " * 40, 23), ("a" * 100, 7), ("語" * 30, 10),
                                        ("ab cd" + "x" * 50, 8)])
def test_split_to_fit_keeps_every_character_within_the_limit(text, limit):
    pieces = split_to_fit(text, limit)
    assert all(0 < len(p.encode()) <= limit for p in pieces)
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")


def test_split_to_fit_leaves_a_chunk_that_fits_alone():
    assert split_to_fit("a short one", 135) == ["a short one"]
    assert chunk_text("One. Two.", 135) == ["One. Two."]


@pytest.mark.parametrize("text", ["a" * MAX_INPUT_CHARS,
                                  ("word " * (MAX_INPUT_CHARS // 5)).strip()])
def test_the_card_limit_is_spoken_at_the_slowest_speed(engine, ref, text, monkeypatch):
    """As long as the card allows, unpunctuated, at speed 0.25: split, never refused. The
    sampler is replaced by one that records the chunks (their count is the point)."""
    import torch

    frames = []

    def sample(cond, tokens, duration, **kwargs):
        frames.append(duration)
        return torch.zeros(1, duration, 100), None

    monkeypatch.setattr(engine.model, "sample", sample)
    monkeypatch.setattr(engine_module, "vocode", lambda vocoder, mel, **kwargs:
                        torch.full((1, mel.shape[-1] * 256), 0.1))
    result = engine.synthesize(SynthesisRequest(text, seed=1, steps=2, reference=ref,
                                                params={"speed": 0.25}))
    limit = engine.model.transformer.text_embed.max_positions
    assert len(frames) > 1 and max(frames) <= limit and result.audio.samples.numel() > 0
