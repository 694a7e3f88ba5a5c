"""Property test (nox -s fuzz): a hostile VoxCPM config.json or lora_config.json either parses or
is refused by name (ConfigError / InvalidRequest); nothing else escapes."""

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from mizuoto.errors import InvalidRequest
from mizuoto_voxcpm.config import ConfigError, VoxCPMConfig
from mizuoto_voxcpm.fixtures import tiny_config
from mizuoto_voxcpm.lora import LoRAConfig

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
