"""Speech editing as upstream F5-TTS's ``infer/speech_edit.py``: regenerate spans, keep the rest.

The whole recording becomes a mel condition. Each edited span ``(start, end)`` (seconds) is cut
out of it and replaced by zero frames, as many as the span lasted (or as its given new
duration); an edit mask marks the kept frames. The model then fills the zeroed frames while
reading the whole transcript after the edit, and the output spans the whole edited recording.

Upstream converts seconds to frames with Python's ``round`` (half to even), once per boundary,
so a span's frame count is not always ``round(duration * 24000 / 256)`` of its own length.
Unlike cloning, editing reads the recording as it is: no clipping, trimming or padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from mizuoto.errors import InvalidRequest
from mizuoto_f5tts.variants import HOP_LENGTH, SAMPLE_RATE


@attrs.frozen
class EditPlan:
    """The condition for one edit: ``mel_cond`` ``(1, frames, mels)`` with zeros where new
    speech goes, and ``edit_mask`` ``(1, frames)`` True on the kept frames."""

    mel_cond: torch.Tensor
    edit_mask: torch.Tensor

    @property
    def frames(self) -> int:
        return int(self.mel_cond.shape[1])


def _to_frames(seconds: float) -> int:
    return round(seconds * SAMPLE_RATE / HOP_LENGTH)


def plan_edit(original_mel: torch.Tensor, segments: Sequence[tuple[float, float]],
              new_durations: Sequence[float] | None = None) -> EditPlan:
    """Build the edit condition from the recording's mel ``(1, frames, mels)``.

    ``new_durations`` (seconds, one per segment) sets how long each regenerated span lasts;
    by default it lasts as long as the span it replaces.
    """
    if new_durations is not None and len(new_durations) != len(segments):
        raise InvalidRequest("params.edit_durations",
                             f"has {len(new_durations)} values for {len(segments)} segments",
                             "give one duration in seconds per segment")
    total = original_mel.shape[1]
    seconds = total * HOP_LENGTH / SAMPLE_RATE
    mels, device = original_mel.shape[-1], original_mel.device
    pieces: list[torch.Tensor] = []
    kept: list[torch.Tensor] = []
    offset = 0
    for index, (start, end) in enumerate(segments):
        start_frame, end_frame = _to_frames(start), _to_frames(end)
        if start_frame >= total:
            raise InvalidRequest("segments", f"({start}, {end}) starts after the recording "
                                 f"ends ({seconds:.2f} s)")
        duration = end - start if new_durations is None else new_durations[index]
        new_frames = _to_frames(duration)
        pieces += [original_mel[:, offset:start_frame],
                   torch.zeros(1, new_frames, mels, device=device, dtype=original_mel.dtype)]
        kept += [torch.ones(1, max(start_frame - offset, 0), dtype=torch.bool, device=device),
                 torch.zeros(1, new_frames, dtype=torch.bool, device=device)]
        offset = end_frame
    pieces.append(original_mel[:, offset:])
    mel_cond = torch.cat(pieces, dim=1)
    edit_mask = torch.cat(kept, dim=-1)
    # the tail after the last span is kept
    tail = mel_cond.shape[1] - edit_mask.shape[-1]
    edit_mask = torch.cat([edit_mask, torch.ones(1, tail, dtype=torch.bool, device=device)],
                          dim=-1)
    return EditPlan(mel_cond=mel_cond, edit_mask=edit_mask)
