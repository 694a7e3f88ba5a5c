"""Training audio judged by its header before it is decoded.

A manifest row may point at a 10-hour recording, a 48 kHz 8-channel file or ``/dev/zero``;
decoding it whole to learn that it is too long costs gigabytes (a 20-minute 48 kHz stereo
FLAC: +0.8 GB as float32, +1 GB as float64 before resampling). :func:`read_header` gives the
rate, channels and length soundfile reads from the header alone, or why the file is refused,
so that each trainer refuses a clip it would not keep before decoding any of it.
"""

from __future__ import annotations

import attrs

from mizuoto.regular_files import NotARegularFile, check_regular

#: Most channels of a training clip (a file claiming more is no recording anyone trains on).
MAX_CHANNELS = 32


@attrs.frozen
class AudioHeader:
    rate: int
    channels: int
    frames: int

    @property
    def seconds(self) -> float:
        return self.frames / self.rate

    def frames_at(self, rate: int) -> int:
        """The fewest frames the clip has once resampled to ``rate`` (one under the exact
        ratio: a resampler may round either way)."""
        return max(0, self.frames * rate // self.rate - 1)


def read_header(path) -> AudioHeader | str:
    """The header of the audio file at ``path``, or why it is refused (not a regular file,
    unreadable, no rate, too many channels)."""
    import soundfile as sf

    try:
        check_regular(path)
        info = sf.info(str(path))
    except NotARegularFile as exc:
        return str(exc)
    except Exception as exc:  # soundfile raises several unrelated types
        return f"unreadable audio: {exc}"
    if info.samplerate <= 0 or info.frames <= 0:
        return "no samples"
    if not 0 < info.channels <= MAX_CHANNELS:
        return f"{info.channels} channels, more than {MAX_CHANNELS}"
    return AudioHeader(info.samplerate, info.channels, info.frames)
