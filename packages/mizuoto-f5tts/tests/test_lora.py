"""F5-TTS LoRA (there is no upstream one to match): a zero adapter gives the base audio, a
``lora`` run's loss falls and its export changes the audio, only adapters train, resume after
SIGKILL is identical, and wrong adapters are refused before anything is applied."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file, save_file

import mizuoto
from mizuoto import Reference, SynthesisRequest, TrainingConfig
from mizuoto.adapters import read_adapter
from mizuoto.errors import CheckpointMismatch, InvalidRequest, MizuotoError
from mizuoto.nn.lora import lora_layers
from mizuoto.training.state import load_state_file
from mizuoto.training.synthetic_data import write_synthetic_dataset
from mizuoto.training.trainer import CHECKPOINT
from mizuoto_f5tts.engine import F5Engine
from mizuoto_f5tts.fixtures import write_random_model_dir
from mizuoto_f5tts.training import F5Trainer

# a small data set trained on again and again: the loss must fall within a few updates
PARAMS = {"epochs": 40, "warmup_updates": 1, "batch_frames": 300, "lora_r": 4,
          "lora_alpha": 8}
OPTIONS = {"compute.device": "cpu", "compute.cpu_threads": 1}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_random_model_dir(tmp_path_factory.mktemp("f5") / "v1", "v1_base", size="tiny")


@pytest.fixture(scope="module")
def metadata(tmp_path_factory):
    return write_synthetic_dataset(tmp_path_factory.mktemp("data"), count=3, seed=3)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, model_dir, metadata):
    """A 12-update lora run and its export."""
    root = tmp_path_factory.mktemp("lora")
    trainer = F5Trainer()
    run = trainer.prepare(_config(model_dir, metadata, root / "run", steps=12))
    result = trainer.train(run)
    return run, result, trainer.export(run, root / "adapter")


def _config(model_dir, metadata, output, **fields):
    return TrainingConfig(method="lora", model=str(model_dir), dataset=metadata,
                          output_dir=output, steps=fields.pop("steps", 6),
                          learning_rate=fields.pop("learning_rate", 3e-3), seed=5,
                          save_every=2, params=fields.pop("params", PARAMS), **fields)


def _speak(engine, metadata) -> torch.Tensor:
    ref = Reference(metadata.parent / "wavs" / "clip_001.wav", text="The quick brown fox jumps.")
    return engine.synthesize(SynthesisRequest("Hello there.", reference=ref, seed=1,
                                              steps=4)).audio.samples


def _load(path):
    return mizuoto.load(path, options=mizuoto.Options.from_mapping(OPTIONS))


def test_a_zero_adapter_gives_the_base_audio(trained, model_dir, metadata, tmp_path):
    """(a) rank-4 adapters whose B is zero (A random) leave every sample as the base model's."""
    _, _, adapter = trained
    zero = tmp_path / "zero"
    zero.mkdir()
    (zero / "adapter_config.json").write_text((adapter / "adapter_config.json").read_text())
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    save_file({k: torch.zeros_like(v) if ".lora_B." in k else v for k, v in tensors.items()},
              str(zero / "adapter_model.safetensors"))
    engine = _load(model_dir)
    base = _speak(engine, metadata)
    engine.set_lora(zero)
    assert len(lora_layers(engine.model.transformer)) == 12  # 2 blocks x (4 attn + 2 ff)
    assert torch.equal(_speak(engine, metadata), base)


