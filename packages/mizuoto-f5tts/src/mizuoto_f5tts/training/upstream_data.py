"""Upstream's prepared F5-TTS data sets, read as its trainer reads them.

``prepare_csv_wavs.py`` (and upstream's other ``train/datasets/prepare_*.py``) writes a folder
holding ``raw.arrow`` (an Arrow IPC stream, ``datasets``' ``ArrowWriter``: one row per clip,
``audio_path``, ``text`` as the converted tokens, ``duration`` in seconds), ``duration.json``
(``{"duration": [...]}``, the durations the batch sampler packs by) and ``vocab.txt``, often
with the ``metadata.csv`` it came from beside them. Upstream's trainer opens it with
``datasets.Dataset.from_file(raw.arrow)`` and ``CustomDataset(..., durations)``.

- `prepared_folder(path) -> Path | None`: the folder when ``path`` is such a folder (or its
  ``raw.arrow``); None otherwise. A folder holding both ``raw.arrow`` and ``metadata.csv`` is
  read through ``raw.arrow``: the rows, tokens and durations upstream would train on.
- `read_rows(folder) -> list[PreparedRow]`: the rows in order, with ``duration.json``'s
  duration for batching and the row's own for the length check (upstream's ``CustomDataset``
  checks ``row["duration"]``). Relative audio paths are taken relative to the folder.

Reading ``raw.arrow`` needs ``pyarrow``, the optional extra ``mizuoto-f5tts[arrow]``
(`ArrowUnavailable` otherwise, exit code 3).
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from mizuoto.errors import InvalidRequest, MizuotoError

RAW_ARROW = "raw.arrow"
DURATIONS = "duration.json"


class ArrowUnavailable(MizuotoError, ImportError):
    """An upstream prepared data set was given but pyarrow is not installed."""

    exit_code = 3

    def __init__(self, path: Path) -> None:
        super().__init__(f"{path} is upstream's prepared data set (raw.arrow); reading it needs "
                         "pyarrow: pip install 'mizuoto-f5tts[arrow]' (or pass the metadata.csv "
                         "it was prepared from)")


@attrs.frozen
class PreparedRow:
    """One row of ``raw.arrow``: ``number`` counts from 1."""

    number: int
    audio: str
    tokens: tuple[str, ...] = attrs.field(converter=tuple)
    row_duration: float
    duration: float


def prepared_folder(path: str | Path) -> Path | None:
    path = Path(path)
    folder = path.parent if path.name == RAW_ARROW and path.is_file() else path
    if folder.is_dir() and (folder / RAW_ARROW).is_file():
        return folder
    return None


def _read_table(path: Path):
    try:
        import pyarrow as pa
    except ImportError:
        raise ArrowUnavailable(path.parent) from None
    try:
        # datasets' Dataset.from_file: a memory-mapped IPC stream
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_stream(source).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise InvalidRequest("dataset", f"{path} is not an Arrow stream: {exc}",
                             "prepare it again with upstream's prepare_csv_wavs.py") from exc


def _durations(folder: Path, rows: int) -> list[float]:
    path = folder / DURATIONS
    if not path.is_file():
        raise InvalidRequest("dataset", f"{folder} holds {RAW_ARROW} but no {DURATIONS}",
                             "upstream's prepare_csv_wavs.py writes both; prepare it again")
    try:
        durations = json.loads(path.read_text(encoding="utf-8"))["duration"]
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidRequest("dataset", f"{path} is not {{\"duration\": [seconds, ...]}}: {exc}"
                             ) from exc
    if not isinstance(durations, list) or len(durations) != rows or not all(
            isinstance(d, (int, float)) and not isinstance(d, bool) for d in durations):
        raise InvalidRequest("dataset", f"{path} must list one duration in seconds per row of "
                             f"{RAW_ARROW} ({rows} rows)", "prepare the folder again")
    return [float(d) for d in durations]


def read_rows(folder: str | Path) -> list[PreparedRow]:
    folder = Path(folder)
    table = _read_table(folder / RAW_ARROW)
    missing = sorted({"audio_path", "text", "duration"} - set(table.column_names))
    if missing:
        raise InvalidRequest("dataset", f"{folder / RAW_ARROW} lacks the column(s) "
                             f"{', '.join(missing)} that upstream's CustomDataset reads")
    durations = _durations(folder, table.num_rows)
    rows = []
    columns = zip(table.column("audio_path").to_pylist(), table.column("text").to_pylist(),
                  table.column("duration").to_pylist(), durations, strict=True)
    for number, (audio, text, row_duration, duration) in enumerate(columns, start=1):
        audio = str(audio or "")
        if audio and not Path(audio).is_absolute():
            audio = str((folder / audio).resolve())
        # a str (upstream's other preparers) is iterated character by character, as its
        # list_str_to_idx does
        tokens = list(text) if isinstance(text, (str, list)) else []
        rows.append(PreparedRow(number, audio, tokens,
                                float(row_duration) if row_duration is not None else -1.0,
                                duration))
    return rows
