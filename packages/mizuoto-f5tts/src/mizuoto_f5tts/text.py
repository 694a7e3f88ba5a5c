"""Text for F5-TTS: the character vocabulary, Chinese to tone-numbered pinyin, and token ids.

The model reads characters. Chinese characters become tone-numbered pinyin syllables (``ni3``),
each preceded by a space token; everything else stays a character. Ids are vocabulary line
numbers; the model's text embedding adds one so that id 0 can be its padding filler.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch

log = logging.getLogger(__name__)

# Punctuation upstream folds into the vocabulary before tokenising (out-of-vocabulary fixes).
_FOLD_PUNCTUATION = str.maketrans({";": ",", "“": '"', "”": '"', "‘": "'", "’": "'"})
# After these an ASCII word is not separated by an extra space token.
_NO_SPACE_AFTER = " :'\""


def read_vocab(path: str | Path) -> dict[str, int]:
    """Map each vocabulary token (one per line) to its line number.

    Lines are read as upstream's ``get_tokenizer`` reads them (``line[:-1]``): the file must end
    with a newline, or its last token loses its last character. A token listed twice keeps its
    last line number, and the vocabulary size is the number of distinct tokens.
    """
    vocab: dict[str, int] = {}
    with open(path, encoding="utf-8") as handle:
        for index, line in enumerate(handle):
            vocab[line[:-1]] = index
    if vocab and not Path(path).read_bytes().endswith(b"\n"):
        log.warning("%s does not end with a newline: its last token is read without its last "
                    "character, as upstream F5-TTS reads it", path)
    return vocab


def is_chinese(char: str) -> bool:
    """Upstream's test: bopomofo through the CJK unified ideographs block."""
    return "\u3100" <= char <= "\u9fff"


def _pinyin(text: str) -> list[str]:
    from pypinyin import Style, lazy_pinyin

    return lazy_pinyin(text, style=Style.TONE3, tone_sandhi=True)


def to_tokens(text: str, *, polyphone: bool = True) -> list[str]:
    """Split ``text`` into model tokens, as upstream's ``convert_char_to_pinyin``.

    Words come from jieba (``rjieba``): an ASCII word is kept character by character (with a
    space token before it when it follows other text); a word of 3-byte characters is converted
    as a whole, so pypinyin sees the context for polyphones and tone sandhi; a mixed word is
    converted character by character.
    """
    import rjieba

    tokens: list[str] = []
    for word in rjieba.cut(text.translate(_FOLD_PUNCTUATION)):
        n_bytes = len(word.encode("utf-8"))
        if n_bytes == len(word):
            if tokens and n_bytes > 1 and tokens[-1] not in _NO_SPACE_AFTER:
                tokens.append(" ")
            tokens.extend(word)
        elif polyphone and n_bytes == 3 * len(word):
            syllables = _pinyin(word)
            for index, char in enumerate(word):
                if is_chinese(char):
                    tokens.append(" ")
                # upstream indexes the pinyin list by character position, as we do
                tokens.append(syllables[index])
        else:
            for char in word:
                if ord(char) < 256:
                    tokens.append(char)
                elif is_chinese(char):
                    tokens.append(" ")
                    tokens.extend(_pinyin(char))
                else:
                    tokens.append(char)
    return tokens


def token_ids(tokens: list[str], vocab: Mapping[str, int]) -> torch.Tensor:
    """Vocabulary ids of ``tokens``; an unknown token gets id 0 (the space in upstream's vocab)."""
    return torch.tensor([vocab.get(token, 0) for token in tokens], dtype=torch.long)


def unknown_tokens(text: str, vocab: Mapping[str, int]) -> list[str]:
    """The tokens of ``text`` that are not in ``vocab`` (read as id 0, a space, by
    :func:`token_ids`): what the model does not speak. A Chinese character's token is its
    pinyin syllable."""
    return [token for token in to_tokens(text) if token not in vocab]


def encode(text: str, vocab: Mapping[str, int]) -> torch.Tensor:
    """``text`` as a 1-D tensor of vocabulary ids."""
    return token_ids(to_tokens(text), vocab)
