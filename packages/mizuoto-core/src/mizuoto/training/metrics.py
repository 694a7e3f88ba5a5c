"""A run's metrics: one JSON line per logged step in ``metrics.jsonl`` (always), and TensorBoard
event files under ``tensorboard/`` when the ``tensorboard`` package is installed (the optional
extra ``mizuoto-core[tensorboard]``): scalars per step, and audio samples.

A resumed run first drops the lines of steps at or after the one it resumes from (they are
logged again, with the same values), so the file always reads as one uninterrupted run; the
TensorBoard writer is opened with ``purge_step`` for the same reason.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mizuoto.runtime.atomic import atomic_path

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def tensorboard_available() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics file (none when it does not exist)."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


class MetricsLog:
    """Appends a run's metrics. ``step_key``: the name of the step field of each row
    (``step``, or ``update`` where an engine counts updates). ``tensorboard``: None writes
    event files when the package is installed, False never, True requires it."""

    def __init__(self, run_dir: Path, *, filename: str = METRICS_FILE, step_key: str = "step",
                 tensorboard: bool | None = None, resume_from: int | None = None) -> None:
        self.path = Path(run_dir) / filename
        self.step_key = step_key
        self.rows = read_metrics(self.path)
        if resume_from is not None or self.rows:
            start = resume_from or 0
            self.rows = [row for row in self.rows if row[step_key] < start]
            self._rewrite()
        self.writer = None
        if tensorboard is None:
            tensorboard = tensorboard_available()
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(run_dir) / TENSORBOARD_DIR),
                                        purge_step=resume_from)

    def _rewrite(self) -> None:
        with atomic_path(self.path) as tmp:
            tmp.write_text("".join(json.dumps(row) + "\n" for row in self.rows),
                           encoding="utf-8")

    def log(self, step: int, values: Mapping[str, float]) -> None:
        row = {self.step_key: step, **values}
        self.rows.append(row)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
        if self.writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.writer.add_scalar(key, value, step)

    def audio(self, tag: str, samples, step: int, sample_rate: int) -> None:
        """An audio sample in TensorBoard (the files are the trainer's to write)."""
        if self.writer is not None:
            import torch

            self.writer.add_audio(tag, torch.as_tensor(samples).float().reshape(1, -1), step,
                                  sample_rate=sample_rate)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def last(self) -> dict[str, Any]:
        return self.rows[-1] if self.rows else {}

    def newest(self) -> dict[str, Any]:
        """The newest value of each metric across the rows (the step left out): a run's
        final metrics, those logged only now and then (a validation's) included."""
        newest: dict[str, Any] = {}
        for row in self.rows:
            newest.update(row)
        newest.pop(self.step_key, None)
        return newest
