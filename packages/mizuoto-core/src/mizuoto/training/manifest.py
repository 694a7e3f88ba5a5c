"""Reading a training data set in the contract's formats: a JSONL manifest (one object per
line, ``{"audio": path, "text": ...}``, paths relative to the manifest's folder or absolute)
or upstream's ``metadata.csv`` (``|``-delimited, header ``audio_file|text``), or a folder
holding exactly one of them (`find_manifest`; `find_manifests`: also a validation manifest
beside the training one).

`read_manifest_rows(path, ...)` is the one row reader every trainer calls: each line becomes
a `ManifestRow` or a `RejectedRow` naming why (not JSON, no audio path, empty text, a missing
or non-regular audio file, an unusable typed extra), in line order. A trainer keeps only what
is its own on top of it (tokenizing, its length filters, its batches); `read_manifest` is the
plain form: the usable rows, each bad one skipped with a warning naming its line, as the
contract suite expects; a data set with no usable row is refused.

Typed extras (``typed_extras=True``): ``"duration"`` and ``"ref_duration"`` (seconds declared
for a length estimate: numbers or numeric strings read with ``float``; null is absent),
``"ref_audio"`` (a recording of the voice, resolved like ``"audio"``) and ``"is_prompt"``
(JSON booleans or 0/1; a string such as ``"false"`` is refused rather than read as Python's
``bool()`` would). A row whose value is unusable is rejected naming the key.

Audio checks a trainer runs once it decodes a clip: `refused_samples` (no samples, NaN or
infinite, silent) and `read_audio_like_datasets` (``datasets.Audio``'s decode).
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import numpy as np

from mizuoto.errors import InvalidRequest
from mizuoto.json_files import JSONFileError, parse_json
from mizuoto.regular_files import NotARegularFile, check_regular
from mizuoto.text.files import check_utf8, read_utf8
from mizuoto.training.audio_header import AudioHeader, read_header
from mizuoto.validation.audio import SILENCE_PEAK

logger = logging.getLogger(__name__)

METADATA_CSV = "metadata.csv"
CSV_HEADER = ("audio_file", "text")


@attrs.frozen
class ManifestRow:
    """One usable row: its audio file, its text, its line in the manifest, for JSONL the
    row's other keys (``extra``) and, read with ``typed_extras``, the typed extras."""

    audio: Path
    text: str
    line: int
    extra: dict[str, Any] = attrs.field(factory=dict)
    #: declared seconds (None: not given)
    duration: float | None = attrs.field(default=None, kw_only=True)
    ref_duration: float | None = attrs.field(default=None, kw_only=True)
    #: the voice's reference recording, resolved like ``audio`` (None: not given)
    ref_audio: Path | None = attrs.field(default=None, kw_only=True)
    is_prompt: bool = attrs.field(default=False, kw_only=True)
    #: the audio files' headers, read with ``headers`` (None otherwise)
    header: AudioHeader | None = attrs.field(default=None, kw_only=True, eq=False)
    ref_header: AudioHeader | None = attrs.field(default=None, kw_only=True, eq=False)


@attrs.frozen
class RejectedRow:
    """A row left out: its line, why, and its audio path when it names one."""

    line: int
    reason: str
    audio: str = ""


@attrs.frozen
class ManifestRows:
    """A manifest read: each line's row or rejection, in line order, and ``columns``: every key
    a row holds (the columns of upstream's ``datasets`` table, None on a row without one)."""

    path: Path
    entries: tuple[ManifestRow | RejectedRow, ...] = attrs.field(converter=tuple)
    columns: frozenset[str] = frozenset()

    @property
    def rows(self) -> list[ManifestRow]:
        return [entry for entry in self.entries if isinstance(entry, ManifestRow)]

    @property
    def rejected(self) -> list[RejectedRow]:
        return [entry for entry in self.entries if isinstance(entry, RejectedRow)]


def find_manifest(dataset: str | Path, *, field: str = "dataset",
                  metadata_csv_first: bool = False) -> Path:
    """The manifest file ``dataset`` names: itself, or the one ``.jsonl`` / ``metadata.csv``
    in the folder it names (with ``metadata_csv_first``, its ``metadata.csv`` whatever else it
    holds, as upstream F5-TTS's ``prepare_csv_wavs.py`` reads a folder)."""
    dataset = Path(dataset)
    if not dataset.is_dir():
        if not dataset.is_file():
            raise InvalidRequest(field, f"{dataset} does not exist",
                                 "pass a .jsonl manifest, a metadata.csv or a folder holding one")
        return dataset
    if metadata_csv_first and (dataset / METADATA_CSV).is_file():
        return dataset / METADATA_CSV
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


