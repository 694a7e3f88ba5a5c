"""Long-form synthesis to a file: section by section, in bounded memory, resumable.

A long text is cut into *sections* (whole sentences packed up to ``max_chars`` characters, cut
as the text is read); each section is one ordinary request, and its audio goes to disk as soon
as it is made. The request is planned once, through the speech service
(:func:`mizuoto.service.plan_document`: the engine's checks, its params parsed, the seed drawn
there when unset); each section runs the document's plan with its own text and seed. Memory
holds one section's text and audio, whatever the length of the text, and every engine gets
this without code of its own.

On disk, ``OUT.part/`` beside the output holds ``audio.raw`` (the finished sections' samples,
headerless, in the output's sample format) and ``state.json`` (sections done, bytes written,
the seed, and what the run depends on). Each section's audio is fsynced before ``state.json``
names it, so after Ctrl-C, SIGKILL or a power cut ``resume=True`` cuts ``audio.raw`` back to
the last complete section and goes on from the next. When every section is done the output is
encoded from ``audio.raw`` in one streaming pass, written atomically, and ``OUT.part/`` is
removed.

Same samples as one ``synthesize`` call: a text that fits in one section is spoken by exactly
``engine.synthesize(request)``, and a WAV or FLAC output is byte for byte what ``result.save``
writes. A longer text differs from one call (where one call could take it: a request holds at
most ``MAX_TEXT_CHARS``) at the section boundaries only:

- section ``k > 0`` is seeded with :func:`~mizuoto.service.section_seed` ``(seed, k)``, so
  that every section is a pure function of its text, the settings and ``k``: that is what
  makes a resumed file byte-identical. Within a section the engine seeds its own chunks as
  usual (F5-TTS draws them from one generator, VoxCPM from ``seed + 1000 * chunk``), but not
  across sections;
- sections are joined end to end. F5-TTS crossfades its own chunks within a section, not
  across a section boundary; VoxCPM joins its chunks end to end too.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from mizuoto.audio_formats import AudioFormat, format_for_path
from mizuoto.contracts.progress import ProgressCallback, report
from mizuoto.contracts.requests import MAX_TEXT_CHARS, SynthesisRequest
from mizuoto.contracts.results import Applied, file_metadata
from mizuoto.errors import DiskFull, InvalidRequest
from mizuoto.identity import model_identity, request_identity
from mizuoto.output_paths import check_output_file
from mizuoto.runtime.atomic import storage_errors_named
from mizuoto.service import DocumentPlan, SpeechOrder, plan_document, section_seed, speak

if TYPE_CHECKING:
    from mizuoto.contracts.engine import Engine
    from mizuoto.contracts.plan import RequestPlan

log = logging.getLogger(__name__)

#: Default section size in characters: about a minute of speech, short enough that an
#: interruption loses little, long enough that the engine chunks as it would.
DEFAULT_SECTION_CHARS = 1000
_RAW_DTYPE = {"PCM_16": "<i2", "FLOAT": "<f4"}
_STATE_VERSION = 1
_READ_CHARS = 1 << 16  # characters read from a text file at a time
_ENCODE_FRAMES = 1 << 18  # samples per block of the final encoding pass

# A sentence ends at . ! ? … (with closing quotes or brackets) before a space, at CJK full
# stops anywhere, and at a blank line. Sections are cut after such an end.
_SENTENCE_END = re.compile(
    r"[.!?…]+[\"'”’»)\]]*(?=\s)|[。！？；]+[”’」』)）]*|\n[^\S\n]*\n")


@attrs.frozen
class LongFormResult:
    """What :func:`synthesize_to` did. ``complete`` is False when ``stop_after`` stopped it
    (the file is then not written; a call with ``resume=True`` continues)."""

    path: Path
    complete: bool
    sections: int  # in the whole text
    sections_done: int
    resumed_at: int  # sections already done when this call started
    seconds: float  # of audio written so far
    elapsed: float  # seconds this call spent synthesizing
    applied: Applied | None  # the run as a whole (seed, summed chunks and retries, warnings)


def iter_sections(blocks: Iterable[str], max_chars: int = DEFAULT_SECTION_CHARS
                  ) -> Iterator[str]:
    """Cut text, read as consecutive ``blocks``, into sections of at most ``max_chars``
    characters: whole sentences packed greedily; a sentence longer than that is cut at its
    last space before the limit (or at the limit itself, in text without spaces).

    A text whose stripped length fits in one section is yielded as it is (not stripped), so
    that it is spoken exactly as one ``synthesize`` call would; otherwise each section is a
    stripped slice of the text. Memory holds at most a block and two sections of text.
    """
    if max_chars < 1:
        raise InvalidRequest("max_chars", f"must be at least 1, got {max_chars}")
    buffer, start, cut_any = "", 0, False
    for block in blocks:
        buffer = buffer[start:] + block
        start = 0
        while len(buffer) - start > 2 * max_chars:
            section, start = _cut(buffer, start, max_chars)
            cut_any = True
            if section:
                yield section
    rest = buffer[start:]
    if not cut_any and len(rest.strip()) <= max_chars:
        if rest.strip():
            yield rest
        return
    start = 0
    while rest[start:].strip():
        section, start = _cut(rest, start, max_chars)
        if section:
            yield section


def _cut(text: str, start: int, max_chars: int) -> tuple[str, int]:
    """The next section of ``text`` from ``start``, and where the one after it starts."""
    while start < len(text) and text[start].isspace():
        start += 1
    limit = start + max_chars
    if len(text) <= limit:
        return text[start:].strip(), len(text)
    end = 0
    for match in _SENTENCE_END.finditer(text, start, limit + 1):
        if match.end() <= limit:
            end = match.end()
    if end <= start:
        space = max(text.rfind(" ", start, limit + 1), text.rfind("\n", start, limit + 1))
        end = space if space > start else limit
    return text[start:end].strip(), end


def synthesize_to(engine: Engine, path: str | Path, request: SynthesisRequest | DocumentPlan,
                  *, text_file: str | Path | None = None, resume: bool = False,
                  max_chars: int = DEFAULT_SECTION_CHARS, stop_after: int | None = None,
                  progress: ProgressCallback | None = None,
                  resume_hint: str = "resume=True") -> LongFormResult:
    """Speak ``request`` into the audio file ``path`` (any format of
    :mod:`mizuoto.audio_formats`, by extension) section by section, in memory bounded whatever
    the text's length. A WAV longer than a plain WAV can describe is written as RF64.

    ``request``: a :class:`~mizuoto.SynthesisRequest`, planned here by the speech service, or
    the :class:`~mizuoto.service.DocumentPlan` a front end already made
    (:func:`~mizuoto.service.plan_document`); a request the engine refuses raises before any
    file is touched. ``text_file``: speak this UTF-8 file instead of ``request.text`` (of any
    length; the file is read as it is spoken, never whole), with ``request``'s voice, seed and
    settings.
    ``resume``: continue the interrupted run in ``PATH.part/`` (its text and settings must be
    the same; a drawn seed is the one it drew); without it, an interrupted run found there is
    an error rather than thrown away. ``stop_after``: synthesize at most this many sections in
    this call and return (the run stays resumable). A ``text_file`` that changes while it is
    spoken raises :class:`InvalidRequest` naming it. ``progress`` receives a ``section`` stage
    (done / total, detail: audio seconds, seconds per section, ETA) around the engine's own.
    ``resume_hint``: how the caller resumes, as messages name it (the CLI: ``--resume``).
    """
    path = Path(path)
    fmt, raw_subtype = _output_format(path)
    # before any section is spoken (the CLI checks as much; the Python API did not: a folder
    # named like the output was found only after the last section)
    check_output_file(path, "path")
    if not 1 <= max_chars <= MAX_TEXT_CHARS:
        raise InvalidRequest("max_chars", f"must be in [1, {MAX_TEXT_CHARS}], got {max_chars}")
    if stop_after is not None and stop_after < 0:
        raise InvalidRequest("stop_after", f"must be 0 or more, got {stop_after}")
    document = request if isinstance(request, DocumentPlan) else \
        plan_document(engine, SpeechOrder(request, request.text))
    request = document.plan.request
    source = _TextSource(request.text if text_file is None else None, text_file)
    total, total_chars, text_sha = source.scan(max_chars)
    if total == 0:
        raise InvalidRequest("text_file" if text_file is not None else "text", "is empty",
                             "give the words to speak")
    depends = {"version": _STATE_VERSION, "text": text_sha, "max_chars": max_chars,
               "format": list(fmt.soundfile or (fmt.name,)), **model_identity(engine),
               **request_identity(request, text=False)}
    part = _PartialRun(path, resume_hint)
    nothing_to_resume = False
    try:
        # a full disk is named by the path being written (the .part directory's file, or the
        # output), not by the system's bare "No space left on device"
        with storage_errors_named(part.directory):
            state = part.open(depends, document.plan, resume)
            document = document.with_seed(state["seed"], state["seed_drawn"])
            return _run(engine, path, document, part, state, source, total, total_chars,
                        max_chars, stop_after, (fmt, raw_subtype), progress)
    except DiskFull:
        nothing_to_resume = part.sections_done() == 0
        raise
    finally:
        part.unlock()
        if nothing_to_resume:  # no finished section to resume: the disk gets its space back
            part.remove()


def _run(engine: Engine, path: Path, document: DocumentPlan, part: _PartialRun, state: dict,
         source: _TextSource, total: int, total_chars: int, max_chars: int,
         stop_after: int | None, formats: tuple[AudioFormat, str],
         progress: ProgressCallback | None) -> LongFormResult:
    """The sections not done yet, appended to ``audio.raw``; then the output, when all are."""
    fmt, raw_subtype = formats
    rate = engine.info.sample_rate
    frame_bytes = 2 if raw_subtype == "PCM_16" else 4
    started, chars_done, made_now = time.monotonic(), 0, 0
    resumed_at = state["sections_done"]
    report(progress, "section", resumed_at, total, _detail(state, rate, frame_bytes, None))
    try:
        with open(part.audio, "ab") as sink:
            for index, section in enumerate(source.sections(max_chars, total)):
                if index < state["sections_done"]:
                    continue
                source.check_unchanged()
                if stop_after is not None and made_now >= stop_after:
                    break
                planned = document.section(index, section)
                began = time.monotonic()
                [result] = speak(engine, planned, stream=False, progress=progress)
                if result.audio.sample_rate != rate:
                    raise InvalidRequest("sample_rate", f"section {index + 1} came back at "
                                         f"{result.audio.sample_rate} Hz, not {rate} Hz")
                data = _raw_bytes(result.audio.numpy(), rate, raw_subtype)
                sink.write(data)
                sink.flush()
                os.fsync(sink.fileno())  # the audio is on disk before the state names it
                made_now += 1
                chars_done += len(section)
                state = _advance(state, len(data), len(section), result.applied,
                                 document.warnings)
                part.save(state)
                elapsed = time.monotonic() - started
                eta = elapsed / chars_done * max(total_chars - state["chars"], 0)
                log.debug("section %d/%d: %.1f s of audio in %.2f s", index + 1, total,
                          result.audio.duration, time.monotonic() - began)
                report(progress, "section", state["sections_done"], total,
                       _detail(state, rate, frame_bytes, eta))
    except KeyboardInterrupt:
        log.warning("interrupted after %d of %d sections; rerun with %s to continue from "
                    "there", state["sections_done"], total, part.resume_hint)
        raise
    elapsed = time.monotonic() - started
    done = state["sections_done"]
    seconds = state["bytes"] / frame_bytes / rate
    applied = _summary(state)
    if done < total:
        return LongFormResult(path, False, total, done, resumed_at, seconds, elapsed, applied)
    _encode(part.audio, path, rate, fmt, raw_subtype, applied, total, progress)
    part.remove()
    return LongFormResult(path, True, total, done, resumed_at, seconds, elapsed, applied)


class _TextSource:
    """The text to speak: a string, or a file read in blocks each time it is walked."""

    def __init__(self, text: str | None, text_file: str | Path | None) -> None:
        self._text, self._file = text, None if text_file is None else Path(text_file)
        self._sha: str | None = None
        self._stat: tuple[int, int] | None = None

    def _blocks(self) -> Iterator[str]:
        if self._file is None:
            yield self._text
            return
        try:
            with open(self._file, encoding="utf-8-sig") as handle:  # a BOM is not text
                while block := handle.read(_READ_CHARS):
                    yield block
        except UnicodeDecodeError as exc:
            raise InvalidRequest("text_file", f"{self._file} is not UTF-8 text ({exc})") \
                from None
        except OSError as exc:
            raise InvalidRequest("text_file", f"cannot read {self._file}: {exc}") from None

    def _file_stat(self) -> tuple[int, int] | None:
        if self._file is None:
            return None
        try:
            stat = self._file.stat()
        except OSError:
            return None
        return stat.st_size, stat.st_mtime_ns

    def _hashed(self, digest) -> Iterator[str]:
        for block in self._blocks():
            digest.update(block.encode("utf-8"))
            yield block

    def scan(self, max_chars: int) -> tuple[int, int, str]:
        """Sections, characters in them, and the text's SHA-256, in one streaming pass."""
        import hashlib

        self._stat = self._file_stat()
        digest = hashlib.sha256()
        count = chars = 0
        for section in iter_sections(self._hashed(digest), max_chars):
            count += 1
            chars += len(section)
        self._sha = digest.hexdigest()
        return count, chars, self._sha

    def sections(self, max_chars: int, total: int) -> Iterator[str]:
        """The sections again, as :meth:`scan` counted them: a file that no longer gives the
        same text (``total`` sections, the same SHA-256) raises :meth:`changed`."""
        import hashlib

        digest = hashlib.sha256()
        count = 0
        for section in iter_sections(self._hashed(digest), max_chars):
            count += 1
            if count > total:
                raise self.changed()
            yield section
        if count != total or digest.hexdigest() != self._sha:
            raise self.changed()

    def check_unchanged(self) -> None:
        """Raise :meth:`changed` if the file's size or modification time moved since
        :meth:`scan` (checked before each section: a change is found at once)."""
        if self._file_stat() != self._stat:
            raise self.changed()

    def changed(self) -> InvalidRequest:
        return InvalidRequest(
            "text_file", f"{self._file} changed while it was being spoken",
            "put the text back as it was and rerun with --resume (resume=True), or delete "
            "OUTPUT.part/ and start again")


