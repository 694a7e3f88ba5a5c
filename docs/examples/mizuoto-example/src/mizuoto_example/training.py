"""The toy trainer: fits each character's ``level`` to the loudness of the clips that speak
it, built on the training toolkit (``mizuoto.training``, docs/plugins.md "Training toolkit").

Data: a JSONL manifest (``{"audio": PATH, "text": ...}`` per line) or a folder holding one.
Per update, ``grad_accumulation`` micro-batches of ``batch_size`` clips drawn from a seeded
generator; the loss is the squared difference between the mean level of a clip's characters
and the clip's RMS. Adam, a constant learning rate. It writes what is its own (the data, one
update, its state, its export files); `StepTrainer` does the rest: resuming, metrics.jsonl and
TensorBoard, progress with loss and ETA, saves every ``save_every`` updates, numbered
checkpoints rotated, SIGINT/SIGTERM saving and stopping, the process world, the atomic export.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import attrs
import torch
from safetensors.torch import save_file

from mizuoto.plugin import (
    InvalidRequest,
    Precision,
    StepTrainer,
    TrainerParams,
    TrainingConfig,
    TrainingSession,
    atomic_path,
    checkpoint_retention,
    load_state_dict_file,
    micro_batches,
    read_audio,
    read_manifest,
    resolve_for_engine,
    to_mono,
)
from mizuoto_example import CONFIG_FILE, WEIGHTS_FILE

logger = logging.getLogger(__name__)

#: shared settings (`TrainerParams`) this trainer has nothing to apply to: refused, not ignored
NOT_APPLICABLE = {"warmup_updates": "a constant learning rate", "max_grad_norm": "no clipping",
                  "samples": "no audio samples"}


@attrs.frozen
class ToyRun:
    config: TrainingConfig
    model_dir: Path
    slots: tuple[tuple[int, ...], ...]  # per clip: its characters' weight rows
    loudness: tuple[float, ...]  # per clip: its RMS
    accumulation: int


class ToyTrainer(StepTrainer):
    engine = "toy"
    methods = frozenset({"full"})

    def defaults(self, method: str, model: str) -> dict:
        return {"steps": 100, "learning_rate": 1e-2, "batch_size": 2}

    def prepare(self, config: TrainingConfig, *, progress=None) -> ToyRun:
        self.check(config)
        # the shared settings, each checked once; any other key is refused, naming the known
        params = TrainerParams.parse(config.params, trainer="toy")
        for name, why in NOT_APPLICABLE.items():
            if getattr(params, name) is not None:
                raise InvalidRequest(f"params.{name}", f"does not apply to the toy trainer "
                                     f"({why})", "leave it out")
        accumulation = params.grad_accumulation or 1
        keep, every = checkpoint_retention(config)
        model_dir = resolve_for_engine(config.model, self.engine).path
        vocab = json.loads((model_dir / CONFIG_FILE).read_text())["toy_vocab_size"]
        rows = [(row.text, row.audio) for row in read_manifest(Path(config.dataset))]
        self.claim_run(config, weights=[model_dir / WEIGHTS_FILE], rows=rows, recipe={
            "engine": self.engine, "steps": config.steps,
            "learning_rate": config.learning_rate, "batch_size": config.batch_size,
            "seed": config.seed, "save_every": config.save_every,
            "grad_accumulation": accumulation, "keep_last_n_checkpoints": keep,
            "checkpoint_every": every})
        slots, loudness = [], []
        for text, audio in rows:
            samples, _ = read_audio(audio, field="dataset")
            loudness.append(float(to_mono(samples).to(torch.float64).pow(2).mean().sqrt()))
            slots.append(tuple(ord(c) % vocab for c in text if not c.isspace()))
        return ToyRun(config, model_dir, tuple(slots), tuple(loudness), accumulation)

    def start(self, run: ToyRun, world) -> ToySession:
        return ToySession(run)

    def write_export(self, run: ToyRun, folder: Path) -> None:
        """The base model with the trained levels."""
        state = torch.load(Path(run.config.output_dir) / self.checkpoint, weights_only=True)
        weights = load_state_dict_file(run.model_dir / WEIGHTS_FILE)
        save_file({"pitch": weights["pitch"], "level": state["level"]},
                  str(folder / WEIGHTS_FILE))
        shutil.copy2(run.model_dir / CONFIG_FILE, folder / CONFIG_FILE)


class ToySession(TrainingSession):
    def __init__(self, run: ToyRun) -> None:
        self.run, config = run, run.config
        weights = load_state_dict_file(run.model_dir / WEIGHTS_FILE)
        self.level = torch.nn.Parameter(weights["level"].to(torch.float32).clone())
        self.optimizer = torch.optim.Adam([self.level], lr=config.learning_rate)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.precision = Precision()  # the toy has nothing to autocast; the hooks stay in place
        self.total = config.steps

    def update(self) -> dict[str, float]:
        run, optimizer, precision = self.run, self.optimizer, self.precision
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for _, skip_sync in micro_batches(run.accumulation):
            picks = torch.randint(len(run.slots), (run.config.batch_size,),
                                  generator=self.generator)
            with skip_sync, precision.autocast():
                loss = torch.stack([
                    (self.level[list(run.slots[i])].mean() - run.loudness[i]) ** 2
                    for i in picks.tolist()]).mean() / run.accumulation
            precision.backward(loss)
            total += loss.item()
        precision.unscale(optimizer)
        precision.step(optimizer)
        return {"loss": total, "lr": optimizer.param_groups[0]["lr"]}

    def save(self, path: Path, done: int) -> None:
        with atomic_path(path) as tmp:
            torch.save({"level": self.level.detach().clone(), "update": done,
                        "optimizer": self.optimizer.state_dict(),
                        "generator": self.generator.get_state()}, tmp)

    def load(self, path: Path) -> int:
        state = torch.load(path, weights_only=True)
        self.level.data.copy_(state["level"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        return int(state["update"])