def usable_rows(samples: list, rejected: Sequence[RejectedRow], source: Path, *, field: str,
                batch_size: int | None = None) -> list:
    """``samples`` (a trainer's usable rows of ``source``), each of ``rejected`` logged by line;
    none (with ``batch_size``: fewer than one batch) refused by ``field``, naming the first
    reason a row was skipped."""
    for item in rejected:
        logger.warning("%s line %d skipped: %s", source, item.line, item.reason)
    skipped = f"; skipped: {rejected[0].reason}" if rejected else ""
    if batch_size is not None and len(samples) < batch_size:
        raise InvalidRequest(field, f"{len(samples)} usable rows in {source}, fewer than one "
                             f"batch of {batch_size}{skipped}",
                             f"pass --batch-size {max(len(samples), 1)} or less, or add rows")
    if not samples:
        raise InvalidRequest(field, f"no usable rows in {source}{skipped}")
    return samples


def read_manifest(dataset: str | Path, *, field: str = "dataset") -> list[ManifestRow]:
    """The usable rows of the data set ``dataset`` names, each bad row skipped with a warning
    naming its line (see the module's docstring)."""
    path = find_manifest(dataset, field=field)
    read = read_manifest_rows(path, field=field)
    for rejected in read.rejected:
        logger.warning("%s line %d skipped: %s", path, rejected.line, rejected.reason)
    if not read.rows:
        raise InvalidRequest(field, f"{path} has no usable rows",
                             'each line: {"audio": "clip.wav", "text": "..."} (JSONL) or '
                             "clip.wav|text (metadata.csv)")
    return read.rows


def read_manifest_rows(path: str | Path, *,
                       csv_dialect: Literal["first_pipe", "csv_module"] = "first_pipe",
                       audio_keys: Sequence[str] = ("audio",), typed_extras: bool = False,
                       headers: bool = False, field: str = "dataset") -> ManifestRows:
    """Every row of the manifest file ``path`` (JSONL, or ``.csv``), usable or rejected, in
    line order. A ``.csv`` is read by ``csv_dialect``: ``"first_pipe"`` splits each line at
    its first ``|`` (the header optional); ``"csv_module"`` is upstream F5-TTS's reader
    (``csv.reader``, quotes honoured, the header required). ``audio_keys``: the JSON keys that
    may name the audio, first found wins; ``typed_extras``: read (and check) the typed extras
    of the module's docstring; ``headers``: read each audio file's header (refusing a file
    soundfile cannot read, without decoding it) into the row. A file that is not UTF-8
    raises `InvalidRequest` for ``field``."""
    if csv_dialect not in ("first_pipe", "csv_module"):
        raise ValueError(f"csv_dialect must be 'first_pipe' or 'csv_module', not {csv_dialect!r}")
    path = Path(path)
    if path.suffix.lower() != ".csv":
        items = _json_items(read_utf8(path, field).split("\n"))
    elif csv_dialect == "csv_module":
        check_utf8(path, field)
        items = _csv_module_items(path, field)
    else:
        items = _first_pipe_items(read_utf8(path, field).split("\n"))
    entries, columns = [], set()
    for number, item in items:
        if isinstance(item, str):
            entries.append(RejectedRow(number, item))
            continue
        columns.update(item)
        entries.append(manifest_row(number, item, path.parent, audio_keys=audio_keys,
                                    typed_extras=typed_extras, headers=headers))
    return ManifestRows(path, entries, frozenset(columns))


def manifest_row(number: int, item: dict[str, Any], folder: Path, *,
                 audio_keys: Sequence[str] = ("audio",), typed_extras: bool = False,
                 headers: bool = False) -> ManifestRow | RejectedRow:
    """The row ``item`` (line ``number``, paths relative to ``folder``) checked in this order:
    an audio path, a text, the typed extras, then each audio file (``audio``, ``ref_audio``):
    a regular file and, with ``headers``, a readable header (`read_header`)."""
    audio = next((item[key] for key in audio_keys if key in item), None)
    if not isinstance(audio, str) or not audio.strip():
        return RejectedRow(number, "no audio path")
    path = folder / audio  # an absolute path stays itself
    text = item.get("text")
    if not isinstance(text, str) or not text.strip():
        return RejectedRow(number, "empty text", str(path))
    typed = _typed_extras(item, folder) if typed_extras else {}
    if isinstance(typed, str):
        return RejectedRow(number, typed, str(path))
    found = {}
    for which, key, file in (("", "header", path),
                             ("ref_audio: ", "ref_header", typed.get("ref_audio"))):
        problem = "" if file is None else _file_problem(file)
        if file is not None and not problem and headers:
            found[key] = read_header(file)
            problem = f"{found[key]} ({file})" if isinstance(found[key], str) else ""
        if problem:
            return RejectedRow(number, which + problem, str(path))
    extra = {key: value for key, value in item.items() if key not in (*audio_keys, "text")}
    return ManifestRow(path, text, number, extra, **typed, **found)


def _json_items(lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any] | str]]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:  # bounded nesting and integers; a key given twice (two "audio"s) refused
            yield number, parse_json(line, "the line")
        except JSONFileError as exc:
            yield number, str(exc)


def _first_pipe_items(lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any] | str]]:
    for number, line in enumerate(lines, start=1):
        cells = tuple(cell.strip() for cell in line.split("|", 1))
        if not line.strip() or (number == 1 and cells == CSV_HEADER):
            continue
        yield number, (dict(zip(("audio", "text"), cells, strict=True)) if len(cells) == 2
                       else "not audio_file|text")


