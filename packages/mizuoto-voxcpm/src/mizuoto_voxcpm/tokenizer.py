"""VoxCPM's text tokenizer, rebuilt with the `tokenizers` library alone.

Upstream (voxcpm 2.0.3) loads ``LlamaTokenizerFast.from_pretrained(model_dir)`` from
transformers 5.3 and wraps it in ``mask_multichar_chinese_tokens``. transformers 5 does not use
``tokenizer.json`` as written: it keeps only the BPE vocab and merges and rebuilds the rest
(no normalizer; Metaspace pre-tokenizer without splitting, prepending "▁" to every span when the
config says ``legacy: true`` and only at the start of the text otherwise; BPE with byte
fallback and no unk token), then re-adds the added and special tokens from the config in id
order. The wrapper then splits every multi-character all-CJK token into single characters,
looked up one by one (a character missing from the vocab becomes ``<unk>``).

:class:`VoxCPMTokenizer` reproduces that chain and gives the same ids.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE

from mizuoto.errors import CheckpointMismatch
from mizuoto.json_files import JSONFileError, read_json

__all__ = [
    "AUDIO_END_TOKEN_ID",
    "AUDIO_START_TOKEN_ID",
    "REF_AUDIO_END_TOKEN_ID",
    "REF_AUDIO_START_TOKEN_ID",
    "VoxCPMTokenizer",
    "is_cjk_word",
]

logger = logging.getLogger(__name__)

# Upstream hard-codes these ids (VoxCPMModel / VoxCPM2Model.__init__), whatever the vocab holds.
AUDIO_START_TOKEN_ID = 101
AUDIO_END_TOKEN_ID = 102
REF_AUDIO_START_TOKEN_ID = 103
REF_AUDIO_END_TOKEN_ID = 104

_METASPACE = "\u2581"
# transformers' PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES, in its order.
_NAMED_SPECIAL_TOKENS = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)
# LlamaTokenizer's constructor defaults.
_LLAMA_DEFAULTS = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}


def is_cjk_word(token: str) -> bool:
    """Two or more characters, all in U+4E00..U+9FFF (upstream's test for splitting a token)."""
    return len(token) >= 2 and all("\u4e00" <= char <= "\u9fff" for char in token)


def _added_token(value: Any, *, special: bool | None = None) -> AddedToken | str | None:
    """A config entry (string, dict or None) as transformers reads it."""
    if value is None or isinstance(value, (str, AddedToken)):
        return value
    if isinstance(value, dict):
        fields = {k: v for k, v in value.items() if k != "__type"}
        if special is not None:
            fields["special"] = special
        return AddedToken(**fields)
    raise ValueError(f"tokenizer config: expected a token string or dict, got {value!r}")


def _read_json(path: Path) -> dict:
    """A tokenizer file, read as a file from the internet (bounded nesting and integers);
    a :class:`~mizuoto.errors.CheckpointMismatch` naming it otherwise. Duplicate keys keep
    the last, as the tokenizers library reads them."""
    try:
        return read_json(path, path.name, allow_duplicate_keys=True)
    except (OSError, JSONFileError) as exc:
        raise CheckpointMismatch(str(path), detail=f"cannot be read: {exc}") from None


def _check_vocab(tokenizer_json: dict, vocab_size: int, path: Path) -> None:
    """Refuse a vocabulary the model's embedding cannot hold (more entries than its
    ``vocab_size``, or an id past it) before the slow part: building the tokenizer of a
    2,000,000-entry file takes a minute and a gigabyte."""
    model = tokenizer_json.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if vocab is None:
        return  # _vocab_and_merges names it
    if not isinstance(vocab, (dict, list)):
        raise CheckpointMismatch(str(path), detail="model.vocab must be an object or a list")
    if len(vocab) > vocab_size:
        raise CheckpointMismatch(str(path), detail=f"its vocabulary has {len(vocab):,} "
                                 f"entries, more than the model's vocab_size {vocab_size:,}: "
                                 "not this model's tokenizer")
    if isinstance(vocab, dict):
        bad = next((v for v in vocab.values()
                    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab_size),
                   None)
        if bad is not None:
            raise CheckpointMismatch(str(path), detail=f"model.vocab holds the id {bad!r}, "
                                     f"outside the model's 0..{vocab_size - 1}")


def _vocab_and_merges(tokenizer_json: dict) -> tuple[dict[str, int], list[tuple[str, ...]]]:
    model = tokenizer_json.get("model") or {}
    vocab = model.get("vocab")
    if vocab is None:
        raise ValueError("tokenizer.json has no model.vocab: VoxCPM needs a BPE tokenizer.json")
    if isinstance(vocab, list):
        vocab = {item[0] if isinstance(item, list) else item: i for i, item in enumerate(vocab)}
    merges = [
        tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge)
        for merge in model.get("merges") or []
    ]
    return vocab, merges


