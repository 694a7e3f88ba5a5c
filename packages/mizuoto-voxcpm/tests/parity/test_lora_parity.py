"""LoRA at inference: the same LoRA files give the same audio in upstream voxcpm 2.0.3 and in
Mizuoto, bit for bit.

Upstream loads them as ``VoxCPM(lora_config=LoRAConfig(**lora_config.json), lora_weights_path=
...)`` (2.0.3 ignores ``lora_config.json``; without ``lora_config`` it builds r 8, alpha 16 on
the LM and DiT); Mizuoto applies them with ``engine.set_lora(dir)``, or by itself when the model
directory is a LoRA export. Tiny random-init models of both generations, bfloat16 and float32;
a trained export is loaded by upstream's default path.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import mizuoto
from mizuoto.contracts import TrainingConfig
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import with_dtype, write_random_lora, write_random_model

pytestmark = pytest.mark.parity

voxcpm_core = pytest.importorskip("voxcpm.core")

TEXT = "Hello world, this is a test."
PARAMS = {"max_len": 5, "retry_badcase": False}
LORAS = {"voxcpm-0.5b": {}, "voxcpm2": {"r": 4, "alpha": 8, "enable_proj": True}}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("voxcpm-lora")
    out = {}
    for generation, lora in LORAS.items():
        base = write_random_model(root / generation, generation, seed=11)
        out[generation, "bfloat16"] = base
        out[generation, "float32"] = with_dtype(base, root / f"{generation}-fp32", "float32")
        out[generation, "lora"] = write_random_lora(root / f"{generation}-lora", base, seed=2,
                                                    **lora)
    return out


def _upstream_lora_config(generation: str, lora_dir: Path):
    module = "voxcpm.model.voxcpm2" if generation == "voxcpm2" else "voxcpm.model.voxcpm"
    cls = pytest.importorskip(module).LoRAConfig
    info = json.loads((lora_dir / "lora_config.json").read_text(encoding="utf-8"))
    return cls(**info["lora_config"])


def _upstream(model_dir: Path, lora_dir: Path, *, lora_config=None, seed: int = 7) -> np.ndarray:
    tts = voxcpm_core.VoxCPM(voxcpm_model_path=str(model_dir), enable_denoiser=False,
                             optimize=False, lora_config=lora_config,
                             lora_weights_path=str(lora_dir))
    torch.manual_seed(seed)
    return tts.generate(text=TEXT, **PARAMS)


def _ours(engine: VoxCPMEngine, seed: int = 7) -> np.ndarray:
    request = mizuoto.SynthesisRequest(TEXT, seed=seed, params=PARAMS)
    return engine.synthesize(request).audio.samples.numpy()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("generation", sorted(LORAS))
def test_lora_speaks_as_upstream(dirs, generation, dtype):
    lora = dirs[generation, "lora"]
    expected = _upstream(dirs[generation, dtype], lora,
                         lora_config=_upstream_lora_config(generation, lora))
    engine = VoxCPMEngine.load(dirs[generation, dtype])
    plain = _ours(engine)
    engine.set_lora(lora)
    ours = _ours(engine)
    assert np.array_equal(expected, ours)
    assert plain.shape != ours.shape or not np.array_equal(plain, ours)  # the LoRA acts


def test_trained_export_speaks_as_upstream(dirs, tmp_path):
    """A 0.5B LoRA trained and exported by Mizuoto: upstream loads the export with its default
    LoRA config; Mizuoto loads the export directory as a model (the LoRA applied by itself)."""
    import soundfile as sf

    base = dirs["voxcpm-0.5b", "float32"]
    rate = 16000
    t = np.arange(rate) / rate
    rows = []
    for i in range(2):
        sf.write(tmp_path / f"{i}.wav", (0.3 * np.sin(2 * np.pi * (200 + 90 * i) * t))
                 .astype(np.float32), rate)
        rows.append(json.dumps({"audio": f"{i}.wav", "text": f"Sentence number {i}."}))
    (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    from mizuoto_voxcpm.training import VoxCPMTrainer

    trainer = VoxCPMTrainer()
    run = trainer.prepare(TrainingConfig(
        method="lora", model=str(base), dataset=tmp_path / "train.jsonl",
        output_dir=tmp_path / "run", steps=2, learning_rate=1e-2, batch_size=1, seed=42,
        params={"warmup_steps": 0, "preview": False}))
    trainer.train(run)
    export = trainer.export(run, tmp_path / "export")
    expected = _upstream(export, export)
    engine = VoxCPMEngine.load(export)
    assert engine.lora is not None
    assert np.array_equal(expected, _ours(engine))
