"""The lines of a batch input: JSONL, CSV, TSV or plain text, and the request each one asks for.

Reading never stops at a bad line: a line that cannot be parsed comes back as a
:class:`BatchLine` holding its error, and the batch records it in the manifest.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from mizuoto.contracts.requests import Reference, SynthesisRequest
from mizuoto.errors import InvalidRequest

#: The fields a line may have. ``voice`` is a saved voice file; ``reference`` a recording
#: (paths relative to the input file's folder); ``params`` a mapping (a JSON object in CSV/TSV).
FIELDS = ("id", "text", "voice", "reference", "reference_text", "instruction", "seed", "steps",
          "guidance", "params")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_NUMBERS = {"seed": int, "steps": int, "guidance": float}


@attrs.frozen
class BatchLine:
    """Line ``number`` (1-based, of the data: a CSV header is not counted) of a batch input:
    its ``id`` and raw ``fields``, or the ``error`` that made it unreadable."""

    number: int
    id: str
    fields: dict[str, Any] = attrs.field(factory=dict)
    error: InvalidRequest | None = None


def read_lines(path: str | Path) -> Iterator[BatchLine]:
    """The lines of ``path`` by its extension: ``.jsonl`` (one JSON object a line), ``.csv`` /
    ``.tsv`` (a header row naming the fields), anything else plain text (one utterance a line,
    blank lines skipped, ids ``000001``, ``000002``, ... by line number). Ids are checked:
    letters, digits, ``.``, ``_``, ``-``; a repeated id is an error on its later line."""
    path = Path(path)
    if not path.is_file():
        raise InvalidRequest("input", f"file not found: {path}")
    suffix = path.suffix.lower()
    reader = {".jsonl": _jsonl, ".csv": _delimited, ".tsv": _delimited}.get(suffix, _plain)
    seen: dict[str, int] = {}
    for line in reader(path):
        if line.error is None:
            error = _check_id(line.id, seen.get(line.id))
            if error is not None:
                line = attrs.evolve(line, error=error)
            else:
                seen[line.id] = line.number
        yield line


def count_lines(path: str | Path) -> int:
    """How many lines :func:`read_lines` gives (one streaming pass)."""
    return sum(1 for _ in read_lines(path))


def _check_id(line_id: str, earlier: int | None) -> InvalidRequest | None:
    if not _ID.fullmatch(line_id):
        return InvalidRequest("id", f"{line_id!r} cannot name a file",
                              "use letters, digits, '.', '_' and '-' (at most 128)")
    if earlier is not None:
        return InvalidRequest("id", f"{line_id!r} is also the id of line {earlier}",
                              "give each line its own id")
    return None


def _jsonl(path: Path) -> Iterator[BatchLine]:
    with open(path, encoding="utf-8") as handle:
        number = 0
        for raw in handle:
            if not raw.strip():
                continue
            number += 1
            try:
                fields = json.loads(raw)
            except ValueError as exc:
                yield BatchLine(number, str(number), error=InvalidRequest(
                    "line", f"is not JSON ({exc})"))
                continue
            if not isinstance(fields, dict):
                yield BatchLine(number, str(number), error=InvalidRequest(
                    "line", "must be a JSON object with at least \"text\""))
                continue
            yield BatchLine(number, str(fields.get("id", number)), fields)


def _delimited(path: Path) -> Iterator[BatchLine]:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    with open(path, encoding="utf-8", newline="") as handle:
        for number, row in enumerate(csv.DictReader(handle, delimiter=delimiter), 1):
            fields = {key: value for key, value in row.items() if value not in ("", None)}
            if None in row:  # more cells than header columns
                fields.pop(None, None)
                yield BatchLine(number, str(fields.get("id", number)), error=InvalidRequest(
                    "line", "has more cells than the header has columns"))
                continue
            yield BatchLine(number, str(fields.get("id", number)), fields)


def _plain(path: Path) -> Iterator[BatchLine]:
    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, 1):
            text = raw.strip()
            if text:
                yield BatchLine(number, f"{number:06d}", {"text": text})


def build_request(line: BatchLine, *, base: Path, defaults: dict[str, Any] | None = None
                  ) -> SynthesisRequest:
    """The request ``line`` asks for; :class:`InvalidRequest` names the field at fault.
    ``defaults`` (``steps``, ``guidance``, ``params``) apply where the line does not set them;
    params merge key by key."""
    from mizuoto.contracts.voice import Voice

    if line.error is not None:
        raise line.error
    fields = dict(line.fields)
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise InvalidRequest(unknown[0], "is not a field of a batch line",
                             f"known: {', '.join(FIELDS)}")
    for name, kind in _NUMBERS.items():
        if isinstance(fields.get(name), str):  # CSV cells are strings
            try:
                fields[name] = kind(fields[name])
            except ValueError:
                raise InvalidRequest(name, f"{fields[name]!r} is not a number") from None
    params = fields.get("params") or {}
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except ValueError as exc:
            raise InvalidRequest("params", f"is not a JSON object ({exc})") from None
    defaults = defaults or {}
    if isinstance(params, dict):
        params = {**defaults.get("params", {}), **params}
    reference = None
    if fields.get("reference") is not None:
        reference = Reference(_path(base, fields["reference"], "reference"),
                              fields.get("reference_text"))
    elif fields.get("reference_text") is not None:
        raise InvalidRequest("reference_text", "needs reference (the recording)")
    voice = None
    if fields.get("voice") is not None:
        voice_path = _path(base, fields["voice"], "voice")
        if not voice_path.is_file():
            raise InvalidRequest("voice", f"file not found: {voice_path}",
                                 "save one with `mizuoto say --save-voice`")
        voice = Voice.load(voice_path)
    if "text" not in fields:
        raise InvalidRequest("text", "is missing", "give the words to speak")
    return SynthesisRequest(
        text=fields["text"], reference=reference, voice=voice,
        instruction=fields.get("instruction"), seed=fields.get("seed"),
        steps=fields.get("steps", defaults.get("steps")),
        guidance=fields.get("guidance", defaults.get("guidance")), params=params)


def _path(base: Path, value: Any, field: str) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(field, "must be a file path")
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path
