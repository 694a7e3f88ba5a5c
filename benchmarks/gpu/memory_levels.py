"""Training memory levels on one device: each level trains the same tiny model the same steps,
and must leave the same losses and the same saved weights as ``default``; the peak device
memory of each is reported. One of the GPU check's steps (benchmarks/gpu/checks.py).

    python benchmarks/gpu/memory_levels.py --device cuda --json OUT.json

Prints one JSON document: per engine, per level, the peak memory (MB, CUDA only), the saved
tensors compared with ``default`` and the device and mixed precision the trainer reported.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from mizuoto import TrainingConfig


def _tensors(output: Path) -> dict[str, torch.Tensor]:
    """What a run saved: F5's run state (weights, EMA, per-step records), VoxCPM's
    safetensors files (LoRA weights, optimiser state)."""
    from safetensors.torch import load_file

    from mizuoto.training.state import load_state_file
    from mizuoto.training.trainer import CHECKPOINT

    tensors = {}
    if (output / CHECKPOINT).is_file():
        state = load_state_file(output / CHECKPOINT)
        for part in ("model", "ema"):
            tensors.update({f"{part}:{k}": v for k, v in state[part].items()})
        tensors["records"] = torch.tensor(state["records"], dtype=torch.float64)
    for path in sorted(output.rglob("*.safetensors")):
        for key, value in load_file(str(path)).items():
            tensors[f"{path.relative_to(output)}:{key}"] = value
    return tensors


def _f5(root: Path, device: str):
    from mizuoto.training.synthetic_data import write_synthetic_dataset
    from mizuoto_f5tts.fixtures import write_random_model_dir
    from mizuoto_f5tts.training import F5Trainer

    model = write_random_model_dir(root / "f5-model", "v1_base", size="tiny")
    data = write_synthetic_dataset(root / "f5-data", count=4, seed=3)
    precision = "bf16"  # the CPU test suite's precision too (test_training_device.py)

    def config(level: str, output: Path) -> TrainingConfig:
        return TrainingConfig(method="full", model=str(model), dataset=data, output_dir=output,
                              steps=3, learning_rate=1e-3, seed=5, save_every=10,
                              batch_size=2, memory=level, mixed_precision=precision,
                              compute={"device": device},
                              params={"epochs": 3, "warmup_updates": 1,
                                      "batch_size_type": "sample"})

    return F5Trainer(), config


def _voxcpm(root: Path, device: str):
    import numpy as np
    import soundfile as sf

    from mizuoto_voxcpm.fixtures import with_dtype, write_random_model
    from mizuoto_voxcpm.training.trainer import VoxCPMTrainer

    model = with_dtype(write_random_model(root / "vox-base", "voxcpm-0.5b", seed=6),
                       root / "vox-model", "float32")
    rows = []
    for i in range(2):
        t = np.arange(int((0.4 + 0.1 * i) * 16000)) / 16000
        sf.write(root / f"{i}.wav", (0.3 * np.sin(2 * np.pi * (150 + 60 * i) * t)
                                     ).astype(np.float32), 16000)
        rows.append({"audio": f"{i}.wav", "text": f"Line number {i}."})
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    precision = "bf16" if device.startswith("cuda") else "no"  # bf16 is CUDA-only there

    def config(level: str, output: Path) -> TrainingConfig:
        return TrainingConfig(method="lora", model=str(model), dataset=root / "train.jsonl",
                              output_dir=output, steps=2, learning_rate=1e-4, batch_size=2,
                              seed=42, save_every=1, memory=level, mixed_precision=precision,
                              compute={"device": device}, params={"warmup_steps": 1})

    return VoxCPMTrainer(), config


def run(device: str, root: Path) -> dict:
    report = {}
    for engine, build in (("f5tts", _f5), ("voxcpm", _voxcpm)):
        trainer, config = build(root, device)
        levels = {}
        baseline = None
        for level in trainer.memory_levels:
            output = root / f"{engine}-{level}"
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            prepared = trainer.prepare(config(level, output))
            result = trainer.train(prepared)
            peak = torch.cuda.max_memory_allocated() / 1e6 if device.startswith("cuda") \
                else None
            tensors = _tensors(output)
            row = {"steps_done": result.steps_done, "metrics": dict(result.metrics),
                   "deterministic": torch.are_deterministic_algorithms_enabled(),
                   "peak_memory_mb": peak, "tensors": len(tensors),
                   **_placement(prepared, output)}
            if baseline is None:
                baseline = (tensors, dict(result.metrics))
                row["identical_to_default"] = bool(tensors)
            else:
                row["identical_to_default"] = bool(tensors) and \
                    tensors.keys() == baseline[0].keys() and \
                    all(torch.equal(v, baseline[0][k]) for k, v in tensors.items()) and \
                    dict(result.metrics) == baseline[1]
            levels[level] = row
        report[engine] = levels
    return report


def _placement(prepared, output: Path) -> dict:
    """The device and mixed precision the trainer reported (the run's record, else its
    run.json)."""
    settings = getattr(prepared, "settings", None)
    if hasattr(prepared, "device") and settings is not None:
        return {"device": str(prepared.device), "mixed_precision": settings.mixed_precision}
    from mizuoto_voxcpm.training.trainer import VoxCPMTrainer

    recorded = json.loads((output / "run.json").read_text())
    device = recorded.get("device") or VoxCPMTrainer().device_and_precision(prepared.config)[0]
    return {"device": str(device),
            "mixed_precision": recorded.get("mixed_precision")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mizuoto-memory-levels-") as root:
        report = run(args.device, Path(root))
    args.json.write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
