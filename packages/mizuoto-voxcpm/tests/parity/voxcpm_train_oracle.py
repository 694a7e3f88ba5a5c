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
import os
import sys
import time
import traceback
from pathlib import Path

import torch

# the test process's thread count (MIZUOTO_TEST_THREADS, one by default): the same kernels
torch.set_num_threads(int(os.environ.get("MIZUOTO_TEST_THREADS", "1")))


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
    script = _upstream_script()

    start = time.perf_counter()
    script.train(**config)
    log.write_text(json.dumps({"steps": records, "seconds": time.perf_counter() - start}),
                   encoding="utf-8")


def _upstream_script():
    sys.path.insert(0, str(Path(__file__).parent / "upstream"))
    import train_voxcpm_finetune as script

    return script


def _warm_imports() -> None:
    """What a run would import lazily (librosa and its numba kernels through the data set's
    audio decoding, torch's compiler through AdamW): loaded once, before the first fork."""
    import librosa
    import numpy as np
    import torch._dynamo  # noqa: F401
    from voxcpm.training.tracker import TrainingTracker  # noqa: F401

    _upstream_script()
    librosa.resample(np.zeros(2205, dtype=np.float32), orig_sr=22050, target_sr=16000)


def serve() -> None:
    """``python voxcpm_train_oracle.py --serve``: import upstream once, then run each config path
    read from stdin in a forked child, and answer ``RESULT <exit status>`` per line.

    A child starts from the parent's state (nothing trained yet), as a fresh process does,
    without paying upstream's imports (transformers, datasets, librosa, torch's compiler: 10 to
    20 s) for every case. The child's output goes to ``CONFIG.log``."""
    _warm_imports()
    for line in sys.stdin:
        config_path = line.strip()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with open(config_path + ".log", "w", encoding="utf-8") as log:
                    os.dup2(log.fileno(), 1)
                    os.dup2(log.fileno(), 2)
                    os.chdir(Path(config_path).parent)
                    main(config_path)
                    code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(f"RESULT {os.waitstatus_to_exitcode(status)}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve()
    else:
        main(sys.argv[1])