class _PartialRun:
    """``PATH.part/``: ``audio.raw`` and ``state.json``."""

    def __init__(self, path: Path, resume_hint: str = "resume=True") -> None:
        self.resume_hint = resume_hint
        self.directory = path.with_name(path.name + ".part")
        self.audio = self.directory / "audio.raw"
        self.state = self.directory / "state.json"
        self._lock = None

    def open(self, depends: dict, plan: RequestPlan, resume: bool) -> dict:
        """The run's state: the interrupted one's when resuming (its seed, drawn or not, is
        the run's), else a new one with ``plan``'s seed."""
        self.lock()
        if self.state.is_file():
            if not resume:
                raise InvalidRequest(
                    "output", f"{self.directory} holds an interrupted run of this output",
                    f"pass {self.resume_hint} to continue it, or delete that directory")
            state = self._load()
            if state.get("depends") != depends:
                differing = sorted(key for key in set(depends) | set(state.get("depends", {}))
                                   if depends.get(key) != state.get("depends", {}).get(key))
                raise InvalidRequest(
                    "--resume", f"the interrupted run in {self.directory} was made with other "
                    f"settings (differing: {', '.join(differing)})",
                    "rerun with the same text, model and settings, or delete that directory")
            size = self.audio.stat().st_size if self.audio.is_file() else -1
            if size < state["bytes"]:
                raise InvalidRequest("--resume", f"{self.audio} holds {max(size, 0)} bytes, "
                                     f"less than the {state['bytes']} its state names",
                                     "delete the directory and start again")
            with open(self.audio, "ab") as handle:  # drop what a killed run left unfinished
                handle.truncate(state["bytes"])
            log.info("resuming %s: %d sections done", self.directory, state["sections_done"])
            return state
        if resume:
            log.info("nothing to resume in %s: starting", self.directory)
        self.audio.write_bytes(b"")
        state = {"depends": depends, "seed": plan.seed, "seed_drawn": plan.seed_drawn,
                 "sections_done": 0, "bytes": 0, "chars": 0, "applied": None}
        self.save(state)
        return state

    def sections_done(self) -> int:
        """Sections the saved state names as finished (0 without a readable state)."""
        try:
            return int(json.loads(self.state.read_text(encoding="utf-8"))["sections_done"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def lock(self) -> None:
        """Hold ``lock`` in the directory (released by :meth:`unlock` or when the process
        ends): two runs writing one output would interleave their sections."""
        from mizuoto.runtime.run_lock import RunLock

        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = RunLock(self.directory / "lock", field="output",
                             what=str(self.directory)).acquire()

    def _load(self) -> dict:
        try:
            return json.loads(self.state.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidRequest("--resume", f"cannot read {self.state}: {exc}",
                                 "delete the directory and start again") from None

    def save(self, state: dict) -> None:
        tmp = self.state.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(state, handle, ensure_ascii=False, default=repr)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.state)

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _advance(state: dict, written: int, chars: int, applied: Applied,
             warnings: tuple[str, ...] = ()) -> dict:
    """The state after one more section: counts, bytes, and the run's summed record (with
    ``warnings``, the plan's own, first)."""
    summary = state["applied"]
    if summary is None:
        summary = attrs.asdict(applied, recurse=False)
        summary.update(seed=state["seed"], seed_drawn=state["seed_drawn"], retries=0, chunks=0,
                       fallbacks=[], warnings=list(warnings), sampler=dict(applied.sampler),
                       compute=dict(applied.compute), extra=dict(applied.extra),
                       model_defaults=dict(applied.model_defaults))
    summary["retries"] += applied.retries
    summary["chunks"] += applied.chunks
    for key in ("fallbacks", "warnings"):
        for item in getattr(applied, key):
            if item not in summary[key] and len(summary[key]) < 50:  # bounded, not per section
                summary[key].append(item)
    return {**state, "sections_done": state["sections_done"] + 1,
            "bytes": state["bytes"] + written, "chars": state["chars"] + chars,
            "applied": summary}


def _summary(state: dict) -> Applied | None:
    summary = state["applied"]
    if summary is None:
        return None
    extra = dict(summary.get("extra") or {})
    extra["sections"] = state["sections_done"]
    return Applied(**{**summary, "extra": extra})


def _detail(state: dict, rate: int, frame_bytes: int, eta: float | None) -> str:
    seconds = state["bytes"] / frame_bytes / rate
    text = f"{seconds:.1f} s audio"
    if eta is not None:
        text += f", ETA {_clock(eta)}"
    return text


def _clock(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else \
        f"{rest // 60}:{rest % 60:02d}"


def _output_format(path: Path) -> tuple[AudioFormat, str]:
    """The output's format, and the subtype ``audio.raw`` keeps: WAV keeps its own 16-bit
    samples; the others keep float32 and convert at the end, because libsndfile's FLAC writer
    rounds float to 16 bits differently from its PCM writer (one step apart on about half the
    samples): converting at the end is what makes the file byte for byte the one
    ``result.save`` writes."""
    fmt = format_for_path(path)
    return fmt, "PCM_16" if fmt.name == "wav" else "FLOAT"


def _raw_bytes(samples, rate: int, raw_subtype: str) -> bytes:
    """``samples`` as ``audio.raw`` keeps them: converted by libsndfile, as writing the
    output directly would convert them (the same rounding and clipping)."""
    import soundfile as sf

    buffer = io.BytesIO()
    with sf.SoundFile(buffer, "w", samplerate=rate, channels=1, format="RAW",
                      subtype=raw_subtype, endian="LITTLE") as raw:
        raw.write(samples)
    return buffer.getvalue()


def _metadata(applied: Applied | None, sections: int) -> dict[str, str]:
    """The metadata ``SynthesisResult.save`` writes, plus the section count for long runs."""
    if applied is None:
        return {}
    metadata = file_metadata(applied)
    if sections > 1:
        metadata["comment"] += f"; long-form, {sections} sections"
    return metadata


def _encode(raw_path: Path, path: Path, rate: int, fmt: AudioFormat, raw_subtype: str,
            applied: Applied | None, sections: int, progress: ProgressCallback | None) -> None:
    """Write the output from ``audio.raw`` in blocks, atomically, through the writer
    ``result.save`` uses (the same bytes; a WAV too long for 32-bit sizes becomes RF64)."""
    import numpy as np

    from mizuoto.audio_encoding import WriteSettings, open_writer

    dtype = np.dtype(_RAW_DTYPE[raw_subtype])
    frames, done = raw_path.stat().st_size // dtype.itemsize, 0
    settings = WriteSettings(metadata=_metadata(applied, sections), frames=frames)
    with open_writer(path, fmt, rate, settings) as out, open(raw_path, "rb") as raw:
        while block := raw.read(_ENCODE_FRAMES * dtype.itemsize):
            samples = np.frombuffer(block, dtype=dtype).astype(dtype.newbyteorder("="))
            out.write(samples)
            done += len(samples)
            report(progress, "encoding", done, frames)


__all__ = ["DEFAULT_SECTION_CHARS", "LongFormResult", "iter_sections", "section_seed",
           "synthesize_to"]
