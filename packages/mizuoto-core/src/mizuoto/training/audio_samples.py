"""Audio a trainer speaks while it trains (samples at checkpoints, after a validation),
written where a user listens to it: WAV files in the run directory and, when the metrics log
writes TensorBoard events, the same audio there. `sampling(model)` is the context a sample is
made in, so that making it leaves the run's bytes alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from mizuoto.runtime.atomic import atomic_path


def write_audio_samples(directory: str | Path, clips: Sequence[tuple[str, np.ndarray, str]],
                        rate: int, *, step: int, metrics=None) -> list[Path]:
    """Each ``(name, audio, tag)`` of ``clips`` as ``<directory>/<name>.wav`` (32-bit float,
    written atomically) and, with ``metrics`` (a `MetricsLog`), as TensorBoard audio ``tag``
    at ``step``; returns the files' paths."""
    import soundfile as sf

    paths = []
    for name, audio, tag in clips:
        path = Path(directory) / f"{name}.wav"
        with atomic_path(path) as tmp:
            sf.write(tmp, audio, rate, format="WAV", subtype="FLOAT")
        if metrics is not None:
            metrics.audio(tag, audio, step, rate)
        paths.append(path)
    return paths


@contextlib.contextmanager
def sampling(model) -> Iterator[object]:
    """For the block: torch's generators forked (the CPU's and, on CUDA, ``model``'s device's),
    inference mode; ``model``'s training mode restored after. Yields ``model``'s device. A
    sample drawn inside draws no number of the run's generators."""
    import torch

    training = model.training
    device = next(model.parameters()).device
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), \
                torch.inference_mode():
            yield device
    finally:
        model.train(training)
