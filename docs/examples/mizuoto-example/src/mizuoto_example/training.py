"""The toy trainer: model + data + loss + export, each character's ``level`` fitted to loudness."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import torch
from safetensors.torch import save_file

from mizuoto.plugin import (
    RunnerSession,
    StepTrainer,
    TrainingConfig,
    load_state_dict_file,
    read_audio,
    read_manifest,
    resolve_for_engine,
    to_mono,
)
from mizuoto_example import CONFIG_FILE, WEIGHTS_FILE
from mizuoto_example.engine import LORA_TARGETS, Tables


@attrs.frozen
class ToyRun:
    config: TrainingConfig
    model_dir: Path
    slots: tuple[tuple[int, ...], ...]  # per clip: its characters' weight rows
    loudness: tuple[float, ...]  # per clip: its RMS


class ToyTrainer(StepTrainer):
    engine = "toy"
    lora_targets = LORA_TARGETS  # the engine's: methods full and lora (core adds the adapters)

    def defaults(self, method: str, model: str) -> dict:
        return {"steps": 100, "learning_rate": 1e-2, "batch_size": 2}

    def prepare(self, config: TrainingConfig, *, progress=None) -> ToyRun:
        self.check(config)
        self.params_class.parse(config.params, trainer="toy")  # an unknown key is refused
        model_dir = resolve_for_engine(config.model, self.engine).path
        vocab = json.loads((model_dir / CONFIG_FILE).read_text())["toy_vocab_size"]
        rows = [(row.text, row.audio) for row in read_manifest(Path(config.dataset))]
        self.claim_run(config, weights=[model_dir / WEIGHTS_FILE], rows=rows, recipe={
            "engine": self.engine, "steps": config.steps, "learning_rate": config.learning_rate,
            "batch_size": config.batch_size, "seed": config.seed, **config.params})
        slots = tuple(tuple(ord(c) % vocab for c in text if not c.isspace()) for text, _ in rows)
        loudness = tuple(float(to_mono(read_audio(audio, field="dataset")[0])
                               .to(torch.float64).pow(2).mean().sqrt()) for _, audio in rows)
        return ToyRun(config, model_dir, slots, loudness)

    def start(self, run: ToyRun, world) -> RunnerSession:
        config, weights = run.config, load_state_dict_file(run.model_dir / WEIGHTS_FILE)
        model = Tables(weights["pitch"], weights["level"])  # the engine's layers
        model.pitch.weight.requires_grad_(False)  # the levels train, the pitches stay
        self.add_lora(run, model)  # --method lora: adapters on the tables, only they train
        # the toy's own defaults: no clipping, a constant rate (--max-grad-norm, --lr-schedule)
        runner = self.runner(run, world, max_grad_norm=0.0, schedule="constant")
        runner.optimize(model)  # AdamW over what trains, the run's learning rate and schedule
        generator = torch.Generator().manual_seed(config.seed)  # the data's draws, resumed
        one_hot = torch.eye(model.level.in_features, dtype=torch.float64)  # every slot, once

        def next_batch() -> list[int]:
            return torch.randint(len(run.slots), (config.batch_size,), generator=generator).tolist()

        def loss(picks: list[int]) -> dict[str, torch.Tensor]:
            levels = model.level(one_hot)[:, 0]  # through the layer: an adapter's levels too
            return {"loss": torch.stack([(levels[list(run.slots[i])].mean()
                                          - run.loudness[i]) ** 2 for i in picks]).mean()}
        return RunnerSession(runner, model, total=config.steps, next_batch=next_batch, loss=loss,
                             generators={"generator": generator})

    def write_export(self, run: ToyRun, folder: Path) -> None:  # (a lora run's: the core's)
        pitch = load_state_dict_file(run.model_dir / WEIGHTS_FILE)["pitch"]  # base, trained levels
        level = self.trained_weights(run)["level.weight"].view(-1).to(torch.float32)
        save_file({"pitch": pitch, "level": level}, str(folder / WEIGHTS_FILE))
        (folder / CONFIG_FILE).write_bytes((run.model_dir / CONFIG_FILE).read_bytes())
