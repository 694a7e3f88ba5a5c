"""A minimal trainer for the example's toy engine, for the trainer contract's self-test, built
on `mizuoto.training.StepTrainer` (which resumes, saves every ``save_every`` steps, reports
progress after the checkpoint and exports atomically).

It "fine-tunes" the toy's ``level`` weights by seeded pseudo-gradient steps scaled by the
learning rate. Mutations of it (an ignored learning rate, a resume that loses state) must be
caught by the trainer contract.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from mizuoto.plugin import StepTrainer, TrainingSession, atomic_path, resolve_model
from mizuoto_example import CONFIG_FILE, WEIGHTS_FILE

log = logging.getLogger(__name__)


class ToyTrainer(StepTrainer):
    engine = "toy"
    methods = frozenset({"full"})
    checkpoint = Path("checkpoint.safetensors")
    graceful_stop = False  # the suite's stop test needs an installed trainer (a subprocess)

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
        return _Run(config, model_dir)

    def learning_rate(self, config) -> float:
        return config.learning_rate

    def start(self, run, world):
        return _Session(run, self.learning_rate(run.config))

    def write_export(self, run, folder):
        state = load_file(str(Path(run.config.output_dir) / self.checkpoint))
        state.pop("step")
        shutil.copyfile(run.model_dir / CONFIG_FILE, folder / CONFIG_FILE)
        save_file(state, str(folder / WEIGHTS_FILE))


class _Run:
    def __init__(self, config, model_dir: Path) -> None:
        self.config, self.model_dir = config, model_dir


class _Session(TrainingSession):
    def __init__(self, run: _Run, learning_rate: float) -> None:
        self.config, self.learning_rate = run.config, learning_rate
        self.state = load_file(str(run.model_dir / WEIGHTS_FILE))
        self.total, self.done = run.config.steps, 0

    def update(self):
        noise = torch.Generator().manual_seed(self.config.seed * 100_003 + self.done)
        # one pseudo-gradient per example, averaged over the update's micro-batches
        examples = self.config.batch_size * self.config.params.get("grad_accumulation", 1)
        gradient = torch.randn((examples, *self.state["level"].shape), generator=noise).mean(0)
        norm = float(gradient.norm())
        gradient = self.clipped(gradient, norm)
        rate = self.scheduled_rate(self.done + 1)
        self.state["level"] = self.state["level"] - rate * gradient
        self.done += 1
        return {"loss": 0.0, "lr": rate, "grad_norm": norm}

    def scheduled_rate(self, update: int) -> float:
        """A linear warm-up over ``params.warmup_updates``, then the configured rate."""
        warmup = self.config.params.get("warmup_updates") or 0
        return self.learning_rate * min(1.0, update / warmup) if warmup else self.learning_rate

    def clipped(self, gradient, norm: float):
        """The gradient scaled to ``params.max_grad_norm`` where its norm is larger (0: off)."""
        limit = self.config.params.get("max_grad_norm") or 0.0
        return gradient * (limit / norm) if limit and norm > limit else gradient

    def save(self, path, done):
        with atomic_path(path) as part:
            save_file({**self.state, "step": torch.tensor(done)}, str(part))

    def load(self, path):
        self.state = load_file(str(path))
        self.done = int(self.state.pop("step"))
        return self.done