def test_a_lora_run_trains_only_adapters_its_loss_falls_and_it_changes_the_audio(
        trained, model_dir, metadata):
    """(b) on three synthetic clips: the loss of the last updates is below the first ones';
    the checkpoint's base weights are the base model's; the export is the adapter alone and
    changes the audio; swapping it off gives the base audio back."""
    run, result, adapter = trained
    records = load_state_file(run.config.output_dir / CHECKPOINT)["records"]
    losses = [r[1] for r in records]
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4, losses
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json",
                                                          "adapter_model.safetensors"]
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8
    assert config["base_model_name_or_path"] == str(model_dir)
    assert config["mizuoto"]["base_model_fingerprint"]
    engine = _load(model_dir)
    base = _speak(engine, metadata)
    state = load_state_file(run.config.output_dir / CHECKPOINT)["model"]
    base_weights = engine.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in base_weights.items()), \
        "a base weight changed in a lora run"
    engine.set_lora(adapter)
    assert engine.lora.base_model == str(model_dir)
    adapted = _speak(engine, metadata)
    assert not torch.equal(adapted, base)
    assert engine.info.fingerprint.startswith(engine.base_fingerprint() + "+lora:")
    engine.set_lora(None)
    assert torch.equal(_speak(engine, metadata), base)
    assert not lora_layers(engine.model.transformer)
    # the adapter directory alone loads its base model and applies it (say -m, serve -m)
    assert torch.equal(_speak(_load(adapter), metadata), adapted)
    from mizuoto.loading import resolve_engine

    engine_cls, resolved = resolve_engine(adapter)  # what say/serve check before loading
    assert engine_cls is F5Engine and resolved.path == model_dir


