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
from mizuoto.json_files import JSONFileError, parse_json
from mizuoto.output_paths import is_device_name
from mizuoto.service import SpeechOrder, speech_order
from mizuoto.text.files import check_utf8

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
    strings of letters, digits, ``.``, ``_``, ``-`` that name a file on every system; a
    repeated id (also one differing only in case) is an error on its later line.

    The file must be UTF-8 (a byte order mark, as Excel writes, is accepted). A file that
    cannot be read as a whole raises :class:`InvalidRequest` for ``input`` before any line is
    given: another encoding, a CSV quote left open or a malformed quoted cell, a header that
    repeats a column or has an empty one.
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidRequest("input", f"file not found: {path}")
    check_utf8(path, "input")
    suffix = path.suffix.lower()
    reader = {".jsonl": _jsonl, ".csv": _delimited, ".tsv": _delimited}.get(suffix, _plain)
    seen: dict[str, int] = {}
    for line in reader(path):
        if line.error is None:
            error = _check_id(line.id, seen.get(line.id.casefold()))
            if error is not None:
                line = attrs.evolve(line, error=error)
            else:
                seen[line.id.casefold()] = line.number
        yield line


def count_lines(path: str | Path) -> int:
    """How many lines :func:`read_lines` gives (one streaming pass); a file that cannot be read
    as a whole raises here, before anything runs."""
    return sum(1 for _ in read_lines(path))


def _check_id(line_id: str, earlier: int | None) -> InvalidRequest | None:
    if not _ID.fullmatch(line_id) or line_id.endswith("."):
        return InvalidRequest("id", f"{line_id!r} cannot name a file",
                              "use letters, digits, '.', '_' and '-' (at most 128), starting "
                              "with a letter or digit and not ending with '.'")
    if is_device_name(line_id):
        return InvalidRequest("id", f"{line_id!r} is a device name on Windows",
                              "choose another id")
    if earlier is not None:
        return InvalidRequest("id", f"{line_id!r} is also the id of line {earlier} (ids that "
                              "differ only in case name one file on macOS and Windows)",
                              "give each line its own id")
    return None


def _jsonl(path: Path) -> Iterator[BatchLine]:
    with open(path, encoding="utf-8-sig") as handle:
        number = 0
        for raw in handle:
            if not raw.strip():
                continue
            number += 1
            try:  # nesting, huge integers and a key given twice refused, by name
                # Python's own integer limit: a long integer id is the id check's to name
                fields = parse_json(raw, "the line", expect=None, max_int_digits=4300)
            except JSONFileError as exc:
                yield BatchLine(number, str(number), error=InvalidRequest(
                    "line", f"is not usable JSON ({exc})"))
                continue
            if not isinstance(fields, dict):
                yield BatchLine(number, str(number), error=InvalidRequest(
                    "line", "must be a JSON object with at least \"text\""))
                continue
            half = _lone_surrogate(fields) if "\\u" in raw.lower() else None
            if half is not None:
                # JSON's \ud83d escape decodes to half a character that no file, manifest or
                # tokenizer can encode: named here, not as a codec error later
                yield BatchLine(number, str(number), error=InvalidRequest(
                    "line", f"line {number} holds a lone surrogate \\u{half:04x} (half of a "
                    "UTF-16 pair)", "write the character itself or both halves of its pair, "
                    "e.g. \\ud83d\\ude00"))
                continue
            if "id" in fields:
                # an integer id is what a user numbering lines means: 7 names 7.wav; a bool,
                # float or null has no one file name (true? 7.0 or 7?) and is refused
                if isinstance(fields["id"], int) and not isinstance(fields["id"], bool):
                    fields["id"] = str(fields["id"])
                elif not isinstance(fields["id"], str):
                    yield BatchLine(number, str(number), error=InvalidRequest(
                        "id", f"must be a string or an integer, got {json.dumps(fields['id'])}",
                        'write it in quotes, e.g. "id": "intro-1"'))
                    continue
            yield BatchLine(number, fields.get("id", str(number)), fields)


def _lone_surrogate(decoded: object) -> int | None:
    """The first lone surrogate in a decoded JSON line's keys and values, if any."""
    pending = [decoded]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, str):
            for char in value:
                if 0xD800 <= ord(char) <= 0xDFFF:
                    return ord(char)
    return None


