"""The F5-TTS family of a checkpoint is never guessed from the folders around it: v0 and v1
models in misleadingly named folders load (engine and trainer) as what they are, or are
refused naming the choices."""

from __future__ import annotations

import json
import shutil

import pytest

import mizuoto
from mizuoto import TrainingConfig
from mizuoto.errors import CheckpointMismatch, InvalidRequest
from mizuoto.training.synthetic_data import write_synthetic_dataset
from mizuoto_f5tts.checkpoint import find_checkpoint, load_f5_model
from mizuoto_f5tts.engine import F5Engine
from mizuoto_f5tts.fixtures import write_random_model_dir
from mizuoto_f5tts.identification import (
    RECORD,
    AmbiguousVariant,
    family_from_file_name,
    identify_family,
    read_record,
)
from mizuoto_f5tts.training import F5Trainer

SMALL_VOCAB = None  # upstream's vocab: the synthetic clips' texts fit it


def _family_of(model) -> str:
    """What the built model is, from the two flags the weights do not show."""
    backbone = model.transformer
    if not hasattr(backbone, "text_embed") or not hasattr(backbone, "transformer_blocks"):
        return "e2_base"
    mask = backbone.text_embed.mask_padding
    heads = backbone.transformer_blocks[0].attn.pe_attn_head
    assert (mask, heads) in ((True, None), (False, 1)), (mask, heads)
    return "v1_base" if mask else "base"


def _bare(model_dir, name: str | None = None):
    """Upstream's state of the directory: no record; the checkpoint renamed to ``name``."""
    (model_dir / RECORD).unlink()
    if name is not None:
        checkpoint = find_checkpoint(model_dir)
        checkpoint.rename(model_dir / name)
    return model_dir


@pytest.fixture
def misleading(tmp_path):
    """A v0 model under runs-v1/F5TTS_v1_Base, a v1 model under models/base/F5TTS_Base."""
    return {
        "base": write_random_model_dir(tmp_path / "runs-v1" / "F5TTS_v1_Base" / "v1",
                                       "base", vocab=SMALL_VOCAB),
        "v1_base": write_random_model_dir(tmp_path / "srv" / "models" / "base" / "F5TTS_Base"
                                          / "v0-base", "v1_base", vocab=SMALL_VOCAB),
    }


@pytest.mark.parametrize(("name", "family"), [
    ("model_1250000.safetensors", "v1_base"), ("model_1200000.safetensors", "base"),
    ("model_1250000.pt", "v1_base"), ("pretrained_model_1200000.pt", "base"),
    ("pretrained_model_1250000.safetensors", "v1_base"),
    ("F5TTS_Base_model_40.safetensors", "base"),
    ("model_last.pt", None), ("model_500.pt", None), ("model_12500000.safetensors", None),
    ("v1_model_1200000.safetensors", None), ("F5TTS_v1_Base.safetensors", None),
    ("base.safetensors", None), ("F5TTS_Base_model_x.safetensors", None),
])
def test_release_file_names(name, family):
    assert family_from_file_name(name) == family


@pytest.mark.parametrize("family", ["base", "v1_base"])
def test_misleading_folders_load_as_what_they_are(misleading, family):
    model_dir = misleading[family]
    assert read_record(model_dir)["variant"] == family
    model, _ = load_f5_model(model_dir)
    assert _family_of(model) == family
    # upstream's bare release: the file name says it
    model, _ = load_f5_model(_bare(model_dir))
    assert _family_of(model) == family


@pytest.mark.parametrize("family", ["base", "v1_base"])
@pytest.mark.parametrize("name", ["model_last.pt", "model_5000.safetensors", "weights.safetensors"])
def test_an_unnamed_dit_is_refused_naming_the_choices(misleading, family, name):
    model_dir = _bare(misleading[family], name if name.endswith(".safetensors") else None)
    if name.endswith(".pt"):
        shutil.rmtree(model_dir)
        model_dir = write_random_model_dir(model_dir, family, vocab=SMALL_VOCAB,
                                           checkpoint_format="pt")
        _bare(model_dir, name)
    with pytest.raises(AmbiguousVariant) as caught:
        load_f5_model(model_dir)
    message = str(caught.value)
    assert caught.value.field == "variant"
    assert "'v1_base'" in message and "'base'" in message and name in message
    options = mizuoto.Options.from_mapping({"compute.device": "cpu"})
    with pytest.raises(AmbiguousVariant, match="engines.f5tts.variant"):
        F5Engine.load(model_dir, options=options)
    # named, it loads as named
    options = mizuoto.Options.from_mapping({"compute.device": "cpu",
                                            "engines.f5tts.variant": family})
    engine = F5Engine.load(model_dir, options=options)
    assert engine.info.variant == family


