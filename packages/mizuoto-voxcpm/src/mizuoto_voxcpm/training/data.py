"""The training data: a manifest's rows (core's `mizuoto.training.manifest`, with its typed
extras) read as upstream's ``datasets`` pipeline reads them, and the packed sequences its
``AudioFeatureProcessingPacker`` builds. (The epoch order: core's
`mizuoto.training.loader_order`.)

``"ref_audio"``, a recording of the voice, is prepended to the sequence
(``[103, reference patches, 104, text, 101, audio patches, 102]``, loss on the audio only);
``"is_prompt": true`` frames the audio by 103/104 and leaves it out of both losses
(``[text, 103, audio patches, 104]``), ignored on a row with a reference as upstream does.
``"duration"`` and ``"ref_duration"`` stand in for the measured lengths in upstream's
``max_batch_tokens`` estimate (``compute_sample_lengths``), the only place upstream reads
them (see ``Sample.estimate_seconds``). ``"dataset_id"`` only feeds upstream's per-dataset
counters and is ignored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
import torch

from mizuoto.training.manifest import RejectedRow, read_manifest_rows, usable_audio

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


def read_manifest(manifest: Path, *, sample_rate: int, tokenize, max_length: int,
                  patch_size: int, hop_length: int, field: str = "dataset"
                  ) -> tuple[list[Sample], list[RejectedRow]]:
    """Usable rows of a JSONL manifest or a ``metadata.csv`` (core's reader), decoded, and the
    rejected ones by line with their reasons (core's, or unreadable or silent audio, a
    sequence longer than the model's context)."""
    read = read_manifest_rows(manifest, typed_extras=True, headers=True, field=field)
    samples, rejected = [], read.rejected
    patch_len = hop_length * patch_size

    def patches(frames: int) -> int:
        return -(-frames // patch_len) + 2  # + the two tokens framing them

    for row in read.rows:
        ids = tuple(tokenize(row.text))
        # by the headers first (their fewest frames): a clip too long to keep is never decoded
        length = len(ids) + sum(patches(h.frames_at(sample_rate))
                                for h in (row.header, row.ref_header) if h is not None)
        audio = reference = None
        reason = (f"at least {length} positions (text + audio patches, by the audio's header) "
                  f"exceed the model's context of {max_length}") if length > max_length else ""
        if not reason:
            audio = usable_audio(row.audio, sample_rate)
            reference = row.ref_audio and usable_audio(row.ref_audio, sample_rate, "ref_audio: ")
            reason = next((x for x in (audio, reference) if isinstance(x, str)), "")
        if not reason:
            length = len(ids) + sum(patches(x.size) for x in (audio, reference) if x is not None)
            if length > max_length:
                reason = (f"{length} positions (text + audio patches) exceed the model's "
                          f"context of {max_length}")
        if reason:
            rejected.append(RejectedRow(row.line, reason, str(row.audio)))
            continue
        ref_seconds = None
        if "ref_audio" in read.columns:
            if "ref_duration" in read.columns:
                ref_seconds = row.ref_duration
            elif reference is not None:
                ref_seconds = reference.size / float(sample_rate)
        samples.append(Sample(
            row.line, str(row.audio), audio, ids, row.text, reference,
            estimate_seconds=audio.size / float(sample_rate) if row.duration is None
            else row.duration, ref_estimate_seconds=ref_seconds, is_prompt=row.is_prompt))
    return samples, sorted(rejected, key=lambda r: r.line)


def batch_token_filter(samples: Sequence[Sample], *, frames_per_second: float, patch_size: int,
                       max_batch_tokens: int, batch_size: int
                       ) -> tuple[list[Sample], list[RejectedRow]]:
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
            dropped.append(RejectedRow(sample.line, f"about {length} tokens, over max_batch_tokens "
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
