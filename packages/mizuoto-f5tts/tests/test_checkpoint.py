"""Loading F5-TTS checkpoints: layout, variant detection and the errors users see."""

from __future__ import annotations

import shutil

import attrs
import pytest
import torch
from safetensors.torch import load_file, save_file

from mizuoto.errors import CheckpointMismatch, ModelFilesMissing
from mizuoto_f5tts.checkpoint import (
    default_vocab_path,
    detect_variant,
    find_checkpoint,
    load_f5_model,
    load_vocos,
    read_checkpoint,
    read_vocab,
)
from mizuoto_f5tts.fixtures import write_random_model_dir
from mizuoto_f5tts.identification import AmbiguousVariant
from mizuoto_f5tts.variants import VARIANT_NAMES, checkpoint_name, get_variant

SMALL_VOCAB = [" ", "a", "b", "c", "ni3", "hao3", "你"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("f5_ckpt")
    return {
        name: write_random_model_dir(root / name, name, vocab=SMALL_VOCAB) for name in VARIANT_NAMES
    }


def test_fixture_layout(model_dirs):
    model_dir = model_dirs["v1_base"]
    ckpt = model_dir / checkpoint_name("v1_base")
    assert ckpt.name == "model_1250000.safetensors"
    raw = load_file(str(ckpt))
    assert raw["initted"].item() is True and raw["step"].item() == 0
    assert "ema_model.transformer.rotary_embed.inv_freq" in raw
    assert all(k in ("initted", "step") or k.startswith("ema_model.transformer.") for k in raw)
    # every parameter was drawn, including the ones DiT zero-initialises
    assert raw["ema_model.transformer.proj_out.weight"].abs().sum() > 0
    assert raw["ema_model.transformer.transformer_blocks.0.attn_norm.linear.bias"].abs().sum() > 0
    assert (model_dir / "vocos" / "config.yaml").is_file()
    assert (model_dir / "vocos" / "pytorch_model.bin").is_file()
    assert read_vocab(model_dir / "vocab.txt") == {t: i for i, t in enumerate(SMALL_VOCAB)}


def test_fixture_is_deterministic_and_seeded(tmp_path):
    a = write_random_model_dir(tmp_path / "a", "e2_base", seed=1, vocab=SMALL_VOCAB)
    b = write_random_model_dir(tmp_path / "b", "e2_base", seed=1, vocab=SMALL_VOCAB)
    c = write_random_model_dir(tmp_path / "c", "e2_base", seed=2, vocab=SMALL_VOCAB)
    sa, sb, sc = (load_file(str(find_checkpoint(d))) for d in (a, b, c))
    key = "ema_model.transformer.layers.3.0.weight"
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa[key], sc[key])


@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_load_detects_tiny_variant(model_dirs, name):
    model, vocab = load_f5_model(model_dirs[name])
    assert len(vocab) == len(SMALL_VOCAB)
    assert model.dtype == torch.float32 and not model.training
    state = read_checkpoint(find_checkpoint(model_dirs[name]))
    assert detect_variant(state, name) == get_variant(name, "tiny")
    out, _ = model.sample(torch.zeros(1, 4, 100), torch.tensor([[1, 2, 3]]), 12, steps=2)
    assert out.shape == (1, 12, 100) and torch.isfinite(out).all()


def test_detect_dit_family_as_named(model_dirs):
    state = read_checkpoint(find_checkpoint(model_dirs["v1_base"]))
    assert detect_variant(state, "v1_base") == get_variant("v1_base", "tiny")
    assert detect_variant(state, "base") == get_variant("base", "tiny")
    with pytest.raises(CheckpointMismatch, match="DIT backbone"):
        detect_variant(state, "e2_base")


def test_detect_real_sizes_from_shapes():
    for name in VARIANT_NAMES:
        variant = get_variant(name, "real")
        with torch.device("meta"):
            backbone = variant.build_backbone(text_num_embeds=2545)
        state = {f"transformer.{k}": v for k, v in backbone.state_dict().items()}
        assert detect_variant(state, name) == variant


def test_detect_unknown_size_is_custom(tmp_path):
    variant = attrs.evolve(get_variant("v1_base", "tiny"), depth=3, heads=2, dim_head=32)
    model_dir = write_random_model_dir(tmp_path, variant, vocab=SMALL_VOCAB)
    model, _ = load_f5_model(model_dir)
    assert len(model.transformer.transformer_blocks) == 3
    detected = detect_variant(read_checkpoint(find_checkpoint(model_dir)), "v1_base")
    assert detected.size == "custom" and (detected.depth, detected.heads) == (3, 2)


@pytest.mark.parametrize(("name", "dim", "ff_mult"), [("v1_base", 112, 4.3), ("e2_base", 208, 2.3)])
def test_detect_fractional_ff_mult_rebuilds_the_inner_width(tmp_path, name, dim, ff_mult):
    """int(dim * ff_mult) is 481 / 478, and inner / dim multiplied back gives one less."""
    variant = attrs.evolve(get_variant(name, "tiny"), dim=dim, ff_mult=ff_mult)
    model_dir = write_random_model_dir(tmp_path, variant, vocab=SMALL_VOCAB)
    model, _ = load_f5_model(model_dir)  # a narrower feed-forward would not load
    detected = detect_variant(read_checkpoint(find_checkpoint(model_dir)), name)
    assert int(dim * detected.ff_mult) == int(dim * ff_mult)


