"""Upstream voxcpm 2.0.3's fine-tuning script, run offline as the training oracle.

``python voxcpm_train_oracle.py CONFIG.json``: the JSON holds the script's ``train(**yaml)``
arguments (what a ``conf/<model>/*.yaml`` recipe holds) plus ``"log"``, where this writes every
``TrainingTracker.log_metrics`` call at full precision (``loss/diff``, ``loss/stop``, ``lr``,
``epoch``, ``grad_norm``; with validation on, ``loss/total``, ``loss/diff``, ``loss/stop`` of
split ``val``), each with its step, split and the time it was logged, and the loop's seconds.
The script itself (``upstream/train_voxcpm_finetune.py``) is vendored unchanged from the
GitHub tag; checkpoints land in ``save_path`` as it writes them (``step_<N>/``, ``latest/``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(1)


def main(config_path: str) -> None:
    from voxcpm.training.tracker import TrainingTracker

    config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    log = Path(config.pop("log"))
    records = []
    original = TrainingTracker.log_metrics

    def log_metrics(self, metrics, split):
        records.append({"step": self.step, "split": split, "time": time.perf_counter(),
                        **{key: float(value) for key, value in metrics.items()}})
        return original(self, metrics, split)

    TrainingTracker.log_metrics = log_metrics
    sys.path.insert(0, str(Path(__file__).parent / "upstream"))
    import train_voxcpm_finetune as script

    start = time.perf_counter()
    script.train(**config)
    log.write_text(json.dumps({"steps": records, "seconds": time.perf_counter() - start}),
                   encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
