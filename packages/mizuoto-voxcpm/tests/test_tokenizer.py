"""VoxCPMTokenizer on the fixture tokenizer (upstream comparisons live in tests/parity)."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from mizuoto_voxcpm.tokenizer import (
    AUDIO_END_TOKEN_ID,
    AUDIO_START_TOKEN_ID,
    REF_AUDIO_END_TOKEN_ID,
    REF_AUDIO_START_TOKEN_ID,
    VoxCPMTokenizer,
    is_cjk_word,
)
from mizuoto_voxcpm.tokenizer_fixture import AUDIO_SPECIAL_TOKENS, write_test_tokenizer


@pytest.fixture(scope="module", params=[True, False], ids=["legacy", "non-legacy"])
def model_dir(request, tmp_path_factory):
    return write_test_tokenizer(tmp_path_factory.mktemp("tok"), legacy=request.param)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return VoxCPMTokenizer.from_model_dir(model_dir)


def _id(tokenizer, token):
    index = tokenizer.backend.token_to_id(token)
    assert index is not None, token
    return index


def test_fixture_files_are_deterministic(tmp_path):
    first = write_test_tokenizer(tmp_path / "a", legacy=True)
    second = write_test_tokenizer(tmp_path / "b", legacy=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes()


def test_fixture_legacy_flag_is_written(tmp_path):
    assert json.loads((write_test_tokenizer(tmp_path / "t", legacy=True)
                       / "tokenizer_config.json").read_text())["legacy"] is True
    assert json.loads((write_test_tokenizer(tmp_path / "f", legacy=False)
                       / "tokenizer_config.json").read_text())["legacy"] is False
    assert "legacy" not in json.loads((write_test_tokenizer(tmp_path / "n", legacy=None)
                                       / "tokenizer_config.json").read_text())


def test_special_ids(tokenizer):
    assert (tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2)
    assert (AUDIO_START_TOKEN_ID, AUDIO_END_TOKEN_ID, REF_AUDIO_START_TOKEN_ID,
            REF_AUDIO_END_TOKEN_ID) == (101, 102, 103, 104)
    for index, name in AUDIO_SPECIAL_TOKENS.items():
        assert tokenizer.backend.token_to_id(name) == index
        assert tokenizer.encode(name) == [index]


def test_no_bos_added(tokenizer):
    ids = tokenizer.encode("hello")
    assert ids == [_id(tokenizer, "\u2581hello")]
    assert tokenizer.bos_id not in ids


def test_multichar_cjk_tokens_are_split(tokenizer):
    assert "你好" in tokenizer.backend.get_vocab()
    assert tokenizer.backend.encode("世界", add_special_tokens=False).tokens == ["\u2581", "世界"]
    assert tokenizer.tokenize("世界") == ["\u2581", "世", "界"]
    assert tokenizer.encode("世界") == [_id(tokenizer, "\u2581"), _id(tokenizer, "世"),
                                      _id(tokenizer, "界")]


def test_split_drops_the_space_marker(tokenizer):
    # upstream quirk: "▁你好" is looked up as "你好" and split, so the space disappears
    assert tokenizer.backend.encode("我们 你好", add_special_tokens=False).tokens == [
        "\u2581我们", "\u2581你好"]
    assert tokenizer.encode("我们 你好") == tokenizer.encode("我们你好")


def test_unknown_characters_of_a_split_token_become_unk(tokenizer):
    # "龘龘" is an added token whose characters are not in the vocab
    assert tokenizer.tokenize("龘龘") == ["龘", "龘"]
    assert tokenizer.encode("龘龘") == [tokenizer.unk_id, tokenizer.unk_id]


def test_unknown_tokens_are_the_ones_read_as_unk(tokenizer):
    """What the engine reports in applied.warnings: only the characters read as <unk>."""
    assert tokenizer.unknown_tokens("龘龘") == ["龘", "龘"]
    assert tokenizer.unknown_tokens("hello") == []


def test_byte_fallback_for_unknown_characters(tokenizer):
    ids = tokenizer.encode("😀")
    assert [tokenizer.backend.id_to_token(i) for i in ids] == [
        "\u2581", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert tokenizer.decode(ids) == "😀"


def test_leading_whitespace_gets_one_marker(tokenizer, model_dir):
    # transformers 5 drops tokenizer.json's normalizer (prepend "▁" + spaces to "▁"), so a leading
    # space yields one "▁", not two; using the file as-is would differ
    assert tokenizer.encode(" hello") == tokenizer.encode("hello")
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert raw.encode(" hello", add_special_tokens=False).ids != tokenizer.encode(" hello")


def test_text_after_a_special_token(tmp_path):
    legacy = VoxCPMTokenizer.from_model_dir(write_test_tokenizer(tmp_path / "l", legacy=True))
    first = VoxCPMTokenizer.from_model_dir(write_test_tokenizer(tmp_path / "f", legacy=False))
    default = VoxCPMTokenizer.from_model_dir(write_test_tokenizer(tmp_path / "d", legacy=None))
    # legacy: every span after a special token gets a "▁"; otherwise only the text's start
    assert legacy.tokenize("<s>hello") == ["<s>", "\u2581hello"]
    assert first.tokenize("<s>hello") == ["<s>", "hello"]
    assert default.encode("<s>hello") == first.encode("<s>hello")
    raw = Tokenizer.from_file(str(tmp_path / "f" / "tokenizer.json"))
    assert raw.encode("<s>hello", add_special_tokens=False).ids != first.encode("<s>hello")


def test_is_cjk_word():
    assert is_cjk_word("你好")
    assert not is_cjk_word("你")
    assert not is_cjk_word("\u2581你好")
    assert not is_cjk_word("你a")


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        VoxCPMTokenizer.from_model_dir(tmp_path)


def test_special_token_missing_from_vocab_takes_next_free_id(tmp_path):
    directory = write_test_tokenizer(tmp_path, legacy=False)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["pad_token"] = "<pad>"
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = VoxCPMTokenizer.from_model_dir(directory)
    size = tokenizer.backend.get_vocab_size(with_added_tokens=False)
    assert tokenizer.backend.token_to_id("<pad>") == size
    assert tokenizer.encode("<pad>") == [size]
