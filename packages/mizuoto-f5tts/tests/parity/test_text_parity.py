"""Text handling against upstream's functions: tokens, ids, vocabulary reading, chunking."""

from __future__ import annotations

from importlib.resources import files

import pytest
import torch

from mizuoto_f5tts import chunking, text

pytestmark = pytest.mark.parity

SAMPLES = [
    "Some call me nature, others call me mother nature.",
    "对，这就是我，万人敬仰的太乙真人。",
    "我爱Python编程，你呢？",
    "行长说：银行的行长很忙。",
    "2024年，我们去了 New York; it was “great”, wasn’t it?",
    "こんにちは世界",
    "한국어 text",
    "Ünïcödé café — naïve résumé",
    "１２３ＡＢＣ，全角！",
    "ok。next:then 'quoted' \"double\"",
    "  spaces   and\ttabs\nnewline  ",
    "重庆的重量很重，长城很长。",
]

LONG = ("I don't really care what you call me. I've been a silent spectator, watching species "
        "evolve, empires rise and fall. But always remember, I am mighty and enduring! Respect "
        "me; ignore me: face the consequences? 我是一个测试。你好世界！这是第三句：还有；最后，"
        "完了。Mixed 中文 and English, at the end.")


@pytest.fixture(scope="module")
def utils():
    from f5_tts.model import utils as model_utils

    return model_utils


def test_tokens_match_convert_char_to_pinyin(utils):
    expected = utils.convert_char_to_pinyin(SAMPLES)
    assert [text.to_tokens(sample) for sample in SAMPLES] == expected


def test_ids_match_list_str_to_idx(utils, tmp_path):
    vocab_path = str(files("f5_tts").joinpath("infer/examples/vocab.txt"))
    upstream_vocab, size = utils.get_tokenizer(vocab_path, "custom")
    ours = text.read_vocab(vocab_path)
    assert ours == upstream_vocab and len(ours) == size == 2545
    for sample in SAMPLES:
        tokens = utils.convert_char_to_pinyin([sample])
        expected = utils.list_str_to_idx(tokens, upstream_vocab)[0]
        assert torch.equal(text.encode(sample, ours), expected)


def test_vocab_quirks_match_get_tokenizer(utils, tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text(" \na\nb\na\nlast", encoding="utf-8")  # a repeat, no final newline
    expected, size = utils.get_tokenizer(str(path), "custom")
    ours = text.read_vocab(path)
    assert ours == expected and len(ours) == size
    assert "las" in ours  # the last line loses its last character without a final newline


@pytest.mark.parametrize("max_bytes", [1, 10, 40, 80, 135, 200, 1000])
def test_chunk_text_matches(max_bytes):
    from f5_tts.infer.utils_infer import chunk_text

    for sample in [LONG, *SAMPLES]:
        assert chunking.chunk_text(sample, max_bytes) == chunk_text(sample, max_chars=max_bytes)
