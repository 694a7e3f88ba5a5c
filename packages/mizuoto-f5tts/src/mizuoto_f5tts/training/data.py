"""Preparing a fine-tuning data set, as upstream's ``prepare_csv_wavs.py`` does, with row checks.

`prepare_dataset(source, vocab, destination=None, *, progress=None) -> PreparedData` reads
``source``:

- upstream's ``metadata.csv`` (``|``-delimited, header ``audio_file|text``; paths relative to
  the file's folder or absolute), or a directory holding one;
- a JSONL manifest: one ``{"audio": path, "text": ...}`` object per line (``audio_file`` is
  accepted for ``audio``; relative paths are relative to the manifest's folder);
- upstream's prepared folder (``raw.arrow`` + ``duration.json``, or its ``raw.arrow``; read
  first when ``metadata.csv`` lies beside them), `mizuoto_f5tts.training.upstream_data`: its
  tokens as they are, ``duration.json``'s durations for batching, the row's own duration for the
  length check, as upstream's ``CustomDataset``; needs ``mizuoto-f5tts[arrow]``.

Each row is checked; a bad one is reported (`BadRow`: row number, path, reason) and skipped,
never fatal: unreadable or missing audio, silence, a duration outside [0.3, 30] s (upstream's
loader would silently train on the next row instead), empty text, or tokens outside the model's
vocabulary (upstream would map them to the space). Text becomes tokens as upstream's
``convert_char_to_pinyin`` (polyphone) does; the duration is ``soundfile.info(path).duration``,
the value upstream's ``duration.json`` holds (``vocab=None`` accepts every token: the caller
extends the vocabulary). With ``destination`` the result is written there
as ``manifest.jsonl`` + ``report.json`` (atomically) and can be read back with `read_prepared`.

(Synthetic clips for tests: core's `mizuoto.training.synthetic_data`.)
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Mapping
from pathlib import Path

import attrs
import numpy as np

from mizuoto.contracts.progress import ProgressCallback, report
from mizuoto.errors import InvalidRequest
from mizuoto.json_files import JSONFileError, parse_json
from mizuoto.runtime.atomic import atomic_path
from mizuoto.text.files import check_utf8
from mizuoto.training.audio_header import read_header

logger = logging.getLogger(__name__)

MIN_SECONDS = 0.3
MAX_SECONDS = 30.0
METADATA_CSV = "metadata.csv"
MANIFEST = "manifest.jsonl"
REPORT = "report.json"
_SILENCE_PEAK = 1e-4


@attrs.frozen
class Clip:
    """One usable row: the audio file, its text, model tokens and duration in seconds."""

    audio: str
    text: str
    tokens: tuple[str, ...] = attrs.field(converter=tuple)
    duration: float


@attrs.frozen
class BadRow:
    row: int
    audio: str
    reason: str


@attrs.frozen
class PreparedData:
    clips: tuple[Clip, ...] = attrs.field(converter=tuple)
    bad_rows: tuple[BadRow, ...] = attrs.field(converter=tuple)

    @property
    def durations(self) -> list[float]:
        return [clip.duration for clip in self.clips]


def _csv_rows(path: Path) -> list[tuple[int, str, str]]:
    """Upstream's reader (``csv.reader``, ``|``, a BOM dropped), row by row: a row the reader
    cannot take (a field over ``csv.field_size_limit``, 131072 characters) and a row whose
    quoted text runs over a line end (an unbalanced quote swallowing the rows after it) are
    bad rows, reported and skipped like the others."""
    rows = []
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle, delimiter="|")
        header = next(reader, None)
        if header is None or len(header) < 2 or header[0].strip() != "audio_file" \
                or header[1].strip() != "text":
            raise InvalidRequest("dataset", f"{path}: the header must be audio_file|text",
                                 "write upstream's metadata.csv layout: audio_file|text")
        while True:
            first = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                rows.append((first, f"!unreadable row: {exc}", None))
                continue
            if not row or not "".join(row).strip():
                continue
            if reader.line_num != first:
                rows.append((first, f"!a quoted field runs over lines {first}-"
                             f"{reader.line_num} (an unbalanced quote?)", None))
                continue
            audio = row[0].strip()
            text = row[1].strip() if len(row) > 1 else ""
            rows.append((first, audio, text))
    return rows


def _jsonl_rows(path: Path) -> list[tuple[int, str, str | None]]:
    rows = []
    with open(path, encoding="utf-8-sig") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:  # bounded nesting and integers; a key given twice (two "audio"s) refused
                item = parse_json(line, "the line")
            except JSONFileError as exc:
                rows.append((number, f"!{exc}", None))
                continue
            audio = item.get("audio", item.get("audio_file", ""))
            text = item.get("text")
            rows.append((number, str(audio) if audio is not None else "",
                         text if isinstance(text, str) else None))
    return rows


def _source_rows(source: Path) -> list[tuple[int, str, str | None]]:
    if source.is_dir():
        if (source / METADATA_CSV).is_file():
            source = source / METADATA_CSV
        else:
            manifests = sorted(source.glob("*.jsonl"))
            if len(manifests) != 1:
                raise InvalidRequest("dataset", f"{source} holds no {METADATA_CSV} and not "
                                     "exactly one *.jsonl manifest",
                                     "pass metadata.csv (audio_file|text) or a JSONL manifest")
            source = manifests[0]
    if not source.is_file():
        raise InvalidRequest("dataset", f"{source} does not exist")
    check_utf8(source, "dataset")
    rows = _jsonl_rows(source) if source.suffix.lower() == ".jsonl" else _csv_rows(source)
    base = source.parent
    return [(n, _absolute(base, a) if a and not a.startswith("!") else a, t)
            for n, a, t in rows]  # "!reason": a row that could not be read


def _absolute(base: Path, audio: str) -> str:
    """The row's audio path made absolute; "!reason" for one no file can have (a NUL)."""
    try:
        return str((base / audio).resolve())
    except (ValueError, OSError) as exc:
        return f"!unusable audio path {audio!r}: {exc}"


