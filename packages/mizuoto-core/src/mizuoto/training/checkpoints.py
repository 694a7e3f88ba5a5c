"""Numbered checkpoints: ``<prefix><N><suffix>`` files or folders beside the resumable one,
listed and rotated by their number (not by time, not by name: ``step_10`` sorts after
``step_9``), as upstream f5-tts rotates its ``model_<update>.pt`` saves.

``keep``: -1 keeps all, 0 none, N the newest N.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)


def numbered(directory: Path, prefix: str, suffix: str = "") -> list[tuple[int, Path]]:
    """``(number, path)`` of every ``<prefix><N><suffix>`` in ``directory``, by number."""
    found = []
    for path in Path(directory).glob(f"{prefix}*{suffix}"):
        middle = path.name[len(prefix):len(path.name) - len(suffix)]
        if middle.isdigit():
            found.append((int(middle), path))
    return sorted(found)


def rotate(directory: Path, prefix: str, suffix: str = "", *, keep: int) -> list[Path]:
    """Delete the oldest numbered checkpoints beyond the newest ``keep`` (-1: none deleted);
    returns the deleted paths."""
    if keep < 0:
        return []
    found = numbered(directory, prefix, suffix)
    removed = [path for _, path in found[:max(len(found) - keep, 0)]]
    for path in removed:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
        logger.info("removed old checkpoint %s", path.name)
    return removed