def test_use_ema_false_reads_model_state_dict(tmp_path):
    model_dir = write_random_model_dir(tmp_path, "base", vocab=SMALL_VOCAB, checkpoint_format="pt")
    ema, _ = load_f5_model(model_dir, get_variant("base", "tiny"))
    plain, _ = load_f5_model(model_dir, get_variant("base", "tiny"), use_ema=False)
    for key, value in ema.state_dict().items():
        assert torch.equal(value, plain.state_dict()[key])


def test_half_precision_casts_stored_buffers(model_dirs):
    model, _ = load_f5_model(model_dirs["e2_base"], dtype=torch.bfloat16)
    assert model.transformer.rotary_embed.inv_freq.dtype == torch.bfloat16
    assert model.dtype == torch.bfloat16


def test_missing_checkpoint(tmp_path):
    with pytest.raises(ModelFilesMissing, match="safetensors or \\*.pt"):
        load_f5_model(tmp_path)


def test_several_checkpoints_need_a_choice(tmp_path, model_dirs):
    src = find_checkpoint(model_dirs["v1_base"])
    for name in ("model_1.safetensors", "model_2.safetensors"):
        (tmp_path / name).write_bytes(src.read_bytes())
    (tmp_path / "vocab.txt").write_bytes((model_dirs["v1_base"] / "vocab.txt").read_bytes())
    with pytest.raises(ModelFilesMissing, match="checkpoint="):
        find_checkpoint(tmp_path)
    with pytest.raises(AmbiguousVariant):  # model_2 names neither v1 nor v0
        load_f5_model(tmp_path, checkpoint=tmp_path / "model_2.safetensors")
    model, _ = load_f5_model(tmp_path, "v1_base", checkpoint=tmp_path / "model_2.safetensors")
    assert model.transformer.depth == 2


def test_default_vocab_when_dir_has_none(tmp_path):
    write_random_model_dir(tmp_path, "v1_base")  # upstream's vocab
    (tmp_path / "vocab.txt").unlink()
    _, vocab = load_f5_model(tmp_path)
    assert vocab == read_vocab(default_vocab_path())
    assert len(vocab) == 2545 and vocab[" "] == 0


def test_vocab_mismatch_is_explained(tmp_path, model_dirs):
    ckpt = find_checkpoint(model_dirs["v1_base"])
    (tmp_path / ckpt.name).write_bytes(ckpt.read_bytes())
    (tmp_path / "vocab.txt").write_text("".join(f"{t}\n" for t in SMALL_VOCAB[:5]), "utf-8")
    with pytest.raises(CheckpointMismatch, match="8 rows but .* 5 tokens"):
        load_f5_model(tmp_path)


def test_shape_mismatch_names_keys(tmp_path, model_dirs):
    ckpt = find_checkpoint(model_dirs["v1_base"])
    raw = load_file(str(ckpt))
    raw["ema_model.transformer.proj_out.weight"] = torch.zeros(100, 32)
    del raw["ema_model.transformer.norm_out.linear.bias"]
    raw["ema_model.transformer.extra.weight"] = torch.zeros(1)
    save_file(raw, str(tmp_path / ckpt.name))
    (tmp_path / "vocab.txt").write_bytes((model_dirs["v1_base"] / "vocab.txt").read_bytes())
    with pytest.raises(CheckpointMismatch) as info:
        load_f5_model(tmp_path, get_variant("v1_base", "tiny"))
    err = info.value
    assert err.missing == ["transformer.norm_out.linear.bias"]
    assert err.unexpected == ["transformer.extra.weight"]
    assert err.shapes == ["transformer.proj_out.weight: checkpoint (100, 32), model (100, 64)"]


def test_wrong_variant_is_a_mismatch(model_dirs):
    with pytest.raises(CheckpointMismatch, match="missing keys: transformer.layers"):
        load_f5_model(model_dirs["v1_base"], get_variant("e2_base", "tiny"))
    with pytest.raises(CheckpointMismatch, match="DIT backbone but variant 'e2_base'"):
        load_f5_model(model_dirs["v1_base"], "e2_base")


def test_variant_name_sets_family_and_weights_set_sizes(tmp_path, model_dirs):
    # a tiny v1 checkpoint (without the record that says so) loaded as "base": v0 flags, tiny
    # sizes
    bare = tmp_path / "bare"
    shutil.copytree(model_dirs["v1_base"], bare)
    (bare / "variant.json").unlink()
    model, _ = load_f5_model(bare, "base")
    assert not model.transformer.text_embed.mask_padding
    assert model.transformer.transformer_blocks[0].attn.pe_attn_head == 1
    assert model.transformer.dim == 64


def test_not_an_f5_checkpoint(tmp_path):
    save_file({"ema_model.foo": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointMismatch, match="not an F5-TTS model"):
        load_f5_model(tmp_path)


def test_unknown_variant_name(model_dirs):
    with pytest.raises(ValueError, match="v1_base"):
        load_f5_model(model_dirs["v1_base"], "v2")


def test_vocos_errors(tmp_path, model_dirs):
    with pytest.raises(ModelFilesMissing, match="config.yaml"):
        load_vocos(tmp_path)
    vocos = load_vocos(model_dirs["v1_base"] / "vocos")
    audio = vocos.decode(torch.zeros(1, 100, 10))
    assert audio.shape == (1, 2560) and torch.isfinite(audio).all()
    config = (model_dirs["v1_base"] / "vocos" / "config.yaml").read_text("utf-8")
    (tmp_path / "config.yaml").write_text(config.replace("num_layers: 2", "num_layers: 3"))
    (tmp_path / "pytorch_model.bin").write_bytes(
        (model_dirs["v1_base"] / "vocos" / "pytorch_model.bin").read_bytes()
    )
    with pytest.raises(CheckpointMismatch, match="missing keys: backbone.convnext.2"):
        load_vocos(tmp_path)