def _csv_module_items(path: Path, field: str) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """Upstream F5-TTS's reader (``csv.reader``, ``|``, a BOM dropped), row by row: a row it
    cannot take (a field over ``csv.field_size_limit``, 131072 characters) and a quoted text
    running over a line end (an unbalanced quote swallowing the rows after it) are rejected."""
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle, delimiter="|")
        header = next(reader, None)
        if header is None or len(header) < 2 or tuple(h.strip() for h in header[:2]) != CSV_HEADER:
            raise InvalidRequest(field, f"{path}: the header must be audio_file|text",
                                 "write upstream's metadata.csv layout: audio_file|text")
        while True:
            first = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield first, f"unreadable row: {exc}"
                continue
            if not row or not "".join(row).strip():
                continue
            if reader.line_num != first:
                yield first, (f"a quoted field runs over lines {first}-{reader.line_num} "
                              "(an unbalanced quote?)")
                continue
            yield first, {"audio": row[0].strip(), "text": row[1].strip() if len(row) > 1 else ""}


def _typed_extras(item: dict[str, Any], folder: Path) -> dict[str, Any] | str:
    """The row's typed extras, or why one is unusable (the first of the durations, the prompt
    flag, then the reference's path)."""
    typed: dict[str, Any] = {key: _declared_seconds(item, key)
                             for key in ("duration", "ref_duration")}
    typed["is_prompt"] = _prompt_flag(item)
    bad = [value for value in typed.values() if isinstance(value, str)]
    if bad:
        return bad[0]
    reference = item.get("ref_audio")
    if reference is not None and not isinstance(reference, str):
        return '"ref_audio" must be a path'
    return {**typed, "ref_audio": None if reference is None else folder / reference}


def _declared_seconds(item: dict[str, Any], key: str) -> float | None | str:
    """The row's declared ``key`` in seconds (None when absent or null), or why it is unusable.
    Numbers and numeric strings are read with ``float`` as upstream VoxCPM reads them."""
    value = item.get(key)
    if value is None:
        return None
    seconds = math.nan
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except (ValueError, OverflowError):
            pass
    if not math.isfinite(seconds) or seconds < 0:
        return f'"{key}" must be a non-negative number of seconds, not {json.dumps(value)[:40]}'
    return seconds


def _prompt_flag(item: dict[str, Any]) -> bool | str:
    """The row's ``is_prompt`` (False when absent or null), or why it is unusable: JSON
    booleans and the integers 0 and 1, which upstream's ``bool()`` reads as the same flag.
    Other values are refused rather than read as upstream would (``bool("false")`` is True)."""
    value = item.get("is_prompt")
    if value is None:
        return False
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    return f'"is_prompt" must be true or false, not {json.dumps(value)[:40]}'


def _file_problem(path: Path) -> str:
    """Why ``path`` cannot be a clip's audio file (missing, a folder, a device, a kernel
    file, a NUL in its name), or ``""``."""
    try:
        check_regular(path)
    except NotARegularFile as exc:
        return str(exc)
    except ValueError as exc:  # a NUL in the path
        return f"unusable audio path {str(path)!r}: {exc}"
    except OSError as exc:
        why = "not found" if isinstance(exc, FileNotFoundError) else exc.strerror
        return f"no audio file {path} ({why})"
    return ""


def refused_samples(samples: np.ndarray) -> str:
    """Why a decoded clip is refused for training (no samples, NaN or infinite samples,
    silent: no sample above ``SILENCE_PEAK``), or ``""``."""
    if samples.size == 0:
        return "no samples"
    if not np.isfinite(samples).all():
        return "NaN or infinite samples"
    if not float(np.abs(samples).max()) > SILENCE_PEAK:
        return "silent"
    return ""


def read_audio_like_datasets(path: str | Path, sample_rate: int) -> np.ndarray:
    """Mono float64 samples at ``sample_rate``, as ``datasets.Audio(sampling_rate=...)``
    decodes them: soundfile float64, channels averaged as ``librosa.to_mono``,
    ``librosa.resample`` (soxr HQ) when the rate differs."""
    import soundfile as sf

    from mizuoto.nn.dsp.soxr_resample import mono_like_librosa, resample_soxr

    array, rate = sf.read(str(path))
    array = mono_like_librosa(array.T)
    if rate != sample_rate:
        array = resample_soxr(array, rate, sample_rate, "HQ")  # librosa's default soxr_hq
    return array


def usable_audio(path: str | Path, sample_rate: int, which: str = "") -> np.ndarray | str:
    """The clip as `read_audio_like_datasets` decodes it, or why it is unusable (unreadable,
    or `refused_samples`), prefixed by ``which`` (e.g. ``"ref_audio: "``)."""
    try:
        audio = read_audio_like_datasets(path, sample_rate)
    except Exception as exc:  # soundfile/librosa raise many types for unreadable files
        return f"{which}unreadable audio {path}: {exc}"
    refused = refused_samples(audio)
    return f"{which}{refused} ({path})" if refused else audio
