"""Chunking long text as upstream does."""

from __future__ import annotations

from mizuoto_f5tts.chunking import chunk_text, max_chunk_bytes


def test_sentences_are_grouped_up_to_the_byte_limit():
    assert chunk_text("One. Two. Three.", 10) == ["One. Two.", "Three."]
    assert chunk_text("One. Two. Three.", 100) == ["One. Two. Three."]


def test_a_long_sentence_is_a_chunk_of_its_own():
    assert chunk_text("A very long sentence here. Short.", 5) == ["A very long sentence here.",
                                                                  "Short."]


def test_cjk_punctuation_splits_without_whitespace():
    assert chunk_text("你好。世界！", 6) == ["你好。", "世界！"]
    assert chunk_text("你好。世界！", 100) == ["你好。世界！"]


def test_limit_is_bytes_per_second_times_remaining_seconds():
    # 30 bytes over 2 s of reference: 15 bytes/s * (22 - 2) s
    assert max_chunk_bytes("x" * 30, 48000, 24000) == 300
    assert max_chunk_bytes("x" * 30, 48000, 24000, speed=0.5) == 150
