"""VoxCPM text preparation (upstream comparisons live in tests/parity)."""

from __future__ import annotations

import pytest

from mizuoto_voxcpm.text import (
    collapse_whitespace,
    model_text,
    prepare_prompt_text,
    prepare_target_text,
    with_instruction,
)


def test_collapse_whitespace_keeps_the_ends():
    assert collapse_whitespace("a\n\nb\t c\u3000d") == "a b c d"
    assert collapse_whitespace("  a  ") == " a "


def test_instruction_prefix():
    assert with_instruction(" 你好 ", " 温柔的女声 ") == "(温柔的女声)你好"
    assert with_instruction("hi", "calm (slow) voice（低沉）") == "(calm slow voice低沉)hi"
    assert with_instruction("hi", "  ") == "hi"
    assert with_instruction("hi", "()") == "hi"
    assert with_instruction(" hi ", None) == "hi"


def test_prepare_target_text_order():
    calls = []

    class Recorder:
        def normalize(self, text):
            calls.append(text)
            return text.upper()

    out = prepare_target_text("a\n b", instruction="warm", normalize=True, normalizer=Recorder())
    # prefix first, then whitespace, then the normalizer sees the whole string
    assert calls == ["(warm)a b"]
    assert out == "(WARM)A B"
    assert prepare_target_text("a\n b") == "a b"


def test_prepare_target_text_rejects_empty():
    with pytest.raises(ValueError, match="empty"):
        prepare_target_text(" \n ")


def test_model_text_joins_without_separator():
    assert model_text("world", "hello") == "helloworld"
    assert model_text("world") == "world"
    assert prepare_prompt_text("  hello\n") == "hello"
