"""VoxCPM's text side against upstream voxcpm 2.0.3 + transformers 5.3: token ids, normalizer
output and the whole preparation (demo prefix -> VoxCPM.generate -> model text -> ids).

Exact equality on a generated corpus of several hundred texts.
"""

from __future__ import annotations

import itertools
import json
import re

import pytest
import torch

pytestmark = pytest.mark.parity

voxcpm_core = pytest.importorskip("voxcpm.core")
from transformers import LlamaTokenizerFast  # noqa: E402
from voxcpm.cli import build_final_text  # noqa: E402
from voxcpm.model.utils import mask_multichar_chinese_tokens  # noqa: E402
from voxcpm.model.voxcpm2 import VoxCPM2Model  # noqa: E402
from voxcpm.utils.text_normalize import TextNormalizer as UpstreamNormalizer  # noqa: E402

from mizuoto.text import TextNormalizer  # noqa: E402
from mizuoto_voxcpm.text import (  # noqa: E402
    model_text,
    prepare_prompt_text,
    prepare_target_text,
    with_instruction,
)
from mizuoto_voxcpm.tokenizer import VoxCPMTokenizer  # noqa: E402
from mizuoto_voxcpm.tokenizer_fixture import write_test_tokenizer  # noqa: E402

# ---------------------------------------------------------------------------- corpus

_ZH_TEMPLATES = (
    "今天是{v}。", "我有{v}个苹果", "价格是{v}，请确认。", "他说：“{v}”", "{v}",
    "会议定在{v}开始", "温度大约{v}左右", "北京到上海{v}", "你好世界，{v}！", "这儿的{v}真好玩儿",
)
_ZH_VALUES = (
    "2024年3月15日", "3.14", "-5", "1,234,567", "15%", "12.5%", "￥120", "120元", "$3.50",
    "10:30", "下午3:45", "2023-12-31", "5kg", "3/4", "第1名", "13800138000",
)
_EN_TEMPLATES = (
    "I have {v} apples.", "The price is {v}.", "Meet me at {v}, please.", "{v}",
    "It was {v} percent of the vote", "Chapter {v} begins here!", "She said \"{v}\" twice.",
    "Call {v} now", "hello world {v}", "This is the first test sentence {v}",
)
_EN_VALUES = (
    "2024", "3.14", "-5", "1,234,567", "15%", "$3.50", "€20", "£7.25", "10:30 pm", "Jan 5, 2023",
    "3/15/2024", "1st", "22nd", "100 km", "5 kg", "1990s",
)
_MIXED = (
    "我在用iPhone 15 Pro拍照", "今天的meeting改到3点", "VoxCPM是一个TTS模型", "AI和ML的区别",
    "我喜欢listening to music", "GPT-4发布于2023年", "请打开第3个file", "Python 3.11很快",
    "x-2=3 和 a-b", "a²+b³=c²", "√2≈1.414", "3<5 而 5>3", "价格（含税）为100元", "【注意】请排队",
    "他——一个老师——来了", "用`code`写", "# 标题\n- 第一项\n- 第二项", "[链接](http://x.y)的文字",
    "![图](a.png)图片后面", "```\n代码块\n```之后", "<b>粗体</b>文本", "“引号”里面", "tab\t分隔\t文本",
    "全角　空格", "中文, English; 混合: 标点!", "一点儿也不", "哪儿", "这儿有3个人", "儿子和女儿",
    "玩儿命", "那儿的100块钱", "兒童", "我们 你好", "你好世界我们", "龘龘", "龘", "𠀀字", "こんにちは",
    "안녕하세요", "😀😀", "👍 好的", "❤️ love", "Café naïve", "ﬁ ligature", "½ cup", "①②③",
    "α β γ", "100°C", "50 m²", "1/2", "-3.5", "0", "007", "3.0", "1e5", "10,000,000",
)
_SPECIAL = (
    "<s>hello", "<s>你好", "</s>world", "<unk>x", "<|audio_start|>你好", "hello<|audio_end|>",
    "<|ref_audio_start|>123<|ref_audio_end|>", "<s> hello", "你好<s>世界", "<s><s>",
)
_WHITESPACE = (" ", "  ", "\n", "\t", " \n ", "\u3000", "\r\n")


