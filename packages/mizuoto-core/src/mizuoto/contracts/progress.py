"""Progress reporting: long work calls a callback; the CLI turns it into a bar."""

from __future__ import annotations

from collections.abc import Callable

import attrs


@attrs.frozen
class Progress:
    stage: str  # e.g. "sampling", "decoding", "download", "chunk"
    done: int
    total: int | None = None
    detail: str = ""


ProgressCallback = Callable[[Progress], None]


def report(callback: ProgressCallback | None, stage: str, done: int, total: int | None = None,
           detail: str = "") -> None:
    if callback is not None:
        callback(Progress(stage, done, total, detail))
