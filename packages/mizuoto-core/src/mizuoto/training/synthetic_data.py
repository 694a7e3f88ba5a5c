"""A synthetic training data set for tests: deterministic 16-bit clips (harmonic tones with
noise, 0.5-1.6 s: not speech) and their ``metadata.csv`` (``audio_file|text``, relative
paths), the layout every trainer reads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

METADATA_CSV = "metadata.csv"

_SENTENCES = (
    "Hello there.", "The quick brown fox jumps.", "A calm and quiet day.",
    "Numbers like one, two and three.", "Speak softly, please.", "Where is the train?",
    "It rains in the morning.", "Good night and sleep well.",
)


def write_synthetic_dataset(directory: str | Path, count: int = 6, seed: int = 0,
                            sample_rate: int = 24000) -> Path:
    """Deterministic tone clips (0.5-1.6 s, not speech) and ``metadata.csv`` with relative
    paths; returns the ``metadata.csv`` path."""
    import soundfile as sf

    directory = Path(directory)
    (directory / "wavs").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lines = ["audio_file|text"]
    for index in range(count):
        seconds = 0.5 + 1.1 * ((index * 7 + seed) % count) / max(count - 1, 1)
        t = np.arange(int(seconds * sample_rate)) / sample_rate
        pitch = 110.0 + 40.0 * index
        wave = sum(np.sin(2 * np.pi * pitch * k * t) / k for k in range(1, 6))
        wave = wave * (0.5 + 0.5 * np.sin(2 * np.pi * 3.0 * t)) * 0.2
        wave = wave + 0.01 * rng.standard_normal(t.shape)
        name = f"wavs/clip_{index:03d}.wav"
        sf.write(directory / name, wave.astype(np.float32), sample_rate, subtype="PCM_16")
        lines.append(f"{name}|{_SENTENCES[index % len(_SENTENCES)]}")
    csv_path = directory / METADATA_CSV
    csv_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return csv_path