def test_say_with_lora_speaks_with_the_adapter(trained, model_dir, metadata, tmp_path):
    from click.testing import CliRunner

    from mizuoto.cli import cli

    _, _, adapter = trained
    out = tmp_path / "out.wav"
    args = ["--quiet", "say", "-m", str(model_dir), "--lora", str(adapter),
            "--ref-audio", str(metadata.parent / "wavs" / "clip_001.wav"),
            "--ref-text", "The quick brown fox jumps.", "--steps", "2", "-o", str(out),
            "Hello."]
    result = CliRunner().invoke(cli, args, obj={}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert out.stat().st_size > 44


def test_wrong_adapters_are_refused_before_anything_is_applied(trained, metadata, tmp_path):
    """Another base model (its fingerprint), another shape, NaN weights, a module the engine
    does not offer: each refused by name, the engine speaking as before."""
    _, _, adapter = trained
    engine = _load(trained[0].model_dir)
    base = _speak(engine, metadata)

    def variant(name, config_change=None, tensor_change=None):
        path = tmp_path / name
        path.mkdir()
        config = json.loads((adapter / "adapter_config.json").read_text())
        if config_change:
            config_change(config)
        (path / "adapter_config.json").write_text(json.dumps(config))
        tensors = load_file(str(adapter / "adapter_model.safetensors"))
        if tensor_change:
            tensors = tensor_change(tensors)
        save_file(tensors, str(path / "adapter_model.safetensors"))
        return path

    def other_base(config):
        config["mizuoto"]["base_model_fingerprint"] = "0" * 64

    def rank(config):
        config["r"] = 8

    def nan(tensors):
        key = sorted(tensors)[0]
        tensors[key] = tensors[key].clone()
        tensors[key].view(-1)[0] = float("nan")
        return tensors

    def not_offered(config):
        config["target_modules"] = ["missing_module"]

    cases = [(variant("other", other_base), InvalidRequest, "another base model"),
             (variant("rank", rank), CheckpointMismatch, "shape mismatches"),
             (variant("nan", tensor_change=nan), CheckpointMismatch, "NaN or Inf"),
             (variant("module", not_offered), InvalidRequest, "names no linear layer"),
             (tmp_path, MizuotoError, "adapter_model.safetensors")]
    engine.set_lora(adapter)
    adapted = _speak(engine, metadata)
    for path, error, words in cases:
        with pytest.raises(error, match=words):
            engine.set_lora(path)
        assert torch.equal(_speak(engine, metadata), adapted), path
    engine.set_lora(None)
    assert torch.equal(_speak(engine, metadata), base)


def test_lora_params_are_checked_before_training(tmp_path, model_dir, metadata):
    trainer = F5Trainer()
    for params, field in (({"lora_r": 0}, "params.lora_r"),
                          ({"lora_dropout": 1.0}, "params.lora_dropout"),
                          ({"lora_targets": ["nope"]}, "params.lora_targets"),
                          ({"lora_targets": ["norm_out.linear", "to_q"]}, None),
                          ({"extend_vocab": True}, "params.extend_vocab")):
        config = _config(model_dir, metadata, tmp_path / str(len(str(params))),
                         params={**PARAMS, **params}, steps=1)
        if field is None:
            trainer.train(trainer.prepare(config))
            continue
        with pytest.raises(InvalidRequest) as caught:
            trainer.train(trainer.prepare(config))
        assert caught.value.field == field, params
    full = TrainingConfig(method="full", model=str(model_dir), dataset=metadata,
                          output_dir=tmp_path / "full", steps=1, params={"lora_r": 4})
    with pytest.raises(InvalidRequest, match="--method lora"):
        trainer.prepare(full)


_KILLED_RUN = """
import os, signal, sys
from mizuoto import TrainingConfig
from mizuoto_f5tts.training import F5Trainer
model_dir, metadata, output = sys.argv[1:4]
config = TrainingConfig(method="lora", model=model_dir, dataset=metadata, output_dir=output,
                        steps=6, learning_rate=3e-3, seed=5, save_every=2, params={params!r})
def progress(p):
    if p.stage == "train" and p.done == 3:
        os.kill(os.getpid(), signal.SIGKILL)
trainer = F5Trainer()
trainer.train(trainer.prepare(config), progress=progress)
"""


def test_resume_after_sigkill_is_identical(tmp_path, model_dir, metadata):
    """(d) killed in update 3 (after the save at 2), resumed: every record, adapter weight and
    optimizer moment equals a straight run's, with dropout on the adapters."""
    params = {**PARAMS, "lora_dropout": 0.1}
    script = textwrap.dedent(_KILLED_RUN).format(params=params)
    killed = subprocess.run([sys.executable, "-c", script, str(model_dir), str(metadata),
                             str(tmp_path / "run")], capture_output=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    assert load_state_file(tmp_path / "run" / CHECKPOINT)["position"]["update"] == 2
    trainer = F5Trainer()
    resumed = trainer.train(trainer.prepare(_config(model_dir, metadata, tmp_path / "run",
                                                    params=params)))
    straight = trainer.train(trainer.prepare(_config(model_dir, metadata,
                                                     tmp_path / "straight", params=params)))
    assert resumed.resumed_from == 2 and resumed.steps_done == straight.steps_done == 6
    a = load_state_file(tmp_path / "run" / CHECKPOINT)
    b = load_state_file(tmp_path / "straight" / CHECKPOINT)
    assert a["records"] == b["records"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"])
    exported = [trainer.export(trainer.prepare(_config(model_dir, metadata, tmp_path / d,
                                                       params=params)), tmp_path / f"{d}-out")
                for d in ("run", "straight")]
    assert [read_adapter(e).digest for e in exported][0] == read_adapter(exported[1]).digest


def test_engine_declares_its_targets_and_refuses_unoffered_ones():
    assert F5Engine.lora_targets.default == ("to_q", "to_k", "to_v", "to_out.0", "ff.0.0",
                                             "ff.2")


def test_mizuoto_train_method_lora_then_say_with_the_export(tmp_path, model_dir, metadata):
    """The command line end to end: ``train --method lora`` with rank, alpha, dropout and
    targets as params, its export an adapter that ``say -m ADAPTER`` speaks with."""
    from click.testing import CliRunner

    from mizuoto.cli import cli

    args = ["--quiet", "train", "-e", "f5tts", "--method", "lora", "-m", str(model_dir),
            "--data", str(metadata), "--output", str(tmp_path / "run"), "--steps", "1",
            "--param", "lora_r=2", "--param", "lora_alpha=4", "--param", "lora_dropout=0.05",
            "--param", 'lora_targets=["to_q", "to_v"]', "--param", "batch_frames=300"]
    result = CliRunner().invoke(cli, args, obj={}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    adapter = read_adapter(tmp_path / "run" / "export")
    assert (adapter.settings.r, adapter.settings.alpha, adapter.settings.dropout) == (2, 4, 0.05)
    assert adapter.settings.target_modules == tuple(
        f"transformer_blocks.{i}.attn.{name}" for i in (0, 1) for name in ("to_q", "to_v"))
    out = tmp_path / "out.wav"
    said = CliRunner().invoke(cli, ["--quiet", "say", "-m", str(tmp_path / "run" / "export"),
                                    "--ref-audio", str(metadata.parent / "wavs" / "clip_001.wav"),
                                    "--ref-text", "The quick brown fox jumps.", "--steps", "2",
                                    "-o", str(out), "Hello."], obj={}, catch_exceptions=False)
    assert said.exit_code == 0, said.output
    assert out.stat().st_size > 44
