"""A small, deterministic Llama-style BPE tokenizer for random-init VoxCPM test checkpoints.

No VoxCPM tokenizer can be downloaded in tests, so fixtures write this one into the model
directory. It has the shape of the released one where it matters to the text path: `<unk>`,
`<s>`, `</s>` at ids 0-2, the four audio tokens at ids 101-104 (upstream hard-codes these ids),
byte-fallback tokens `<0x00>`..`<0xFF>`, ASCII, a few hundred common CJK characters, and
multi-character CJK merges so that VoxCPM's splitting of CJK words is exercised. The vocab and
merges are listed, not trained, so the files are identical on every run.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
from tokenizers.models import BPE

__all__ = ["AUDIO_SPECIAL_TOKENS", "write_test_tokenizer"]

# Names are ours: upstream addresses these tokens only by id (audio_start_token = 101, ...).
AUDIO_SPECIAL_TOKENS = {
    101: "<|audio_start|>",
    102: "<|audio_end|>",
    103: "<|ref_audio_start|>",
    104: "<|ref_audio_end|>",
}

_SPACE = "\u2581"  # the Metaspace replacement character

# Common characters, plus everything the Chinese normalizer writes for numbers, dates, units.
_CJK_CHARS = (
    "的一是不了在人有我他这个们中来上大为和国地到以说时要就出会可也你对生能而子那得于着下自之"
    "年过发后作里用道行所然家种事成方多经么去法学如都同现当没动面起看定天分还进好小部其些主样理心"
    "她本前开但因只从想实日军者意无力它与长把机十民第公此已工使情明性知全三又关点正业外将两高间由"
    "问很最重并物手应战向头文体政美相见被利什二等产或新己制身果加西斯月话合回特代内信表化老给世位"
    "次度门任常先海通教儿原东声提立及比员解水名真论处走义各入几口认条平系气题活尔更别打女变四神总"
    "何电数安少报才结反受目太量再感建务做接必场件计管期市直德资命山金指克许统区保至队形社便空决治"
    "展马科司五基眼书非则听白却界达光放强即像难且权思王象完设式色路记南品住告类求据程北边死张该交"
    "规万取拉格望觉术领共确传师观清今切院让识候带导争运笑飞风步改收根干造言联持组每济车亲极林服快"
    "办议往元英士证近失转夫令准布始怎呢存未远叫台单影具罗字爱击流备兵连调深商算质团集百需价花党华"
    "城石级整府离况亚请技际约示复病息究线似官火断精满支视消越器容照须九增研写称企八功吗包片史委乎"
    "查轻易早曾除农找装广显吧阿李标谈吃图念六引历首医局突专费号尽另周较注语仅考落青随选列武红响虽"
    "推势参希古众构房半节土投某案黑维革划敌致陈律足态护七兴派孩验责营星够章音跟志底站严巴例防族供"
    "效续施留讲型料终答紧黄绝奇察母京段依批群项故按河米围江织害斗双境客纪采举杀攻父苏密低朝友诉止"
    "零两亿千角秒钟率负约等于加减乘除第号周星期半刻儿哪玩点块钱岁度公斤米克升毫厘"
    "你好我们今天气北京上海时间朋友谢再见早晚饭喝茶咖啡音乐电影读书"
)

# Multi-character CJK tokens (built left to right by merges). "▁你好" is a vocab entry too:
# upstream's wrapper strips "▁" before looking a token up, so it splits it and drops the "▁".
_CJK_WORDS = (
    "你好", "世界", "中国", "我们", "今天", "天气", "北京", "上海", "时间", "朋友", "谢谢",
    "再见", "一个", "没有", "什么", "现在", "可以", "这个", "音乐", "电影", "咖啡", "百分之",
    "星期", "一百", "你好世界",
)
_CJK_WORDS_WITH_SPACE = ("你好", "中国", "我们")

# Merged ASCII words (built left to right by merges).
_ASCII_WORDS = (
    "th", "he", "in", "er", "an", "on", "re", "the", "ing", "and", "hello", "world", "this",
    "is", "test", "voice", "speech", "one", "two", "three", "hundred", "thousand", "dollars",
    "percent", "twenty", "seventy", "five", "four", "six", "seven", "eight", "nine", "ten",
)

# A pure-CJK added token whose characters are not in the vocab: the upstream wrapper splits
# it into characters and each becomes <unk>.
_UNKNOWN_CHAR_WORD = "龘龘"


def _add_merge(left: str, right: str, vocab: dict[str, int], merges: list[tuple[str, str]]) -> None:
    for part in (left, right):
        if part not in vocab:
            raise ValueError(f"fixture vocab lacks {part!r} needed to build {left + right!r}")
    if left + right not in vocab:
        vocab[left + right] = len(vocab)
        merges.append((left, right))


def _merge_chain(word: str, vocab: dict[str, int], merges: list[tuple[str, str]]) -> None:
    """Add ``word`` and every left prefix of it, with the merges that build them."""
    prefix = word[0]
    for char in word[1:]:
        _add_merge(prefix, char, vocab, merges)
        prefix += char


def _vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    vocab: dict[str, int] = {"<unk>": 0, "<s>": 1, "</s>": 2, _SPACE: 3}
    for code in range(0x21, 0x7F):
        vocab[chr(code)] = len(vocab)
    merges: list[tuple[str, str]] = []
    for word in (_SPACE + "t", _SPACE + "a", _SPACE + "th"):
        _merge_chain(word, vocab, merges)
    if len(vocab) != 101:
        raise AssertionError(f"fixture layout drifted: {len(vocab)} tokens before the audio ones")
    for token_id, name in AUDIO_SPECIAL_TOKENS.items():
        vocab[name] = token_id
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for char in dict.fromkeys(_CJK_CHARS):
        if char not in vocab:
            vocab[char] = len(vocab)
    for word in _CJK_WORDS:
        _merge_chain(word, vocab, merges)
    for word in _CJK_WORDS_WITH_SPACE:
        _add_merge(_SPACE, word, vocab, merges)
    for word in _ASCII_WORDS:
        _merge_chain(word, vocab, merges)
    for word in _ASCII_WORDS:
        _add_merge(_SPACE, word, vocab, merges)
    vocab[_UNKNOWN_CHAR_WORD] = len(vocab)
    return vocab, merges


def _added_token_entry(content: str, *, special: bool) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": special}


def write_test_tokenizer(directory: str | Path, *, legacy: bool | None = True) -> Path:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json``.

    ``legacy`` is written into ``tokenizer_config.json`` (``None`` leaves the key out); it
    decides whether a "▁" is prepended to every text span (True) or only at the very start.
    The ``tokenizer.json`` holds a Llama-2 style normalizer (prepend "▁", spaces to "▁") that
    transformers 5 ignores; it is there so tests can show that using the file as-is differs.
    Returns ``directory``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab, merges = _vocab_and_merges()

    tokenizer = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                              byte_fallback=True))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend(_SPACE), normalizers.Replace(" ", _SPACE)]
    )
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(content=" ", left=1),
    ])
    special_ids = {0: "<unk>", 1: "<s>", 2: "</s>", **AUDIO_SPECIAL_TOKENS}
    tokenizer.add_special_tokens([
        AddedToken(name, special=True, normalized=False) for _, name in sorted(special_ids.items())
    ])
    tokenizer.add_tokens([AddedToken(_UNKNOWN_CHAR_WORD, special=False, normalized=False)])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", 1)]
    )
    tokenizer.save(str(directory / "tokenizer.json"))

    added = {str(i): _added_token_entry(name, special=True) for i, name in sorted(special_ids.items())}
    added[str(vocab[_UNKNOWN_CHAR_WORD])] = _added_token_entry(_UNKNOWN_CHAR_WORD, special=False)
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "bos_token": "<s>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "model_max_length": 1000000000000000019884624838656,
        "pad_token": None,
        "sp_model_kwargs": {},
        "spaces_between_special_tokens": False,
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": "<unk>",
        "use_default_system_prompt": False,
    }
    if legacy is not None:
        config["legacy"] = legacy
    (directory / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    special_map = {
        "bos_token": _added_token_entry("<s>", special=True),
        "eos_token": _added_token_entry("</s>", special=True),
        "unk_token": _added_token_entry("<unk>", special=True),
    }
    for entry in special_map.values():
        del entry["special"]
    (directory / "special_tokens_map.json").write_text(
        json.dumps(special_map, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return directory
