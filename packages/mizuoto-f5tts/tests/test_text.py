"""Text tokens and ids (upstream's behaviour, checked on known cases; parity tests compare all)."""

from __future__ import annotations

import torch

from mizuoto_f5tts import text


def test_chinese_becomes_tone_pinyin_with_space_tokens():
    assert text.to_tokens("你好") == [" ", "ni2", " ", "hao3"]  # tone sandhi: ni3 -> ni2


def test_english_stays_characters_with_a_space_between_words():
    assert text.to_tokens("Hi you") == ["H", "i", " ", "y", "o", "u"]


def test_mixed_word_and_folded_punctuation():
    assert text.to_tokens("2024年") == ["2", "0", "2", "4", " ", "nian2"]
    assert text.to_tokens("“a”;") == ['"', "a", '"', ","]


def test_unknown_tokens_take_id_zero(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text(" \na\nb\n", encoding="utf-8")
    vocab = text.read_vocab(path)
    assert vocab == {" ": 0, "a": 1, "b": 2}
    assert torch.equal(text.token_ids(["b", "z", "a"], vocab), torch.tensor([2, 0, 1]))


def test_unknown_tokens_are_what_takes_id_zero(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text(" \na\nb\n", encoding="utf-8")
    assert text.unknown_tokens("ab zä", text.read_vocab(path)) == ["z", "ä"]


def test_vocab_without_final_newline_loses_a_character(tmp_path, caplog):
    path = tmp_path / "vocab.txt"
    path.write_text(" \nab\ncd", encoding="utf-8")
    assert text.read_vocab(path) == {" ": 0, "ab": 1, "c": 2}
    assert "newline" in caplog.text