@attrs.frozen
class _Row:
    number: int
    audio: str
    text: str | None
    tokens: tuple[str, ...] | None = None  # given: upstream's prepared tokens
    row_duration: float | None = None  # given: the length check uses it
    duration: float | None = None  # given: the batching duration


def _rows(source: Path) -> list[_Row]:
    from mizuoto_f5tts.training.upstream_data import prepared_folder, read_rows

    folder = prepared_folder(source)
    if folder is None:
        return [_Row(n, a, t) for n, a, t in _source_rows(source)]
    return [_Row(r.number, r.audio, "".join(r.tokens), r.tokens, r.row_duration, r.duration)
            for r in read_rows(folder)]


def _check_audio(path: str, duration: float | None = None) -> tuple[float | None, str]:
    import soundfile as sf

    file = Path(path)
    if not file.exists():
        return None, "audio file not found"
    # refused by its header first: a clip that is not kept is never decoded
    header = read_header(file)
    if isinstance(header, str):
        return None, header
    duration = header.seconds if duration is None else duration
    if not MIN_SECONDS <= duration <= MAX_SECONDS:
        return None, f"duration {duration:.2f} s outside [{MIN_SECONDS}, {MAX_SECONDS}] s"
    if header.seconds > 2 * MAX_SECONDS:  # a declared duration that the file belies
        return None, (f"the file holds {header.seconds:.0f} s of audio by its header, more "
                      f"than any clip kept ({MAX_SECONDS:g} s)")
    try:
        data, _ = sf.read(str(file), dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises several unrelated types
        return None, f"unreadable audio: {exc}"
    if data.size == 0:
        return None, "no samples"
    if not np.isfinite(data).all():
        return None, "NaN or infinite samples"
    if not float(np.abs(data).max()) > _SILENCE_PEAK:
        return None, "silent"
    return duration, ""


def prepare_dataset(
    source: str | Path,
    vocab: Mapping[str, int] | None,
    destination: str | Path | None = None,
    *,
    progress: ProgressCallback | None = None,
) -> PreparedData:
    from mizuoto_f5tts.text import to_tokens

    rows = _rows(Path(source))
    clips, bad = [], []
    for done, row in enumerate(rows, start=1):
        number, audio, text = row.number, row.audio, row.text
        reason = ""
        duration = None
        if audio.startswith("!"):
            reason = audio[1:]
        elif not audio:
            reason = "no audio path"
        elif text is None or not text.strip():
            reason = "empty text"
        else:
            duration, reason = _check_audio(audio, row.row_duration)
        tokens: list[str] = []
        if not reason:
            tokens = to_tokens(text) if row.tokens is None else list(row.tokens)
            if row.duration is not None:
                duration = row.duration
            unknown = sorted({t for t in tokens if vocab is not None and t not in vocab})
            if unknown:
                reason = f"tokens outside the vocabulary: {' '.join(map(repr, unknown[:8]))}"
        if reason:
            bad.append(BadRow(number, audio, reason))
            logger.warning("dataset row %d (%s) skipped: %s", number, audio or "-", reason)
        else:
            clips.append(Clip(audio, text, tokens, duration))
        report(progress, "prepare", done, len(rows))
    prepared = PreparedData(clips, bad)
    if not clips:
        raise InvalidRequest("dataset", f"no usable rows in {source} ({len(bad)} bad)",
                             "; ".join(f"row {b.row}: {b.reason}" for b in bad[:5]))
    if destination is not None:
        write_prepared(prepared, destination)
    return prepared


def extended_vocab(vocab: Mapping[str, int], clips, symbols=None) -> list[str]:
    """The tokens to add to ``vocab``: ``symbols`` (spaces removed, as upstream's
    ``vocab_extend``) or else the clips' tokens, in order of first use, minus those it has."""
    wanted = ([s.replace(" ", "") for s in symbols] if symbols is not None
              else [t for clip in clips for t in clip.tokens])
    return list(dict.fromkeys(t for t in wanted if t and t not in vocab))


def write_vocab(path: str | Path, tokens: list[str]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text("".join(f"{t}\n" for t in tokens), encoding="utf-8")


def write_prepared(prepared: PreparedData, destination: str | Path) -> None:
    destination = Path(destination)
    with atomic_path(destination / MANIFEST) as tmp:
        with open(tmp, "w", encoding="utf-8") as handle:
            for clip in prepared.clips:
                handle.write(json.dumps(attrs.asdict(clip), ensure_ascii=False) + "\n")
    with atomic_path(destination / REPORT) as tmp:
        tmp.write_text(json.dumps({"clips": len(prepared.clips),
                                   "bad_rows": [attrs.asdict(b) for b in prepared.bad_rows]},
                                  ensure_ascii=False, indent=1), encoding="utf-8")


def read_prepared(destination: str | Path) -> PreparedData:
    destination = Path(destination)
    with open(destination / MANIFEST, encoding="utf-8") as handle:
        clips = [Clip(**json.loads(line)) for line in handle if line.strip()]
    bad = json.loads((destination / REPORT).read_text(encoding="utf-8"))["bad_rows"]
    return PreparedData(clips, [BadRow(**b) for b in bad])