def _prepend_scheme(add_prefix_space: bool, legacy: bool) -> str:
    # transformers' _get_prepend_scheme
    if not add_prefix_space:
        return "never"
    return "always" if legacy else "first"


class VoxCPMTokenizer:
    """Text to token ids exactly as upstream VoxCPM's ``text_tokenizer(text)``.

    ``encode`` adds no BOS/EOS: upstream tokenizes with ``add_special_tokens=False`` and appends
    :data:`AUDIO_START_TOKEN_ID` itself.
    """

    def __init__(self, backend: Tokenizer, *, unk_token: str | None, bos_token: str | None,
                 eos_token: str | None) -> None:
        self.backend = backend
        vocab = backend.get_vocab(with_added_tokens=True)
        self._cjk_words = frozenset(token for token in vocab if is_cjk_word(token))
        self.unk_token = unk_token
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.unk_id = self._lookup(unk_token)
        self.bos_id = self._lookup(bos_token)
        self.eos_id = self._lookup(eos_token)

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_model_dir(cls, path: str | Path, vocab_size: int | None = None) -> VoxCPMTokenizer:
        """Load ``tokenizer.json`` + ``tokenizer_config.json`` (+ ``special_tokens_map.json``);
        with ``vocab_size`` (the model's), a vocabulary it cannot hold is refused first."""
        path = Path(path)
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(
                f"{tokenizer_file} not found: a VoxCPM model directory needs tokenizer.json "
                "(tokenizer.model alone is not supported)"
            )
        config_file = path / "tokenizer_config.json"
        config = _read_json(config_file) if config_file.is_file() else {}
        special_map_file = path / "special_tokens_map.json"
        special_map = _read_json(special_map_file) if special_map_file.is_file() else None
        tokenizer_json = _read_json(tokenizer_file)
        if vocab_size is not None:
            _check_vocab(tokenizer_json, vocab_size, tokenizer_file)
        try:
            return cls.from_configs(tokenizer_json, config, special_map)
        except Exception as exc:
            # a hand-made file the tokenizers library refuses: named, not a traceback
            raise CheckpointMismatch(str(tokenizer_file),
                                     detail=f"is not a tokenizer VoxCPM reads: {exc}") from None

    @classmethod
    def from_configs(cls, tokenizer_json: dict, config: dict,
                     special_tokens_map: dict | None = None) -> VoxCPMTokenizer:
        """Build from the parsed files (what ``LlamaTokenizerFast.from_pretrained`` reads)."""
        config = dict(config)
        added_tokens = _read_special_tokens(config, tokenizer_json, special_tokens_map)
        named, extra = _named_and_extra_tokens(config, added_tokens)
        add_prefix_space = config.get("add_prefix_space")
        add_prefix_space = True if add_prefix_space is None else bool(add_prefix_space)
        backend = _llama_backend(tokenizer_json, legacy=bool(config.get("legacy", False)),
                                 add_prefix_space=add_prefix_space)
        backend.add_tokens(_tokens_to_add(added_tokens, named.values(), extra))
        if config.get("fix_mistral_regex") and backend.get_vocab_size() > 100_000:
            # transformers would swap the pre-tokenizer for a Split + ByteLevel one here
            raise NotImplementedError("tokenizer_config.json sets fix_mistral_regex on a vocab "
                                      "over 100000 tokens: not a VoxCPM tokenizer")
        logger.debug("VoxCPM tokenizer: %d tokens, legacy=%s, add_prefix_space=%s",
                     backend.get_vocab_size(), config.get("legacy", False), add_prefix_space)

        def name(key: str) -> str | None:
            value = named.get(key)
            return None if value is None else str(value)

        return cls(backend, unk_token=name("unk_token"), bos_token=name("bos_token"),
                   eos_token=name("eos_token"))

    # ------------------------------------------------------------------ encoding

    def _lookup(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    def tokenize(self, text: str) -> list[str]:
        """Token strings after upstream's CJK splitting."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, got {type(text).__name__}")
        tokens = self.backend.encode(text, add_special_tokens=False).tokens
        pieces: list[str] = []
        for token in tokens:
            # upstream quirk (mask_multichar_chinese_tokens): "▁" is stripped before the lookup,
            # so "▁你好" becomes "你", "好" and the space marker is lost.
            bare = token.replace(_METASPACE, "")
            if bare in self._cjk_words:
                pieces.extend(bare)
            else:
                pieces.append(token)
        return pieces

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        """Each token's id; a token not in the vocab gets the unk id (as transformers does)."""
        ids = []
        for token in tokens:
            index = self.backend.token_to_id(token)
            if index is None:
                if self.unk_id is None:
                    raise ValueError(f"token {token!r} is not in the vocab and there is no unk token")
                index = self.unk_id
            ids.append(index)
        return ids

    def unknown_tokens(self, text: str) -> list[str]:
        """The tokens of ``text`` not in the vocab (read as ``<unk>`` by
        :meth:`convert_tokens_to_ids`): with byte fallback, only CJK characters split out of a
        multi-character token can be."""
        return [token for token in self.tokenize(text) if self.backend.token_to_id(token) is None]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without BOS/EOS (upstream's ``text_tokenizer(text)``)."""
        return self.convert_tokens_to_ids(self.tokenize(text))

    def decode(self, ids: Sequence[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)


def _read_special_tokens(config: dict, tokenizer_json: dict,
                         special_tokens_map: dict | None) -> dict[int, AddedToken]:
    """The added tokens by id, as PreTrainedTokenizerBase.from_pretrained reads them; fills
    ``config`` (in place) with the named tokens of ``special_tokens_map`` where it applies."""
    config.pop("add_bos_token", None)  # dropped by transformers when tokenizer.json exists
    config.pop("add_eos_token", None)
    if "additional_special_tokens" in config:
        config.setdefault("extra_special_tokens", config.pop("additional_special_tokens"))
    if "added_tokens_decoder" in config:
        return {int(index): _added_token(entry)
                for index, entry in config["added_tokens_decoder"].items()}
    # transformers' legacy branch: special_tokens_map.json fills the named tokens and
    # tokenizer.json's own added_tokens stand in for added_tokens_decoder.
    for key, value in (special_tokens_map or {}).items():
        if isinstance(value, dict) and key != "extra_special_tokens":
            value = _added_token({k: v for k, v in value.items() if k != "special"}, special=True)
        elif key == "extra_special_tokens" and isinstance(value, list):
            existing = list(config.get("extra_special_tokens") or [])
            for item in value:
                item = _added_token(item, special=True) if isinstance(item, dict) else item
                if item not in existing:
                    existing.append(item)
            value = existing
        config[key] = value
    if "additional_special_tokens" in config and "extra_special_tokens" not in config:
        config["extra_special_tokens"] = config.pop("additional_special_tokens")
    return {entry["id"]: AddedToken(**{k: v for k, v in entry.items() if k != "id"})
            for entry in tokenizer_json.get("added_tokens") or []}


def _named_and_extra_tokens(
    config: dict, added_tokens: dict[int, AddedToken]
) -> tuple[dict[str, AddedToken | str | None], list[AddedToken | str]]:
    """Named special tokens (bos, eos, unk, ..., then model-specific ``*_token`` keys) and the
    extra special tokens; a name whose text is an added token takes that token's flags."""
    by_content = {str(token): token for token in added_tokens.values()}
    named: dict[str, AddedToken | str | None] = {}
    for key in _NAMED_SPECIAL_TOKENS:
        value = _added_token(config.get(key, _LLAMA_DEFAULTS.get(key)))
        if value is not None and by_content:
            value = by_content.get(str(value), value)
        named[key] = value
    for key, value in config.items():
        if key.endswith("_token") and key not in named and isinstance(value, str):
            named[key] = value
    extra = config.get("extra_special_tokens") or []
    if isinstance(extra, dict):
        for key, value in extra.items():
            named.setdefault(key, value)
        extra = []
    return named, [_added_token(item) for item in extra]


def _llama_backend(tokenizer_json: dict, *, legacy: bool, add_prefix_space: bool) -> Tokenizer:
    """LlamaTokenizer.__init__'s backend: the file's vocab and merges, the rest rebuilt."""
    vocab, merges = _vocab_and_merges(tokenizer_json)
    backend = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True,
                            dropout=None))
    backend.normalizer = None
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=_METASPACE, prepend_scheme=_prepend_scheme(add_prefix_space, legacy),
        split=False,
    )
    steps = [decoders.Replace(_METASPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix_space:
        steps.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(steps)
    if tokenizer_json.get("post_processor"):
        # kept from the file by transformers; it only matters with add_special_tokens=True
        holder = {"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []},
                  "post_processor": tokenizer_json["post_processor"]}
        backend.post_processor = Tokenizer.from_str(json.dumps(holder)).post_processor
    return backend


def _tokens_to_add(added_tokens: dict[int, AddedToken],
                   named: Iterable[AddedToken | str | None],
                   extra: list[AddedToken | str]) -> list[AddedToken]:
    """The added tokens in the order (and with the flags) TokenizersBackend.__init__ adds them:
    the config's added tokens by id, then named special tokens, then extra special tokens,
    each skipped when already present. A token not in the vocab gets the next free id."""
    ordered: list[AddedToken | str] = [token for _, token in sorted(added_tokens.items())]
    present = {str(token) for token in ordered}
    named = [token for token in named if token is not None]
    for token in [*named, *extra]:
        if str(token) not in present and token not in ordered:
            ordered.append(token)
            present.add(str(token))
    named_contents = {str(token) for token in named}
    result = []
    for token in ordered:
        if isinstance(token, str):
            token = AddedToken(token, special=True)
        elif not token.special and str(token) in named_contents:
            token.special = True
        result.append(token)
    return result
