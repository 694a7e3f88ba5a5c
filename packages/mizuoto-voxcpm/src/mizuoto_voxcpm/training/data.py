"""The training data: a JSONL manifest read as upstream's ``datasets`` pipeline reads it, the
epoch order its ``DataLoader`` draws, and the packed sequences its ``AudioFeatureProcessingPacker``
builds.

(The epoch order is torch's shuffling ``DataLoader``'s: core's
`mizuoto.training.loader_order`.)

A manifest line is ``{"audio": path, "text": ...}`` (paths relative to the manifest's folder),
optionally with ``"ref_audio"``: a recording of the voice that is prepended to the sequence
(``[103, reference patches, 104, text, 101, audio patches, 102]``, loss on the audio only).
Audio is read as ``datasets.Audio(sampling_rate=<VAE rate>)`` decodes it: soundfile float64,
channels averaged, ``librosa.resample`` (soxr) when the rate differs.

``"duration"`` and ``"ref_duration"`` (seconds) stand in for the measured lengths in upstream's
``max_batch_tokens`` estimate (``compute_sample_lengths``), the only place upstream reads them,
with its column rules (see ``Sample.estimate_seconds``). ``"dataset_id"`` only feeds upstream's
per-dataset counters, never the model, and is ignored.

``"is_prompt": true`` makes the row a prompt: its audio is framed by 103/104 instead of 101/102
and left out of both losses (``[text, 103, audio patches, 104]``, loss mask all zero). Upstream
reads ``bool(row.get("is_prompt"))`` (None where a row lacks a key others hold) and ignores it on
a row with a reference.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
import torch

from mizuoto.json_files import JSONFileError, parse_json
from mizuoto.nn.dsp.audio_io import SILENCE_PEAK
from mizuoto.nn.dsp.soxr_resample import mono_like_librosa, resample_soxr
from mizuoto.text.files import read_utf8
from mizuoto.training.audio_header import read_header

AUDIO_START, AUDIO_END, PROMPT_START, PROMPT_END = 101, 102, 103, 104


@attrs.frozen
class Sample:
    """One usable manifest row: float64 audio at the VAE's rate and the text's token ids."""

    line: int
    audio_path: str
    audio: np.ndarray = attrs.field(eq=False, repr=False)
    text_ids: tuple[int, ...]
    text: str = ""
    ref_audio: np.ndarray | None = attrs.field(default=None, eq=False, repr=False)
    #: seconds of audio upstream's max_batch_tokens estimate counts: the row's declared
    #: ``duration``, else the audio's length
    estimate_seconds: float = attrs.field(default=0.0, kw_only=True)
    #: the reference's seconds in that estimate (none counted when None or 0). Upstream counts
    #: nothing without a ``ref_audio`` column; with a ``ref_duration`` column, the row's declared
    #: value even on a row without a reference (and nothing on a row that lacks it, reference
    #: or not); else the reference's length.
    ref_estimate_seconds: float | None = attrs.field(default=None, kw_only=True)
    #: a prompt row: audio framed by 103/104, no loss on it (ignored with a reference)
    is_prompt: bool = attrs.field(default=False, kw_only=True)


@attrs.frozen
class Rejected:
    line: int
    reason: str


def read_audio(path: str | Path, sample_rate: int) -> np.ndarray:
    """Mono float64 samples at ``sample_rate``, as ``datasets.Audio`` decodes them."""
    import soundfile as sf

    array, rate = sf.read(str(path))
    array = mono_like_librosa(array.T)
    if rate != sample_rate:
        array = resample_soxr(array, rate, sample_rate, "HQ")  # librosa's default soxr_hq
    return array


def read_manifest(manifest: Path, *, sample_rate: int, tokenize, max_length: int,
                  patch_size: int, hop_length: int, field: str = "dataset"
                  ) -> tuple[list[Sample], list[Rejected]]:
    """Usable rows of a JSONL manifest or a ``metadata.csv`` (``audio_file|text``, header
    optional), and the rejected ones with their reasons (unreadable or silent audio, empty
    text, a sequence longer than the model's context, a declared duration that is not a
    non-negative number of seconds, an ``is_prompt`` that is not a flag)."""
    samples, rejected, rows = [], [], []
    patch_len = hop_length * patch_size
    # not UTF-8: a named error; a BOM (a manifest saved by a Windows editor) is dropped
    lines = read_utf8(manifest, field).removeprefix("\ufeff").splitlines()
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        if manifest.suffix.lower() == ".csv":  # upstream F5's metadata.csv: audio_file|text
            cells = [cell.strip() for cell in raw.split("|", 1)]
            if number == 1 and cells == ["audio_file", "text"]:
                continue
            if len(cells) == 2:
                rows.append((number, {"audio": cells[0], "text": cells[1]}))
            else:
                rejected.append(Rejected(number, "not audio_file|text"))
            continue
        try:  # bounded nesting and integers; a key given twice (two "audio"s) refused
            rows.append((number, parse_json(raw, "the line", expect=None)))
        except JSONFileError as exc:
            rejected.append(Rejected(number, str(exc)))
    # upstream's ``datasets`` table has a column for every key any row holds (None elsewhere)
    columns = {key for _, row in rows if isinstance(row, dict) for key in row}
    for number, row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("audio"), str):
            rejected.append(Rejected(number, 'needs "audio" (a path) and "text"'))
            continue
        text = row.get("text")
        if not isinstance(text, str) or not text.strip():
            rejected.append(Rejected(number, "empty text"))
            continue
        declared = {field: _declared_seconds(row, field) for field in DURATION_FIELDS}
        bad = [reason for reason in declared.values() if isinstance(reason, str)]
        prompt = _prompt_flag(row)
        if isinstance(prompt, str):
            bad.append(prompt)
        if bad:
            rejected.append(Rejected(number, bad[0]))
            continue
        path = _resolve(manifest, row["audio"])
        reference = row.get("ref_audio")
        if reference is not None and not isinstance(reference, str):
            rejected.append(Rejected(number, '"ref_audio" must be a path'))
            continue
        ids = tuple(tokenize(text))
        # by the headers first: a clip too long to keep is never decoded
        too_long = _longer_than_context(path, reference and _resolve(manifest, reference),
                                        sample_rate, len(ids), patch_len, max_length)
        if too_long:
            rejected.append(Rejected(number, too_long))
            continue
        audio = _load(path, sample_rate)
        if isinstance(audio, str):
            rejected.append(Rejected(number, audio))
            continue
        if reference is not None:
            reference = _load(_resolve(manifest, reference), sample_rate)
            if isinstance(reference, str):
                rejected.append(Rejected(number, f"ref_audio: {reference}"))
                continue
        length = len(ids) + -(-audio.size // patch_len) + 2
        if reference is not None:
            length += -(-reference.size // patch_len) + 2
        if length > max_length:
            rejected.append(Rejected(number, f"{length} positions (text + audio patches) exceed "
                                             f"the model's context of {max_length}"))
            continue
        seconds = declared["duration"]
        ref_seconds = None
        if "ref_audio" in columns:
            if "ref_duration" in columns:
                ref_seconds = declared["ref_duration"]
            elif reference is not None:
                ref_seconds = reference.size / float(sample_rate)
        samples.append(Sample(
            number, str(path), audio, ids, text, reference,
            estimate_seconds=audio.size / float(sample_rate) if seconds is None else seconds,
            ref_estimate_seconds=ref_seconds, is_prompt=prompt))
    return samples, rejected


DURATION_FIELDS = ("duration", "ref_duration")


def _declared_seconds(row: dict, field: str) -> float | None | str:
    """The row's declared ``field`` in seconds (None when absent or null), or why it is
    unusable. Numbers and numeric strings are read with ``float`` as upstream reads them."""
    value = row.get(field)
    if value is None:
        return None
    seconds = math.nan
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except (ValueError, OverflowError):
            pass
    if not math.isfinite(seconds) or seconds < 0:
        return (f'"{field}" must be a non-negative number of seconds, '
                f"not {json.dumps(value)[:40]}")
    return seconds


def _prompt_flag(row: dict) -> bool | str:
    """The row's ``is_prompt`` (False when absent or null), or why it is unusable: JSON
    booleans and the integers 0 and 1, which upstream's ``bool()`` reads as the same flag. Other
    values are refused rather than read as upstream would (``bool("false")`` is True)."""
    value = row.get("is_prompt")
    if value is None:
        return False
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    return f'"is_prompt" must be true or false, not {json.dumps(value)[:40]}'


def _resolve(manifest: Path, value: str) -> Path:
    path = Path(value)
    return path if path.is_absolute() else manifest.parent / path


def _longer_than_context(path: Path, reference: Path | None, sample_rate: int, text: int,
                         patch_len: int, max_length: int) -> str:
    """Why the row cannot fit the model's context by its audio files' headers alone (their
    fewest frames at ``sample_rate``), or ``""``: the file, its reference, or a header that
    refuses it (not a regular file, unreadable). The exact count follows decoding."""
    length = text + 2
    for which, file in (("", path), ("ref_audio: ", reference)):
        if file is None:
            continue
        header = read_header(file)
        if isinstance(header, str):
            return f"{which}{header} ({file})"
        length += -(-header.frames_at(sample_rate) // patch_len) + 2 * bool(which)
    if length > max_length:
        return (f"at least {length} positions (text + audio patches, by the audio's header) "
                f"exceed the model's context of {max_length}")
    return ""


def _load(path: Path, sample_rate: int) -> np.ndarray | str:
    """The samples, or why they are unusable."""
    try:
        audio = read_audio(path, sample_rate)
    except Exception as exc:  # soundfile/librosa raise many types for unreadable files
        return f"unreadable audio {path}: {exc}"
    if audio.size == 0 or not np.all(np.isfinite(audio)) or np.max(np.abs(audio)) < SILENCE_PEAK:
        return f"silent, empty or non-finite audio {path}"
    return audio


def batch_token_filter(samples: Sequence[Sample], *, frames_per_second: float, patch_size: int,
                       max_batch_tokens: int, batch_size: int
                       ) -> tuple[list[Sample], list[Rejected]]:
    """Drop rows upstream drops for ``max_batch_tokens`` (estimated length, from the samples'
    ``estimate_seconds``, over ``max_batch_tokens // batch_size``)."""
    if not max_batch_tokens or max_batch_tokens <= 0:
        return list(samples), []
    limit = max_batch_tokens // batch_size
    kept, dropped = [], []
    def patches(seconds: float) -> int:
        frames = math.ceil(float(seconds) * frames_per_second)
        return math.ceil(frames / patch_size)

    for sample in samples:
        length = len(sample.text_ids) + patches(sample.estimate_seconds) + 2
        ref_seconds = sample.ref_estimate_seconds
        if ref_seconds is not None and ref_seconds > 0:  # + ref patches, + 2 more special tokens
            length += patches(ref_seconds) + 2
        if length <= limit:
            kept.append(sample)
        else:
            dropped.append(Rejected(sample.line, f"about {length} tokens, over max_batch_tokens "
                                                 f"// batch_size = {limit}"))
    return kept, dropped


@attrs.frozen
class Batch:
    text_tokens: torch.Tensor   # (b, t) int32
    audio_feats: torch.Tensor   # (b, t, patch, feat) float32
    text_mask: torch.Tensor     # (b, t) int32
    audio_mask: torch.Tensor
    loss_mask: torch.Tensor
    labels: torch.Tensor


def encode_audio(vae, audio: np.ndarray, patch_size: int) -> torch.Tensor:
    """``(patches, patch, feat)`` latents of one utterance, right-padded to whole patches."""
    wav = torch.tensor(audio, dtype=torch.float32).view(1, 1, -1)
    patch_len = vae.hop_length * patch_size
    if wav.size(-1) % patch_len:
        wav = torch.nn.functional.pad(wav, (0, patch_len - wav.size(-1) % patch_len))
    with torch.no_grad():
        feats = vae.encode(wav.to(_device(vae)), vae.sample_rate).transpose(1, 2)
    return feats.reshape(feats.size(1) // patch_size, patch_size, feats.size(2))


def _device(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


def pack(samples: Sequence[Sample], latents: Sequence[torch.Tensor], max_length: int,
         ref_latents: Sequence[torch.Tensor | None] | None = None) -> Batch:
    """``[text, 101, audio patches, 102]`` per sample (``[103, reference patches, 104, ...]``
    in front when it has a reference; ``[text, 103, audio patches, 104]`` for a prompt row
    without one), padded with zeros to the longest.

    The stop label is on the last audio patch; the loss covers the target audio only (none of a
    prompt row's).
    """
    rows = []
    ref_latents = ref_latents or [None] * len(samples)
    for sample, feats, ref in zip(samples, latents, ref_latents, strict=True):
        if ref is not None:
            rows.append(_with_reference(sample, feats, ref))
            continue
        start, end = (PROMPT_START, PROMPT_END) if sample.is_prompt else (AUDIO_START, AUDIO_END)
        text = torch.tensor(sample.text_ids + (start,), dtype=torch.int32)
        n_text, n_audio = text.size(0), feats.size(0)
        tokens = torch.cat([text, torch.zeros(n_audio, dtype=torch.int32),
                            torch.tensor([end], dtype=torch.int32)])
        pad = torch.zeros((n_text,) + tuple(feats.shape[1:]), dtype=torch.float32)
        audio = torch.cat([pad, feats.to(torch.float32), pad[0:1]], dim=0)
        text_mask = torch.cat([torch.ones(n_text), torch.zeros(n_audio), torch.ones(1)])
        audio_mask = torch.cat([torch.zeros(n_text), torch.ones(n_audio), torch.zeros(1)])
        labels = torch.zeros(n_text + n_audio + 1, dtype=torch.int32)
        labels[-2] = 1
        loss_mask = torch.zeros_like(audio_mask) if sample.is_prompt else audio_mask
        rows.append((tokens, audio, text_mask.to(torch.int32), audio_mask.to(torch.int32),
                     loss_mask.to(torch.int32), labels))
    length = min(max_length, max(row[0].size(0) for row in rows))

    def padded(x: torch.Tensor) -> torch.Tensor:
        if x.size(0) >= length:
            return x[:length]
        return torch.cat([x, torch.zeros((length - x.size(0),) + tuple(x.shape[1:]),
                                         dtype=x.dtype)], dim=0)

    return Batch(*[torch.stack([padded(row[i]) for row in rows]) for i in range(6)])


def _with_reference(sample: Sample, feats: torch.Tensor, ref: torch.Tensor) -> tuple:
    """Upstream's ``process_tts_data_with_ref``: ``[103, 0×R, 104, text, 101, 0×A, 102]``."""
    n_text, n_ref, n_audio = len(sample.text_ids), ref.size(0), feats.size(0)

    def ids(values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32)

    tokens = torch.cat([ids([PROMPT_START]), torch.zeros(n_ref, dtype=torch.int32),
                        ids([PROMPT_END]), ids(sample.text_ids), ids([AUDIO_START]),
                        torch.zeros(n_audio, dtype=torch.int32), ids([AUDIO_END])])
    one = torch.zeros((1,) + tuple(feats.shape[1:]), dtype=torch.float32)
    text_zeros = torch.zeros((n_text,) + tuple(feats.shape[1:]), dtype=torch.float32)
    audio = torch.cat([one, ref.to(torch.float32), one, text_zeros, one,
                       feats.to(torch.float32), one], dim=0)
    text_mask = torch.cat([torch.ones(1), torch.zeros(n_ref), torch.ones(1), torch.ones(n_text),
                           torch.ones(1), torch.zeros(n_audio), torch.ones(1)]).to(torch.int32)
    audio_mask = torch.cat([torch.zeros(1), torch.ones(n_ref), torch.zeros(1),
                            torch.zeros(n_text), torch.zeros(1), torch.ones(n_audio),
                            torch.zeros(1)]).to(torch.int32)
    loss_mask = torch.cat([torch.zeros(1 + n_ref + 1), torch.zeros(n_text), torch.zeros(1),
                           torch.ones(n_audio), torch.zeros(1)]).to(torch.int32)
    labels = torch.zeros(tokens.size(0), dtype=torch.int32)
    labels[-2] = 1
    return tokens, audio, text_mask, audio_mask, loss_mask, labels