def corpus() -> list[str]:
    texts: list[str] = []
    texts += [t.format(v=v) for t, v in itertools.product(_ZH_TEMPLATES, _ZH_VALUES)]
    texts += [t.format(v=v) for t, v in itertools.product(_EN_TEMPLATES, _EN_VALUES)]
    texts += list(_MIXED) + list(_SPECIAL)
    base = ("你好", "hello world", "今天是2024年3月15日", "I have 3 apples.", "<s>hello")
    for space, text in itertools.product(_WHITESPACE, base):
        texts += [space + text, text + space, text.replace(" ", space * 2)]
    texts += ["第一行\n第二行", "line one\nline two", "多个\n\n\n换行", "a\n\tb"]
    return list(dict.fromkeys(texts))


CORPUS = corpus()


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 400


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tokenizer_pairs(tmp_path_factory):
    """(upstream wrapper, ours) for a ``legacy: true`` and a ``legacy: false`` config."""
    pairs = {}
    for legacy in (True, False):
        directory = write_test_tokenizer(tmp_path_factory.mktemp("tokenizer"), legacy=legacy)
        # upstream's path: VoxCPM2Model.from_local -> LlamaTokenizerFast.from_pretrained, then
        # VoxCPM2Model.__init__ -> mask_multichar_chinese_tokens
        upstream = mask_multichar_chinese_tokens(LlamaTokenizerFast.from_pretrained(str(directory)))
        pairs[legacy] = (upstream, VoxCPMTokenizer.from_model_dir(directory))
    return pairs


@pytest.fixture(params=[True, False], ids=["legacy", "non-legacy"])
def tokenizer_pair(request, tokenizer_pairs):
    return tokenizer_pairs[request.param]


@pytest.fixture(scope="module")
def normalizers():
    return UpstreamNormalizer(), TextNormalizer()


@pytest.fixture(scope="module")
def upstream_normalized(normalizers):
    """Upstream's normalizer output for every corpus text (computed once: ~60 ms a text)."""
    return [_outcome(normalizers[0].normalize, t) for t in CORPUS]


def _outcome(function, text):
    try:
        return function(text)
    except Exception as error:  # both sides must fail the same way
        return f"raised {type(error).__name__}"


# ---------------------------------------------------------------------------- (a) token ids


def test_token_ids(tokenizer_pair):
    upstream, ours = tokenizer_pair
    mismatches = [t for t in CORPUS if upstream(t) != ours.encode(t)]
    assert mismatches == []


def test_token_strings_and_backend(tokenizer_pair):
    upstream, ours = tokenizer_pair
    assert [upstream.tokenize(t) for t in CORPUS] == [ours.tokenize(t) for t in CORPUS]
    assert upstream.tokenizer.get_vocab() == ours.backend.get_vocab(with_added_tokens=True)
    upstream_added = {i: (t.content, t.special, t.normalized, t.lstrip, t.rstrip, t.single_word)
                      for i, t in upstream.tokenizer.added_tokens_decoder.items()}
    ours_added = {i: (t.content, t.special, t.normalized, t.lstrip, t.rstrip, t.single_word)
                  for i, t in ours.backend.get_added_tokens_decoder().items()}
    assert upstream_added == ours_added
    assert upstream.tokenizer.unk_token_id == ours.unk_id
    assert upstream.tokenizer.bos_token_id == ours.bos_id


def test_whitespace_start_and_special_token_cases(tokenizer_pair):
    upstream, ours = tokenizer_pair
    for text in (" hello", "  你好", "\n你好", "<s>hello", "<|audio_start|>你好", "你好<s>世界"):
        assert ours.encode(text) == upstream(text), text


# ---------------------------------------------------------------------------- (b) normalizer


def test_normalizer(normalizers, upstream_normalized):
    _, ours = normalizers
    expected = upstream_normalized
    actual = [_outcome(ours.normalize, t) for t in CORPUS]
    mismatches = [(t, e, a) for t, e, a in zip(CORPUS, expected, actual, strict=True) if e != a]
    assert mismatches == []


