"""How long each chunk's mel is: upstream's estimate from the reference's speaking rate."""

from __future__ import annotations

from mizuoto_f5tts.settings import F5Params
from mizuoto_f5tts.variants import HOP_LENGTH, SAMPLE_RATE


def chunk_durations(ref_frames: int, prompt_text: str, chunks: list[str],
                    params: F5Params) -> list[int]:
    """Total frames (reference + new speech) per chunk, as upstream estimates them."""
    if params.fix_duration is not None and len(chunks) > 1:
        # upstream shares a fixed total among the chunks by byte count (crossfades added)
        ref_seconds = ref_frames * HOP_LENGTH / SAMPLE_RATE
        weights = [len(c.encode("utf-8")) for c in chunks]
        spare = (params.fix_duration - ref_seconds
                 + params.cross_fade_duration * (len(chunks) - 1))
        fixed = [ref_seconds + spare * w / sum(weights) for w in weights]
    else:
        fixed = [params.fix_duration] * len(chunks)
    ref_bytes = len(prompt_text.encode("utf-8"))
    durations = []
    for chunk, fix in zip(chunks, fixed, strict=True):
        if fix is not None:
            durations.append(int(fix * SAMPLE_RATE / HOP_LENGTH))
            continue
        chunk_bytes = len(chunk.encode("utf-8"))
        speed = 0.3 if chunk_bytes < 10 else params.speed  # upstream: short text slowly
        durations.append(ref_frames + int(ref_frames / ref_bytes * chunk_bytes / speed))
    return durations
