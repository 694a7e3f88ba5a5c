"""Reading a training data set in the contract's formats: a JSONL manifest (one object per
line, ``{"audio": path, "text": ...}``, paths relative to the manifest's folder or absolute)
or upstream's ``metadata.csv`` (``|``-delimited, header ``audio_file|text``), or a folder
holding exactly one of them (`find_manifest`; `find_manifests`: also a validation manifest
beside the training one).

A bad row (not JSON, no text, a missing audio file) is skipped with a warning naming its line,
as the contract suite expects; a data set with no usable row is refused.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import attrs

from mizuoto.errors import InvalidRequest
from mizuoto.json_files import JSONFileError, parse_json
from mizuoto.text.files import read_utf8

logger = logging.getLogger(__name__)

METADATA_CSV = "metadata.csv"
CSV_HEADER = ("audio_file", "text")


@attrs.frozen
class ManifestRow:
    """One usable row: its audio file, its text, its line in the manifest and, for JSONL,
    the row's other keys (``duration``, ``ref_audio``, ...)."""

    audio: Path
    text: str
    line: int
    extra: dict[str, Any] = attrs.field(factory=dict)


def find_manifest(dataset: str | Path, *, field: str = "dataset") -> Path:
    """The manifest file ``dataset`` names: itself, or the one ``.jsonl`` / ``metadata.csv``
    in the folder it names."""
    dataset = Path(dataset)
    if not dataset.is_dir():
        if not dataset.is_file():
            raise InvalidRequest(field, f"{dataset} does not exist",
                                 "pass a .jsonl manifest, a metadata.csv or a folder holding one")
        return dataset
    found = sorted(dataset.glob("*.jsonl")) + sorted(dataset.glob(METADATA_CSV))
    if len(found) != 1:
        named = ", ".join(p.name for p in found) or "none"
        raise InvalidRequest(field, f"{dataset} must hold exactly one .jsonl manifest or "
                             f"{METADATA_CSV} (found: {named})",
                             "name the manifest file itself")
    return found[0]


VALIDATION_PREFIXES = ("val", "valid", "validation", "dev", "eval")


def find_manifests(dataset: str | Path, *, field: str = "dataset") -> tuple[Path, Path | None]:
    """The training manifest ``dataset`` names, and the validation manifest beside it: a file
    is itself (no validation); a folder holds one ``.jsonl`` (or, without one, a
    ``metadata.csv``), or a ``train*.jsonl`` and at most one ``val*``/``valid*``/``dev*``/
    ``eval*`` ``.jsonl`` beside it."""
    dataset = Path(dataset)
    if dataset.is_dir():
        candidates = sorted(dataset.glob("*.jsonl"))
        if len(candidates) == 1:
            return candidates[0], None
        if not candidates and (dataset / METADATA_CSV).is_file():
            return dataset / METADATA_CSV, None
        train = [p for p in candidates if p.stem.lower().startswith("train")]
        val = [p for p in candidates if p.stem.lower().startswith(VALIDATION_PREFIXES)]
        if len(train) == 1 and len(val) <= 1 and len(train) + len(val) == len(candidates):
            return train[0], (val[0] if val else None)
        found = ", ".join(p.name for p in candidates) or "none"
        raise InvalidRequest(field, f"{dataset} must hold one .jsonl manifest, or a train*.jsonl "
                             f"and a val*.jsonl, or a {METADATA_CSV} (found {found})",
                             "or pass the manifest itself")
    if not dataset.is_file():
        raise InvalidRequest(field, f"{dataset} does not exist")
    return dataset, None


def read_manifest(dataset: str | Path, *, field: str = "dataset") -> list[ManifestRow]:
    """The usable rows of the data set ``dataset`` names (see the module's docstring)."""
    path = find_manifest(dataset, field=field)
    lines = read_utf8(path, field).splitlines()
    is_csv = path.suffix.lower() == ".csv"
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if is_csv:
            cells = tuple(cell.strip() for cell in line.split("|", 1))
            if number == 1 and cells == CSV_HEADER:
                continue
            row, reason = _csv_row(path, cells, number)
        else:
            row, reason = _json_row(path, line, number)
        if row is None:
            logger.warning("%s line %d skipped: %s", path, number, reason)
            continue
        rows.append(row)
    if not rows:
        raise InvalidRequest(field, f"{path} has no usable rows",
                             'each line: {"audio": "clip.wav", "text": "..."} (JSONL) or '
                             "clip.wav|text (metadata.csv)")
    return rows


def _csv_row(path: Path, cells: tuple[str, ...], number: int
             ) -> tuple[ManifestRow | None, str]:
    if len(cells) != 2:
        return None, "not audio_file|text"
    return _checked(path, cells[0], cells[1], number, {})


def _json_row(path: Path, line: str, number: int) -> tuple[ManifestRow | None, str]:
    try:
        item = parse_json(line, "the line")
    except JSONFileError as exc:  # nesting, a huge integer, a key given twice, not an object
        return None, str(exc)
    try:
        audio, text = item["audio"], item["text"]
    except KeyError:
        return None, 'not a JSON object with "audio" and "text"'
    if not isinstance(audio, str):
        return None, '"audio" is not a path'
    extra = {key: value for key, value in item.items() if key not in ("audio", "text")}
    return _checked(path, audio, text, number, extra)


def _checked(path: Path, audio: str, text: Any, number: int, extra: dict[str, Any]
             ) -> tuple[ManifestRow | None, str]:
    if not isinstance(text, str) or not text.strip():
        return None, "empty text"
    audio_path = path.parent / audio  # an absolute path stays itself
    if not audio_path.is_file():
        return None, f"no audio file {audio_path}"
    return ManifestRow(audio_path, text, number, extra), ""