def test_normalized_token_ids(tokenizer_pair, upstream_normalized):
    upstream_tok, ours_tok = tokenizer_pair
    normalized = upstream_normalized
    assert [upstream_tok(t) for t in normalized] == [ours_tok.encode(t) for t in normalized]


# ---------------------------------------------------------------------------- (c) preparation

_INSTRUCTIONS = (None, "温柔的女声", " calm, slow (deep) voice ", "（低沉）男声", "()")


class _Captured(Exception):
    pass


class _TextRecorder:
    """Stands in for VoxCPM2Model.text_tokenizer: records the first text, then stops."""

    def __init__(self, wrapped):
        self.wrapped = wrapped
        self.texts: list[str] = []

    def __call__(self, text):
        self.texts.append(text)
        raise _Captured


class _ModelStub(VoxCPM2Model):
    """Upstream's real _generate_with_prompt_cache, without weights: stops at tokenization."""

    def __init__(self, recorder):
        torch.nn.Module.__init__(self)
        self.text_tokenizer = recorder
        self.audio_start_token = 101

    def build_prompt_cache(self, prompt_text=None, prompt_wav_path=None, reference_wav_path=None):
        return {"prompt_text": prompt_text, "audio_feat": None, "mode": "continuation"}


def _upstream_model_text(pipeline, text, instruction, prompt_text, normalize):
    """The web demo's text handling (app.py 2.0.3, generate_tts_audio; not importable: gradio),
    then upstream's own VoxCPM.generate and VoxCPM2Model._generate_with_prompt_cache."""
    text = text.strip()
    control = re.sub(r"[()（）]", "", (instruction or "").strip()).strip()
    final_text = f"({control}){text}" if control else text
    prompt_text = (prompt_text or "").strip() or None
    recorder = pipeline.tts_model.text_tokenizer
    recorder.texts.clear()
    kwargs = {}
    if prompt_text:
        kwargs = {"prompt_wav_path": pipeline.prompt_wav, "prompt_text": prompt_text}
    try:
        pipeline.generate(text=final_text, normalize=normalize, retry_badcase=False, **kwargs)
    except _Captured:
        pass
    assert len(recorder.texts) == 1
    return recorder.texts[0]


@pytest.fixture(scope="module")
def upstream_pipeline(tmp_path_factory, normalizers):
    pipeline = object.__new__(voxcpm_core.VoxCPM)
    pipeline.tts_model = _ModelStub(_TextRecorder(None))
    pipeline.text_normalizer = normalizers[0]
    pipeline.denoiser = None
    prompt_wav = tmp_path_factory.mktemp("prompt") / "prompt.wav"
    prompt_wav.write_bytes(b"")  # only its existence is checked before the stubbed encoder
    pipeline.prompt_wav = str(prompt_wav)
    return pipeline


# The normalizer itself is covered text by text above; with normalization on, every 4th text
# is enough to check the order of the steps (it costs ~60 ms a text on each side).
@pytest.mark.parametrize(("normalize", "stride"), [(False, 1), (True, 4)],
                         ids=["raw", "normalized"])
def test_preparation(upstream_pipeline, normalizers, tokenizer_pairs, normalize, stride):
    _, ours_normalizer = normalizers
    prompts = (None, "这是参考音频的文本。", " reference text \n")
    cases = [(text, _INSTRUCTIONS[i % len(_INSTRUCTIONS)], prompts[i % len(prompts)])
             for i, text in enumerate(CORPUS) if text.strip() and i % stride == 0]
    mismatches = []
    for text, instruction, prompt in cases:
        expected = _upstream_model_text(upstream_pipeline, text, instruction, prompt, normalize)
        target = prepare_target_text(text, instruction=instruction, normalize=normalize,
                                     normalizer=ours_normalizer)
        actual = model_text(target, prepare_prompt_text(prompt) if prompt else None)
        if expected != actual or any(upstream_tok(expected) != ours_tok.encode(actual)
                                     for upstream_tok, ours_tok in tokenizer_pairs.values()):
            mismatches.append((text, instruction, prompt, expected, actual))
    assert mismatches == []