def test_e2_needs_no_name(tmp_path):
    model_dir = _bare(write_random_model_dir(tmp_path / "runs-v1", "e2_base", vocab=SMALL_VOCAB),
                      "model_last.safetensors")
    model, _ = load_f5_model(model_dir)
    assert _family_of(model) == "e2_base"
    with pytest.raises(CheckpointMismatch, match="UNETT backbone"):
        load_f5_model(model_dir, "v1_base")


def test_a_choice_against_the_record_or_the_weights_is_refused(misleading):
    model_dir = misleading["base"]
    with pytest.raises(InvalidRequest, match="contradicts") as caught:
        load_f5_model(model_dir, "v1_base")
    assert caught.value.field == "variant" and RECORD in str(caught.value)
    with pytest.raises(CheckpointMismatch, match="DIT backbone"):
        load_f5_model(_bare(model_dir), "e2_base")


def test_a_choice_beats_the_file_name(misleading):
    """A v1 fine-tune saved under v0's release name loads as v1 when told."""
    model_dir = _bare(misleading["v1_base"], "model_1200000.safetensors")
    assert _family_of(load_f5_model(model_dir)[0]) == "base"  # the name is all there is
    assert _family_of(load_f5_model(model_dir, "v1_base")[0]) == "v1_base"


def test_the_record_vouches_only_for_its_checkpoint(misleading, tmp_path):
    model_dir = misleading["base"]
    checkpoint = find_checkpoint(model_dir)
    checkpoint.rename(model_dir / "model_last.safetensors")  # record names model_1200000
    with pytest.raises(AmbiguousVariant):
        load_f5_model(model_dir)
    (model_dir / RECORD).write_text(json.dumps({"checkpoint": "model_last.safetensors",
                                                "variant": "v1_base"}))
    assert _family_of(load_f5_model(model_dir)[0]) == "v1_base"  # the record is believed
    (model_dir / RECORD).write_text(json.dumps({"checkpoint": "model_last.safetensors",
                                                "variant": "v2"}))
    with pytest.raises(CheckpointMismatch, match="variant record"):
        load_f5_model(model_dir)
    (model_dir / RECORD).write_text(json.dumps({"checkpoint": "model_last.safetensors",
                                                "variant": "e2_base"}))
    with pytest.raises(CheckpointMismatch, match="records variant 'e2_base'"):
        identify_family(model_dir / "model_last.safetensors", "dit")


# -- training ---------------------------------------------------------------------------------

def _config(model_dir, metadata, output, **params):
    return TrainingConfig(method="full", model=str(model_dir), dataset=metadata,
                          output_dir=output, steps=2, learning_rate=1e-4, seed=5, save_every=2,
                          params={"epochs": 1, "warmup_updates": 1,
                                  "batch_size_type": "sample", **params})


@pytest.fixture(scope="module")
def metadata(tmp_path_factory):
    return write_synthetic_dataset(tmp_path_factory.mktemp("data"), count=3, seed=3)


@pytest.mark.parametrize("family", ["base", "v1_base"])
def test_training_uses_what_the_checkpoint_is(tmp_path, misleading, metadata, family):
    trainer = F5Trainer()
    model_dir = misleading[family]
    run = trainer.prepare(_config(model_dir, metadata, tmp_path / "run"))
    assert run.variant.name == family
    assert trainer.train(run).steps_done == 2
    exported = trainer.export(run, tmp_path / "export")
    # the export records its variant: it loads as what it is from any folder
    moved = tmp_path / "runs-v1" / ("v1" if family == "base" else "base")
    shutil.copytree(exported, moved)
    assert read_record(moved)["variant"] == family
    assert _family_of(load_f5_model(moved)[0]) == family


def test_training_an_unnamed_dit_needs_params_variant(tmp_path, misleading, metadata):
    model_dir = _bare(misleading["base"], "model_last.safetensors")
    trainer = F5Trainer()
    with pytest.raises(AmbiguousVariant) as caught:
        trainer.prepare(_config(model_dir, metadata, tmp_path / "run"))
    assert caught.value.field == "params.variant" and "'base'" in str(caught.value)
    run = trainer.prepare(_config(model_dir, metadata, tmp_path / "run2", variant="base"))
    assert run.variant.name == "base"
    with pytest.raises(InvalidRequest, match="params.variant"):
        trainer.prepare(_config(model_dir, metadata, tmp_path / "run3", variant="v0"))
