"""A minimal trainer for the example's toy engine, for the trainer contract's self-test.

It "fine-tunes" the toy's ``level`` weights by seeded pseudo-gradient steps scaled by the
learning rate, checkpoints atomically every ``save_every`` steps and resumes from the last
checkpoint, and exports a toy model directory atomically. Mutations of it (an ignored learning
rate, a resume that loses state) must be caught by the trainer contract.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from mizuoto import Trainer, TrainingResult, resolve_model
from mizuoto.contracts.progress import report
from mizuoto.runtime.atomic import atomic_directory, atomic_path
from mizuoto_example import CONFIG_FILE, WEIGHTS_FILE

log = logging.getLogger(__name__)
CHECKPOINT = "checkpoint.safetensors"


class ToyTrainer(Trainer):
    engine = "toy"
    methods = frozenset({"full"})

    def prepare(self, config, *, progress=None):
        self.check(config)
        model_dir = resolve_model(config.model).path
        manifest = Path(config.dataset)
        rows = []
        for number, line in enumerate(manifest.read_text(encoding="utf-8").splitlines(), 1):
            row = json.loads(line)
            if not row.get("text") or not (manifest.parent / row["audio"]).is_file():
                log.warning("row %d skipped: no text or no audio file", number)
                continue
            rows.append(row)
        return config, model_dir, rows

    def train(self, run, *, progress=None):
        config, model_dir, _ = run
        output = Path(config.output_dir)
        output.mkdir(parents=True, exist_ok=True)
        checkpoint = output / CHECKPOINT
        resumed_from = None
        if checkpoint.is_file():
            state = load_file(str(checkpoint))
            resumed_from = start = int(state.pop("step"))
        else:
            state, start = load_file(str(model_dir / WEIGHTS_FILE)), 0
        for step in range(start, config.steps):
            noise = torch.Generator().manual_seed(config.seed * 100_003 + step)
            # one pseudo-gradient per example, averaged over the update's micro-batches
            examples = config.batch_size * config.params.get("grad_accumulation", 1)
            gradient = torch.randn((examples, *state["level"].shape), generator=noise).mean(0)
            state["level"] = state["level"] - self.learning_rate(config) * gradient
            done = step + 1
            if done % config.save_every == 0 or done == config.steps:
                self.save(checkpoint, state, done)
            report(progress, "train", done, config.steps)  # after the checkpoint
        return TrainingResult(output, config.steps, resumed_from, metrics={"loss": 0.0})

    def learning_rate(self, config) -> float:
        return config.learning_rate

    def save(self, checkpoint: Path, state: dict, done: int) -> None:
        with atomic_path(checkpoint) as part:
            save_file({**state, "step": torch.tensor(done)}, str(part))

    def export(self, run, destination):
        config, model_dir, _ = run
        state = load_file(str(Path(config.output_dir) / CHECKPOINT))
        state.pop("step")
        with atomic_directory(destination) as part:
            shutil.copyfile(model_dir / CONFIG_FILE, part / CONFIG_FILE)
            save_file(state, str(part / WEIGHTS_FILE))
        return Path(destination)
