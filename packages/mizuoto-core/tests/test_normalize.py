"""mizuoto.text normalizer (needs the [text] extra; upstream comparisons live in the VoxCPM
parity tests)."""

from __future__ import annotations

import sys

import pytest

from mizuoto.text import NormalizerUnavailable, TextNormalizer, detect_language
from mizuoto.text.normalize import _digit_runs, _replace_blank


@pytest.fixture(scope="module")
def normalizer():
    return TextNormalizer()


def test_detect_language():
    assert detect_language("hello 你") == "zh"
    assert detect_language("hello 123") == "en"
    assert detect_language("こんにちは") == "en"  # kana only: upstream treats it as English


@pytest.mark.parametrize(("text", "expected"), [
    ("今天是2024年3月15日，气温25.5度。", "今天是二零二四年三月十五日，气温二十五点五度。"),
    ("哪儿好玩儿", "哪好玩"),  # erhua removed even without digits
    ("x-2=3 和 a-b", "x减二等于三和a减b"),
    ("x-2=3", "x minus two equals three"),  # no CJK character: the English path
    ("I have 20% of 1,000 apples.", "I have twenty percent of thousand apples ."),
    ("Call me at 10:30 pm.", "Call me at ten thirty PM ."),
    ("😀 hello 123", "hello one hundred and twenty three"),
    ("<|audio_start|>你好", "你好"),  # tag-like text is stripped by upstream's Markdown cleaner
    ("  abc  ", "abc"),
])
def test_known_outputs(normalizer, text, expected):
    assert normalizer.normalize(text) == expected


def test_replace_blank_keeps_spaces_between_ascii_only():
    assert _replace_blank("你 好 a b") == "你好a b"


def test_digit_runs_use_isdigit():
    assert _digit_runs("a12²b") == ["a", "12²", "b"]


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "wetext", None)
    with pytest.raises(NormalizerUnavailable, match=r"mizuoto-core\[text\]"):
        TextNormalizer()