def test_cli_instruction_prefix_agrees_on_plain_instructions():
    for text, instruction in itertools.product(("你好", "hello world"),
                                               ("温柔的女声", " calm voice ", "", None)):
        assert with_instruction(text, instruction) == build_final_text(text, instruction)


# ---------------------------------------------------------------------------- config variants

_EXTRA = ["<|im_start|>", "<|im_end|>"]
_NEW_TOKEN = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
              "special": True}
_CONFIG_VARIANTS = {
    # no added_tokens_decoder: transformers reads special_tokens_map.json and tokenizer.json's
    # added_tokens instead
    "no-added-tokens-decoder": lambda c, s: c.pop("added_tokens_decoder"),
    "legacy-branch-extras": lambda c, s: (c.pop("added_tokens_decoder"),
                                          s.update(additional_special_tokens=_EXTRA)),
    "no-prefix-space": lambda c, s: c.update(add_prefix_space=False),
    "legacy-no-prefix-space": lambda c, s: c.update(add_prefix_space=False, legacy=True),
    "new-named-tokens": lambda c, s: c.update(pad_token="<pad>", mask_token="<mask>",
                                              sep_token="[SEP]"),
    "additional-special-tokens": lambda c, s: c.update(additional_special_tokens=_EXTRA),
    "extra-special-tokens": lambda c, s: c.update(extra_special_tokens=_EXTRA[::-1]),
    "stripping-special-token": lambda c, s: c["added_tokens_decoder"]["101"].update(
        lstrip=True, rstrip=True),
    "added-tokens-beyond-vocab": lambda c, s: c["added_tokens_decoder"].update({
        "2000": {"content": "<|im_start|>", **_NEW_TOKEN},
        "1999": {"content": "<|im_end|>", **_NEW_TOKEN, "normalized": True, "special": False}}),
    "model-specific-token": lambda c, s: c.update(image_token="<|im_start|>"),
    "serialized-added-token": lambda c, s: c.update(unk_token={
        "__type": "AddedToken", "content": "<unk>", "lstrip": False, "normalized": True,
        "rstrip": False, "single_word": False, "special": True}),
}
_VARIANT_TEXTS = (*CORPUS[::7], "<pad>x<mask>", "[SEP]a", "<|im_start|>hi", "a<|im_end|> b",
                  "x <|audio_start|> y")


@pytest.mark.parametrize("variant", sorted(_CONFIG_VARIANTS))
def test_tokenizer_config_variants(tmp_path, variant):
    directory = write_test_tokenizer(tmp_path, legacy=False)
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    special_map = json.loads((directory / "special_tokens_map.json").read_text(encoding="utf-8"))
    _CONFIG_VARIANTS[variant](config, special_map)
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (directory / "special_tokens_map.json").write_text(json.dumps(special_map), encoding="utf-8")
    upstream = mask_multichar_chinese_tokens(LlamaTokenizerFast.from_pretrained(str(directory)))
    ours = VoxCPMTokenizer.from_model_dir(directory)
    assert {i: repr(t) for i, t in upstream.tokenizer.added_tokens_decoder.items()} == {
        i: repr(t) for i, t in ours.backend.get_added_tokens_decoder().items()}
    assert upstream.tokenizer.unk_token_id == ours.unk_id
    assert [upstream(t) for t in _VARIANT_TEXTS] == [ours.encode(t) for t in _VARIANT_TEXTS]


def test_special_tokens_map_may_be_absent(tmp_path):
    directory = write_test_tokenizer(tmp_path, legacy=True)
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("added_tokens_decoder")
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (directory / "special_tokens_map.json").unlink()
    upstream = mask_multichar_chinese_tokens(LlamaTokenizerFast.from_pretrained(str(directory)))
    ours = VoxCPMTokenizer.from_model_dir(directory)
    assert [upstream(t) for t in _VARIANT_TEXTS] == [ours.encode(t) for t in _VARIANT_TEXTS]
