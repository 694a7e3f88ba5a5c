"""Downloaded F5-TTS checkpoints that would cost gigabytes or end in a traceback when the model
is built: their sizes are read from the weights, so a file of empty tensors can claim any width.
Each is refused by name, with the model never built (issue 33, 2)."""

from __future__ import annotations

import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from mizuoto.errors import CheckpointMismatch
from mizuoto_f5tts import checkpoint as checkpoint_module
from mizuoto_f5tts.checkpoint import (
    checkpoint_variant,
    find_checkpoint,
    load_f5_model,
    read_checkpoint,
)
from mizuoto_f5tts.fixtures import write_random_model_dir
from mizuoto_f5tts.text import read_vocab

P = "ema_model.transformer."


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_random_model_dir(tmp_path_factory.mktemp("f5") / "v1", "v1_base", size="tiny")


@pytest.fixture
def never_built(monkeypatch):
    """Loading fails if the real model is ever built or filled."""
    def built(*args, **kwargs):
        raise AssertionError("the model was built before the checkpoint was refused")

    monkeypatch.setattr(checkpoint_module, "load_into", built)


def hostile_copy(model_dir, tmp_path, change) -> object:
    """``model_dir`` copied to ``tmp_path`` with ``change(state)`` applied to its weights."""
    target = tmp_path / "hostile"
    shutil.copytree(model_dir, target)
    ckpt = find_checkpoint(target)
    state = load_file(str(ckpt))
    change(state)
    save_file(state, str(ckpt))
    return target


def _set(key, tensor):
    def change(state):
        state[P + key] = tensor
    return change


def _deep(blocks):
    def change(state):
        for index in range(2, blocks):
            state[f"{P}transformer_blocks.{index}.attn_norm.linear.bias"] = torch.empty(0)
    return change


HOSTILE = {
    "width 10^6 from an empty tensor": (_set("time_embed.time_mlp.2.weight",
                                             torch.empty(10**6, 0)), "transformer width"),
    "no heads (empty inv_freq)": (_set("rotary_embed.inv_freq", torch.empty(0)), "head width"),
    "head width 10^5": (_set("rotary_embed.inv_freq", torch.empty(50_000)), "head width"),
    "text width 0": (_set("text_embed.text_embed.weight", torch.empty(8, 0)), "text width"),
    "80 mels": (_set("proj_out.weight", torch.empty(80, 64)), "100 channels"),
    "feed-forward 10^7": (_set("transformer_blocks.0.ff.ff.0.0.weight", torch.empty(10**7, 0)),
                          "feed-forward width"),
    "attention not a multiple of heads": (_set("transformer_blocks.0.attn.to_q.weight",
                                               torch.empty(65, 64)), "not a multiple"),
    "1000 blocks of nothing": (_deep(1000), "depth"),
    "a tensor of the wrong shape": (_set("transformer_blocks.1.attn.to_k.weight",
                                         torch.zeros(64, 32)),
                                   re.escape("to_k.weight: checkpoint (64, 32), model (64, 64)")),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_checkpoint_is_refused_by_name_before_the_model_is_built(
        case, model_dir, tmp_path, never_built):
    change, named = HOSTILE[case]
    with pytest.raises(CheckpointMismatch, match=named):
        load_f5_model(hostile_copy(model_dir, tmp_path, change), "v1_base")


def test_a_model_larger_than_memory_is_refused_by_name(model_dir, monkeypatch, never_built):
    monkeypatch.setattr(checkpoint_module, "available_memory", lambda *_: 10_000)
    with pytest.raises(CheckpointMismatch, match=r"needs about .* GiB but .* is available"):
        load_f5_model(model_dir, "v1_base")


def test_the_check_leaves_a_good_checkpoint_and_the_random_state_alone(model_dir):
    """Upstream's model is built with the global generator: the check must not draw from it."""
    ckpt = find_checkpoint(model_dir)
    state = read_checkpoint(ckpt)
    variant = checkpoint_variant(ckpt, state, "v1_base")
    vocab = read_vocab(model_dir / "vocab.txt")
    torch.manual_seed(7)
    before = torch.random.get_rng_state()
    checkpoint_module._check_before_building(variant, vocab, state, ckpt, torch.float32)
    assert torch.equal(torch.random.get_rng_state(), before)
