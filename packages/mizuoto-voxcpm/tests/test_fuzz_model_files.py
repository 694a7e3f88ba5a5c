"""Property test (nox -s fuzz): a hostile VoxCPM config.json, lora_config.json or voice file either
parses or is refused by name (ConfigError / InvalidRequest); nothing else escapes."""

import copy

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mizuoto import Voice
from mizuoto.errors import InvalidRequest
from mizuoto_voxcpm.config import ConfigError, VoxCPMConfig
from mizuoto_voxcpm.fixtures import tiny_config
from mizuoto_voxcpm.lora import LoRAConfig
from mizuoto_voxcpm.voice import PROMPT_LATENTS, PROMPT_TEXT, REFERENCE_LATENTS, check_voice_latents

_BASE = tiny_config("voxcpm2", vocab_size=500)
_FIELDS = ["hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
           "num_key_value_heads", "vocab_size", "max_position_embeddings"]
_hostile = st.one_of(st.integers(min_value=-(10**12), max_value=10**12), st.floats(),
                     st.text(max_size=3), st.none(), st.lists(st.integers(), max_size=2))


@settings(max_examples=200, deadline=None)
@given(changes=st.dictionaries(st.sampled_from(_FIELDS), _hostile, max_size=3),
       top=st.dictionaries(st.sampled_from(["max_length", "patch_size", "feat_dim"]), _hostile,
                           max_size=2))
def test_hostile_model_config_is_parsed_or_named(changes, top):
    raw = copy.deepcopy(_BASE)
    raw["lm_config"].update(changes)
    raw.update(top)
    try:
        VoxCPMConfig.from_dict(raw)
    except ConfigError as exc:
        assert exc.field


@settings(max_examples=200, deadline=None)
@given(values=st.dictionaries(st.sampled_from(["r", "alpha", "dropout"]), _hostile, max_size=3))
def test_hostile_lora_config_is_parsed_or_named(values):
    try:
        LoRAConfig.from_dict(values)
    except InvalidRequest as exc:
        assert exc.field.startswith("lora_config")


_dims = st.lists(st.integers(min_value=0, max_value=9), min_size=0, max_size=4)


@settings(max_examples=100, deadline=None)
@given(prompt=st.none() | _dims, reference=st.none() | _dims, text=st.sampled_from(["", " ", "hi"]),
       v2=st.booleans(), dtype=st.sampled_from([torch.float32, torch.int16, torch.bool]))
def test_hostile_voice_latents_are_accepted_only_in_the_models_layout(prompt, reference, text,
                                                                      v2, dtype):
    """A voice file with latents of any shape, dtype and text: refused by name as the voice,
    or in exactly the layout (patches >= 1, patch_size 2, feat_dim 4) and context (8)."""
    tensors = {name: torch.zeros(shape, dtype=dtype)
               for name, shape in ((PROMPT_LATENTS, prompt), (REFERENCE_LATENTS, reference))
               if shape is not None}
    voice = Voice("voxcpm", "f" * 64, 16000, tensors, {PROMPT_TEXT: text} if text else {})
    try:
        check_voice_latents(voice, patch_size=2, feat_dim=4, max_length=8, is_v2=v2)
    except InvalidRequest as exc:
        assert exc.field == "voice" and exc.fix
    else:
        assert all(t.ndim == 3 and t.shape[1:] == (2, 4) and t.shape[0] >= 1
                   and t.is_floating_point() for t in tensors.values())
        assert sum(t.shape[0] for t in tensors.values()) < 8
