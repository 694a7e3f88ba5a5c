"""Preparing a fine-tuning data set, as upstream's ``prepare_csv_wavs.py`` does, with row checks.

`prepare_dataset(source, vocab, destination=None, *, progress=None) -> PreparedData` reads
``source`` through core's `mizuoto.training.manifest` reader: upstream's ``metadata.csv`` (read
as upstream's ``csv.reader``; a directory holding one is read first), a JSONL manifest
(``audio_file`` accepted for ``audio``), or upstream's prepared folder (``raw.arrow`` +
``duration.json``, `mizuoto_f5tts.training.upstream_data`: its tokens as they are,
``duration.json``'s durations for batching, the row's own for the length check, as upstream's
``CustomDataset``; needs ``mizuoto-f5tts[arrow]``).

Each row is checked; a bad one is reported (`BadRow`: row number, path, reason) and skipped,
never fatal: core's reasons (no audio file, empty text, ...), then unreadable or silent audio,
a duration outside [0.3, 30] s (upstream's loader would silently train on the next row
instead) and tokens outside the model's vocabulary (upstream would map them to the space).
Text becomes tokens as upstream's ``convert_char_to_pinyin`` (polyphone) does; the duration is
the header's, the value upstream's ``duration.json`` holds (``vocab=None`` accepts every
token: the caller extends the vocabulary). With ``destination`` the result is written there as
``manifest.jsonl`` + ``report.json`` (atomically) and can be read back with `read_prepared`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

import attrs

from mizuoto.contracts.progress import ProgressCallback, report
from mizuoto.errors import InvalidRequest
from mizuoto.runtime.atomic import atomic_path
from mizuoto.training.manifest import (
    ManifestRow,
    RejectedRow,
    find_manifest,
    manifest_row,
    read_manifest_rows,
    refused_samples,
)
from mizuoto_f5tts.training.upstream_data import PreparedRow, prepared_folder, read_rows

logger = logging.getLogger(__name__)

MIN_SECONDS = 0.3
MAX_SECONDS = 30.0
MANIFEST = "manifest.jsonl"
REPORT = "report.json"


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


def _entries(source: Path) -> tuple[list[ManifestRow | RejectedRow], dict[int, PreparedRow]]:
    """The rows of ``source`` by line (core's reader, headers read; CSV read as upstream's
    ``csv.reader``) and, from upstream's prepared folder, its rows by number."""
    folder = prepared_folder(source)
    if folder is None:
        manifest = find_manifest(source, metadata_csv_first=True)
        read = read_manifest_rows(manifest, csv_dialect="csv_module",
                                  audio_keys=("audio", "audio_file"), headers=True)
        return [attrs.evolve(e, audio=e.audio.resolve()) if isinstance(e, ManifestRow) else e
                for e in read.entries], {}
    rows = read_rows(folder)
    return [manifest_row(r.number, {"audio": r.audio, "text": "".join(r.tokens)}, folder,
                         headers=True) for r in rows], {r.number: r for r in rows}


def _check_audio(row: ManifestRow, duration: float | None = None) -> tuple[float | None, str]:
    """The clip's duration (``duration`` when declared, else its header's), or why it is
    refused: upstream's length filter, then its decoded samples."""
    import soundfile as sf

    seconds = row.header.seconds
    duration = seconds if duration is None else duration
    if not MIN_SECONDS <= duration <= MAX_SECONDS:
        return None, f"duration {duration:.2f} s outside [{MIN_SECONDS}, {MAX_SECONDS}] s"
    if seconds > 2 * MAX_SECONDS:  # a declared duration that the file belies
        return None, (f"the file holds {seconds:.0f} s of audio by its header, more than any "
                      f"clip kept ({MAX_SECONDS:g} s)")
    try:
        data, _ = sf.read(str(row.audio), dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises several unrelated types
        return None, f"unreadable audio: {exc}"
    refused = refused_samples(data)
    return (None, refused) if refused else (duration, "")


def prepare_dataset(
    source: str | Path,
    vocab: Mapping[str, int] | None,
    destination: str | Path | None = None,
    *,
    progress: ProgressCallback | None = None,
) -> PreparedData:
    from mizuoto_f5tts.text import to_tokens

    entries, upstream = _entries(Path(source))
    clips, bad = [], []
    for done, entry in enumerate(entries, start=1):
        reason, duration = getattr(entry, "reason", ""), None
        prepared = upstream.get(entry.line)
        if not reason:
            duration, reason = _check_audio(entry, prepared and prepared.row_duration)
        tokens: list[str] = []
        if not reason:
            tokens = to_tokens(entry.text) if prepared is None else list(prepared.tokens)
            duration = duration if prepared is None else prepared.duration
            unknown = sorted({t for t in tokens if vocab is not None and t not in vocab})
            if unknown:
                reason = f"tokens outside the vocabulary: {' '.join(map(repr, unknown[:8]))}"
        if reason:
            bad.append(BadRow(entry.line, str(entry.audio), reason))
            logger.warning("dataset row %d (%s) skipped: %s", entry.line, entry.audio or "-",
                           reason)
        else:
            clips.append(Clip(str(entry.audio), entry.text, tokens, duration))
        report(progress, "prepare", done, len(entries))
    prepared_data = PreparedData(clips, bad)
    if not clips:
        raise InvalidRequest("dataset", f"no usable rows in {source} ({len(bad)} bad)",
                             "; ".join(f"row {b.row}: {b.reason}" for b in bad[:5]))
    if destination is not None:
        write_prepared(prepared_data, destination)
    return prepared_data


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
        tmp.write_text("".join(json.dumps(attrs.asdict(clip), ensure_ascii=False) + "\n"
                               for clip in prepared.clips), encoding="utf-8")
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
