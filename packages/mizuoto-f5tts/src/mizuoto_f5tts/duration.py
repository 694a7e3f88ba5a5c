"""How long each chunk's mel is (upstream's estimate from the reference's speaking rate), and
whether the model's text positions cover it."""

from __future__ import annotations

from mizuoto.errors import InvalidRequest
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


# upstream CFM.sample's cap on frames
MAX_DURATION = 65536
#: Seconds of new speech a request may ask for: a minute, and a second per character more
#: (no one speaks slower). Upstream's estimate counts UTF-8 bytes (matched, for parity), so a
#: 16 KB text of emoji at speed 0.25 would otherwise ask for ~100 minutes of sampling; the
#: work a request may cost is bounded here, before any sampling.
BASE_REQUEST_SECONDS = 60.0
SECONDS_PER_CHARACTER = 1.0


def check_requested_seconds(durations: list[int], ref_frames: int, params: F5Params,
                            text: str) -> None:
    """Refuse a request whose chunks ask for more than :data:`BASE_REQUEST_SECONDS` +
    :data:`SECONDS_PER_CHARACTER` per character of ``text`` of new speech, naming what asked
    for it: ``params.fix_duration``, a slow ``params.speed``, or the text."""
    seconds = sum(max(0, frames - ref_frames) for frames in durations) * HOP_LENGTH / SAMPLE_RATE
    limit = BASE_REQUEST_SECONDS + SECONDS_PER_CHARACTER * len(text)
    if seconds <= limit:
        return
    asked = (f"asks for about {seconds:,.0f} s of speech for {len(text):,} characters, more "
             f"than the {limit:,.0f} s a request of that length may")
    if params.fix_duration is not None:
        raise InvalidRequest("params.fix_duration", f"{params.fix_duration:g} s {asked}",
                             f"give at most {limit:,.0f} s")
    if params.speed < 1 and seconds * params.speed <= limit:
        raise InvalidRequest("params.speed", f"{params.speed:g} {asked}",
                             "raise params.speed")
    raise InvalidRequest("text", asked, "send fewer symbols (each is estimated by its bytes)")


def positions_field(params: F5Params, text_len: int, prompt_len: int, cond_frames: int,
                    duration: int, reference_field: str) -> dict[str, str]:
    """What :func:`check_positions` should blame when a chunk does not fit: a fixed duration
    longer than the text and reference need; the reference's transcript (``reference_field``:
    ``reference.text``, or ``voice`` for a saved voice's) when its tokens fill most of the
    positions; else the text (the default)."""
    needed = max(text_len, cond_frames) + 1
    if params.fix_duration is not None and duration > needed:
        return {"field": "params.fix_duration", "fix": "lower fix_duration"}
    if text_len + 1 >= needed and prompt_len > text_len - prompt_len:
        return {"field": reference_field, "fix": "shorten the reference's transcript to what "
                "its audio says"}
    return {}


def check_positions(backbone, text_len: int, cond_frames: int, duration: int, what: str, *,
                    field: str = "text",
                    fix: str = "shorten the text or the reference, or raise params.speed"
                    ) -> None:
    """Refuse what upstream's DiT cannot run: more frames than its text position table
    (``field`` and ``fix`` name what the caller's request should change)."""
    from mizuoto.nn.transformer import DiT

    if not isinstance(backbone, DiT) or not backbone.text_embed.extra_modeling:
        return  # UNetT clamps positions past its table, as upstream; no conv layers, no table
    limit = backbone.text_embed.max_positions
    frames = min(max(max(text_len, cond_frames) + 1, duration), MAX_DURATION)
    if frames > limit:
        seconds = limit * HOP_LENGTH / SAMPLE_RATE
        raise InvalidRequest(
            field, f"{what} needs {frames} frames (reference included), more than the "
            f"{limit} ({seconds:.1f} s) this model's text positions cover", fix)
