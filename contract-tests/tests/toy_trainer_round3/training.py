"""FROZEN: the example plugin's trainer as it was in round 3 (commit eca8c42), written on the
training toolkit and the deep modules a trainer imported then, standing for third-party
trainers of that round; it trains the round-2 toy engine (``toy_api_1_0``: the same model
files). Do not update it: if the suite or the API changes so that it fails, that is a break of
every such trainer (fix the change, or deprecate with a warning), not of this copy.

The toy trainer: fits each character's ``level`` to the loudness of the clips that speak
it, built on the training toolkit (``mizuoto.training``, docs/plugins.md "Training toolkit").

Data: a JSONL manifest (``{"audio": PATH, "text": ...}`` per line) or a folder holding one.
Per update, ``grad_accumulation`` micro-batches of ``batch_size`` clips drawn from a seeded
generator; the loss is the squared difference between the mean level of a clip's characters
and the clip's RMS. Adam, a constant learning rate. What the toolkit gives it: the run
directory (its identity, so that a resume with another base model or data is refused; the
recipe; the writability check), the loop (metrics.jsonl and TensorBoard, progress with loss
and ETA, saves every ``save_every`` updates, numbered checkpoints rotated, SIGINT/SIGTERM
saving and stopping), the accumulation and the mixed-precision hooks, the process world.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import attrs
import torch
from safetensors.torch import save_file
from toy_api_1_0 import CONFIG_FILE, WEIGHTS_FILE

from mizuoto import Trainer, TrainingConfig, TrainingResult
from mizuoto.contracts.trainer import checkpoint_retention
from mizuoto.errors import InvalidRequest
from mizuoto.loading import resolve_for_engine
from mizuoto.nn.dsp.audio_io import read_audio, to_mono
from mizuoto.runtime.atomic import atomic_path
from mizuoto.runtime.checkpoint import load_state_dict_file
from mizuoto.text.files import read_utf8
from mizuoto.training import (
    Cadence,
    MetricsLog,
    Precision,
    RunDirectory,
    RunIdentity,
    StepLoop,
    StepProgress,
    base_fingerprint,
    data_fingerprint,
    micro_batches,
    process_world,
    rotate,
)

logger = logging.getLogger(__name__)

CHECKPOINT = "checkpoints/last.pt"
PARAMS = ("grad_accumulation", "keep_last_n_checkpoints", "checkpoint_every")


@attrs.frozen
class ToyRun:
    config: TrainingConfig
    model_dir: Path
    run_dir: RunDirectory
    slots: tuple[tuple[int, ...], ...]  # per clip: its characters' weight rows
    loudness: tuple[float, ...]  # per clip: its RMS
    accumulation: int
    keep: int
    every: int


class ToyTrainer(Trainer):
    engine = "toy"
    methods = frozenset({"full"})
    graceful_stop = True

    def defaults(self, method: str, model: str) -> dict:
        return {"steps": 100, "learning_rate": 1e-2, "batch_size": 2}

    def prepare(self, config: TrainingConfig, *, progress=None) -> ToyRun:
        self.check(config)
        unknown = sorted(set(config.params) - set(PARAMS))
        if unknown:
            raise InvalidRequest("params", f"unknown toy training settings: {unknown}",
                                 f"known: {', '.join(PARAMS)}")
        accumulation = config.params.get("grad_accumulation", 1)
        if isinstance(accumulation, bool) or not isinstance(accumulation, int) \
                or accumulation < 1:
            raise InvalidRequest("params.grad_accumulation", "must be an integer >= 1")
        keep, every = checkpoint_retention(config)
        model_dir = resolve_for_engine(config.model, self.engine).path
        vocab = json.loads((model_dir / CONFIG_FILE).read_text())["toy_vocab_size"]
        rows = _rows(Path(config.dataset))
        run_dir = RunDirectory(config.output_dir)
        run_dir.check_writable()
        run_dir.claim(RunIdentity(
            engine=self.engine, method=config.method, base_model=str(config.model),
            base_fingerprint=base_fingerprint([model_dir / WEIGHTS_FILE]),
            dataset=str(config.dataset), data_fingerprint=data_fingerprint(rows)),
            resumable=(run_dir.path / CHECKPOINT).is_file())
        run_dir.write_recipe({"engine": self.engine, "steps": config.steps,
                              "learning_rate": config.learning_rate,
                              "batch_size": config.batch_size, "seed": config.seed,
                              "save_every": config.save_every,
                              "grad_accumulation": accumulation,
                              "keep_last_n_checkpoints": keep, "checkpoint_every": every})
        slots, loudness = [], []
        for text, audio in rows:
            samples, _ = read_audio(audio, field="dataset")
            loudness.append(float(to_mono(samples).to(torch.float64).pow(2).mean().sqrt()))
            slots.append(tuple(ord(c) % vocab for c in text if not c.isspace()))
        return ToyRun(config, model_dir, run_dir, tuple(slots), tuple(loudness), accumulation,
                      keep, every)

    def train(self, run: ToyRun, *, progress=None) -> TrainingResult:
        config, world = run.config, process_world()
        weights = load_state_dict_file(run.model_dir / WEIGHTS_FILE)
        level = torch.nn.Parameter(weights["level"].to(torch.float32).clone())
        optimizer = torch.optim.Adam([level], lr=config.learning_rate)
        generator = torch.Generator().manual_seed(config.seed)
        precision = Precision()  # the toy has nothing to autocast; the hooks stay in place
        state_path = run.run_dir.path / CHECKPOINT
        start = 0
        if state_path.is_file():
            state = torch.load(state_path, weights_only=True)
            level.data.copy_(state["level"])
            optimizer.load_state_dict(state["optimizer"])
            generator.set_state(state["generator"])
            start = int(state["update"])

        def update() -> dict[str, float]:
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for _, skip_sync in micro_batches(run.accumulation):
                picks = torch.randint(len(run.slots), (config.batch_size,), generator=generator)
                with skip_sync, precision.autocast():
                    loss = torch.stack([
                        (level[list(run.slots[i])].mean() - run.loudness[i]) ** 2
                        for i in picks.tolist()]).mean() / run.accumulation
                precision.backward(loss)
                total += loss.item()
            precision.unscale(optimizer)
            precision.step(optimizer)
            return {"loss": total, "lr": optimizer.param_groups[0]["lr"]}

        def save(done: int) -> None:
            with atomic_path(state_path) as tmp:
                torch.save({"level": level.detach().clone(), "update": done,
                            "optimizer": optimizer.state_dict(),
                            "generator": generator.get_state()}, tmp)

        def numbered(done: int) -> None:
            loop.save_now()
            with atomic_path(state_path.parent / f"model_{done}.pt") as tmp:
                shutil.copyfile(state_path, tmp)
            rotate(state_path.parent, "model_", ".pt", keep=run.keep)

        metrics = MetricsLog(run.run_dir.path, resume_from=start) if world.main else None
        loop = StepLoop(start=start, total=config.steps, world=world, save=save,
                        numbered=numbered, metrics=metrics,
                        cadence=Cadence(config.save_every, run.every, run.keep),
                        progress=StepProgress(progress, config.steps, start))
        try:
            outcome = loop.run(update)
        finally:
            if metrics is not None:
                metrics.close()
        return TrainingResult(run.run_dir.path, outcome.done, start or None,
                              metrics=loop.values, interrupted=outcome.interrupted)

    def export(self, run: ToyRun, destination: Path) -> Path:
        """The base model with the trained levels, written beside and renamed into place."""
        destination = Path(destination)
        state = torch.load(run.run_dir.path / CHECKPOINT, weights_only=True)
        weights = load_state_dict_file(run.model_dir / WEIGHTS_FILE)
        staging = destination.with_name(f".{destination.name}.staging")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        save_file({"pitch": weights["pitch"], "level": state["level"]},
                  str(staging / WEIGHTS_FILE))
        shutil.copy2(run.model_dir / CONFIG_FILE, staging / CONFIG_FILE)
        shutil.rmtree(destination, ignore_errors=True)
        staging.rename(destination)
        return destination


def _rows(dataset: Path) -> list[tuple[str, Path]]:
    """``(text, audio path)`` of each usable manifest line; a bad line (not JSON, no text, a
    missing audio file) is skipped with a warning naming it."""
    if dataset.is_dir():
        found = sorted(dataset.glob("*.jsonl"))
        if len(found) != 1:
            raise InvalidRequest("dataset", f"{dataset} must hold one .jsonl manifest")
        dataset = found[0]
    rows = []
    for number, line in enumerate(read_utf8(dataset, "dataset").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            text, audio = item["text"], dataset.parent / item["audio"]
        except (ValueError, KeyError, TypeError):
            reason = 'not a JSON object with "audio" and "text"'
        else:
            reason = ("empty text" if not isinstance(text, str) or not text.strip()
                      else "" if audio.is_file() else f"no audio file {audio}")
        if reason:
            logger.warning("%s line %d skipped: %s", dataset, number, reason)
            continue
        rows.append((text, audio))
    if not rows:
        raise InvalidRequest("dataset", f"{dataset} has no usable rows")
    return rows
