"""A run directory: what a training run writes, and what it is a run *of*.

``identity.json`` records the run's identity: engine, method, the base model (as given and a
fingerprint of its weight files) and the data set (as given and a fingerprint of its rows:
every text and the bytes of every audio file, so that a moved but unchanged data set keeps its
identity). A run resumed in the same directory with another base model or other data would
train the first run's weights on the new inputs and export them under the new base's name:
`RunDirectory.claim` refuses that, naming what changed, before anything is written.
``recipe.json`` holds the run's effective recipe, every value the trainer applies, defaults
included. `check_writable` fails before training when the directory cannot hold the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from mizuoto.errors import InvalidRequest
from mizuoto.runtime.atomic import atomic_path
from mizuoto.runtime.checkpoint import weights_fingerprint

IDENTITY_FILE = "identity.json"
RECIPE_FILE = "recipe.json"
_BLOCK = 1 << 20


@attrs.frozen
class RunIdentity:
    engine: str
    method: str
    base_model: str
    base_fingerprint: str
    dataset: str
    data_fingerprint: str

    def changes(self, other: RunIdentity) -> list[str]:
        """What differs from ``other`` (the recorded run), in words."""
        found = []
        if (self.engine, self.method) != (other.engine, other.method):
            found.append(f"engine/method {other.engine}/{other.method} -> "
                         f"{self.engine}/{self.method}")
        if self.base_fingerprint != other.base_fingerprint:
            found.append(f"base model {other.base_model} (weights {other.base_fingerprint[:12]})"
                         f" -> {self.base_model} (weights {self.base_fingerprint[:12]})")
        if self.data_fingerprint != other.data_fingerprint:
            found.append(f"data set {other.dataset} (rows {other.data_fingerprint[:12]}) -> "
                         f"{self.dataset} (rows {self.data_fingerprint[:12]})")
        return found


def base_fingerprint(files: Iterable[str | Path]) -> str:
    """The base weights' identity (``weights_fingerprint``: names, sizes, first and last MiB)."""
    return weights_fingerprint(sorted(Path(f) for f in files))


def data_fingerprint(rows: Iterable[tuple[str, str | Path | None]]) -> str:
    """SHA-256 over the data set's rows in order: each text and its audio file's bytes (a
    missing file counts by its name)."""
    digest = hashlib.sha256()
    for text, audio in rows:
        digest.update(b"\0text\0" + text.encode("utf-8", "surrogatepass"))
        if audio is None:
            digest.update(b"\0no audio\0")
            continue
        path = Path(audio)
        if not path.is_file():
            digest.update(b"\0missing\0" + path.name.encode("utf-8", "surrogateescape"))
            continue
        digest.update(b"\0audio\0")
        with open(path, "rb") as handle:
            while block := handle.read(_BLOCK):
                digest.update(block)
    return digest.hexdigest()


class RunDirectory:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def samples(self) -> Path:
        return self.path / "samples"

    def check_writable(self, needed_bytes: int = 0) -> None:
        """Raise `InvalidRequest` (``output_dir``) if the directory cannot be written or lacks
        ``needed_bytes`` free."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / f".mizuoto-write-test-{os.getpid()}"
            probe.write_bytes(b"\0" * 4096)
            probe.unlink()
        except OSError as exc:
            raise InvalidRequest("output_dir", f"cannot write to {self.path}: "
                                 f"{exc.strerror or exc}",
                                 "choose a writable directory with free space") from exc
        free = shutil.disk_usage(self.path).free
        if free < needed_bytes:
            raise InvalidRequest("output_dir", f"{self.path} has {free / 2**20:.0f} MiB free; "
                                 f"the run's checkpoints need about {needed_bytes / 2**20:.0f} "
                                 "MiB", "free some space or choose another directory")

    def recorded_identity(self) -> RunIdentity | None:
        path = self.path / IDENTITY_FILE
        if not path.is_file():
            return None
        return RunIdentity(**json.loads(path.read_text(encoding="utf-8")))

    def claim(self, identity: RunIdentity, *, resumable: bool) -> None:
        """Record ``identity``; when the directory holds a resumable run (``resumable``) of
        another base model or data set, refuse with `InvalidRequest` naming both."""
        recorded = self.recorded_identity()
        if recorded is not None and resumable:
            changes = identity.changes(recorded)
            if changes:
                raise InvalidRequest(
                    "output_dir", f"{self.path} holds a run of another base model or data set: "
                    + "; ".join(changes),
                    "resume it with the base model and data it was started with, or train "
                    "into another directory")
        self.path.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.path / IDENTITY_FILE) as tmp:
            tmp.write_text(json.dumps(attrs.asdict(identity), indent=2), encoding="utf-8")

    def write_recipe(self, recipe: Mapping[str, Any], *, logger: str | None = None) -> Path:
        """``recipe.json``, with the ``logger`` the run writes (``params.logger``; None:
        ``tensorboard`` when the extra is installed, else ``none``; ``metrics.jsonl`` always)."""
        from mizuoto.training.metrics import tensorboard_available

        path = self.path / RECIPE_FILE
        if logger is None:
            logger = "tensorboard" if tensorboard_available() else "none"
        recipe = {**recipe, "logger": logger}
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(recipe, indent=2, default=str) + "\n",
                           encoding="utf-8")
        return path

    def pin_settings(self, settings: Mapping[str, Any], name: str = "run.json") -> Path:
        """Record in ``name`` the settings a resumed run must share with the one it resumes;
        when the directory already records others, refuse with `InvalidRequest`
        (``output_dir``)."""
        path = self.path / name
        if path.is_file() and json.loads(path.read_text(encoding="utf-8")) != settings:
            raise InvalidRequest("output_dir", f"{self.path} holds a run with other settings; "
                                 "use another directory")
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(settings, indent=2), encoding="utf-8")
        return path