def _delimited(path: Path) -> Iterator[BatchLine]:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    with open(path, encoding="utf-8-sig", newline="") as handle:
        # strict: a quote left open would otherwise swallow every row after it
        reader = csv.reader(handle, delimiter=delimiter, strict=True)
        rows = _csv_rows(reader, path)
        header = next(rows, None)
        if header is None:
            return
        names = [name.strip() for name in header]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise InvalidRequest("input", f"{path}: the header repeats the column "
                                 f"{', '.join(map(repr, repeated))}", "give each column once")
        if "" in names:
            raise InvalidRequest("input", f"{path}: the header has a column without a name",
                                 f"name every column ({', '.join(FIELDS)})")
        number = 0
        for row in rows:
            if not row:  # a blank line
                continue
            number += 1
            # a short row leaves its last fields unset; a long one is refused below
            fields = {name: cell for name, cell in zip(names, row, strict=False) if cell != ""}
            line_id = fields.get("id", str(number))
            if len(row) > len(names):
                yield BatchLine(number, line_id, error=InvalidRequest(
                    "line", "has more cells than the header has columns"))
            elif "id" in names and not fields.get("id", "").strip():
                yield BatchLine(number, str(number), error=InvalidRequest(
                    "id", "is empty", "give every line an id, or leave out the id column"))
            else:
                try:
                    fields = _numbers_from_cells(fields)
                except InvalidRequest as exc:
                    yield BatchLine(number, line_id, error=exc)
                else:
                    yield BatchLine(number, line_id, fields)


def _numbers_from_cells(fields: dict[str, str]) -> dict[str, Any]:
    """A CSV row's number cells as numbers (every cell is text). Only here: in JSONL a number
    is written as one, and ``"steps": "2"`` is refused as the server and Python API do."""
    for name, kind in _NUMBERS.items():
        if name in fields:
            try:
                fields[name] = kind(fields[name])
            except ValueError:
                raise InvalidRequest(name, f"{fields[name]!r} is not a number") from None
    return fields


def _csv_rows(reader, path: Path) -> Iterator[list[str]]:
    """The reader's rows; a malformed file raises :class:`InvalidRequest` naming the line."""
    while True:
        starts = reader.line_num + 1  # the row's first line (a quoted cell may span several)
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            problem = ("a quote opened in this row is never closed"
                       if "unexpected end of data" in str(exc) else str(exc))
            raise InvalidRequest("input", f"{path}, line {starts}: {problem}",
                                 "quote cells as CSV does (\"\" for a quote inside a quoted "
                                 "cell); keep cells under 128 KiB") from None
        yield row


def _plain(path: Path) -> Iterator[BatchLine]:
    with open(path, encoding="utf-8-sig") as handle:
        for number, raw in enumerate(handle, 1):
            text = raw.strip()
            if text:
                yield BatchLine(number, f"{number:06d}", {"text": text})


def build_request(line: BatchLine, *, base: Path, defaults: dict[str, Any] | None = None
                  ) -> SynthesisRequest:
    """The request ``line`` asks for; :class:`InvalidRequest` names the field at fault.
    ``defaults`` (``steps``, ``guidance``, ``params``) apply where the line does not set them;
    params merge key by key."""
    return build_order(line, base=base, defaults=defaults).request


def build_order(line: BatchLine, *, base: Path, defaults: dict[str, Any] | None = None
                ) -> SpeechOrder:
    """The speech service's order for ``line`` (:func:`mizuoto.service.speech_order`), as
    :func:`build_request` describes it."""
    from mizuoto.contracts.voice import Voice

    if line.error is not None:
        raise line.error
    fields = dict(line.fields)
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise InvalidRequest(unknown[0], "is not a field of a batch line",
                             f"known: {', '.join(FIELDS)}")
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
    return speech_order(
        fields["text"], reference=reference, voice=voice,
        instruction=fields.get("instruction"), seed=fields.get("seed"),
        steps=fields.get("steps", defaults.get("steps")),
        guidance=fields.get("guidance", defaults.get("guidance")), params=params)


def _path(base: Path, value: Any, field: str) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(field, "must be a file path")
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path
