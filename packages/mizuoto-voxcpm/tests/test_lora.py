"""LoRA hot-swap on a loaded engine: attach, swap and remove give exactly what fresh loads give,
and the model's identity follows."""

from __future__ import annotations

import json

import pytest
import torch

import mizuoto
from mizuoto.errors import CheckpointMismatch, ModelFilesMissing, VoiceMismatch
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import write_random_lora, write_random_model

REQUEST = mizuoto.SynthesisRequest("Hello world, this is a test.", seed=3,
                                   params={"max_len": 4, "retry_badcase": False,
                                           "inference_timesteps": 2})


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    model = write_random_model(root / "model", "voxcpm2", seed=4)
    a = write_random_lora(root / "a", model, seed=1)
    b = write_random_lora(root / "b", model, seed=2, r=4, alpha=4, enable_proj=True)
    # r 8 tensors under a config that says r 4: every shape is wrong
    wrong = write_random_lora(root / "wrong", model, seed=3)
    config = json.loads((wrong / "lora_config.json").read_text(encoding="utf-8"))
    config["lora_config"]["r"] = 4
    (wrong / "lora_config.json").write_text(json.dumps(config), encoding="utf-8")
    return model, a, b, wrong


def _audio(engine) -> torch.Tensor:
    return engine.synthesize(REQUEST).audio.samples


def _fresh(model, lora=None) -> torch.Tensor:
    engine = VoxCPMEngine.load(model)
    if lora is not None:
        engine.set_lora(lora)
    return _audio(engine)


def test_swap_a_b_none_equals_fresh_loads(setup):
    model, a, b, _ = setup
    engine = VoxCPMEngine.load(model)
    base_info = engine.info
    plain = _audio(engine)
    engine.set_lora(a)
    with_a = _audio(engine)
    info_a = engine.info
    engine.set_lora(b)  # another rank and targets: the layers are rebuilt
    with_b = _audio(engine)
    engine.set_lora(None)
    assert torch.equal(_audio(engine), plain)
    assert engine.info == base_info and engine.lora is None
    assert torch.equal(with_a, _fresh(model, a))
    assert torch.equal(with_b, _fresh(model, b))
    assert not torch.equal(with_a, plain)
    assert info_a.fingerprint.startswith(base_info.fingerprint + "+lora:")
    engine.set_lora(a)
    engine.set_lora(a)  # the same LoRA again: the same audio and fingerprint
    assert torch.equal(_audio(engine), with_a) and engine.info == info_a


def test_applied_and_voices_name_the_lora(setup, tmp_path):
    model, a, _, _ = setup
    import numpy as np
    import soundfile as sf

    sf.write(tmp_path / "ref.wav", 0.3 * np.sin(np.arange(16000) / 5.0), 16000)
    engine = VoxCPMEngine.load(model)
    engine.set_lora(a)
    assert engine.synthesize(REQUEST).applied.extra["lora"] == str(a)
    voice = engine.build_voice(mizuoto.Reference(tmp_path / "ref.wav", "Some words."))
    engine.set_lora(None)
    assert engine.synthesize(REQUEST).applied.extra["lora"] is None
    with pytest.raises(VoiceMismatch):
        engine.synthesize(mizuoto.SynthesisRequest("Hi there.", voice=voice, seed=1,
                                                   params=REQUEST.params))


def test_a_lora_for_another_model_is_refused_and_nothing_changes(setup, tmp_path):
    model, a, _, wrong = setup
    engine = VoxCPMEngine.load(model)
    engine.set_lora(a)
    before = _audio(engine)
    with pytest.raises(CheckpointMismatch):
        engine.set_lora(wrong)
    assert engine.lora.path == str(a)
    assert torch.equal(_audio(engine), before)
    with pytest.raises(ModelFilesMissing):
        engine.set_lora(tmp_path)


def test_say_applies_a_lora(setup, tmp_path):
    from click.testing import CliRunner

    from mizuoto.cli import cli

    model, a, _, _ = setup
    out = tmp_path / "out.wav"
    result = CliRunner().invoke(cli, ["--quiet", "say", "-m", str(model), "--lora", str(a),
                                      REQUEST.text, "-o", str(out), "--seed", "3",
                                      "--param", "max_len=4", "--param", "retry_badcase=false",
                                      "--param", "inference_timesteps=2",
                                      "--option", "compute.cpu_threads=1"], obj={})
    assert result.exit_code == 0, result.output
    engine = VoxCPMEngine.load(model)
    engine.set_lora(a)
    expected = engine.synthesize(REQUEST)
    expected.save(tmp_path / "expected.wav")
    assert out.read_bytes() == (tmp_path / "expected.wav").read_bytes()
