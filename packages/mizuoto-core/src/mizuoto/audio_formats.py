"""The audio formats Mizuoto writes: one table, from which every writer and front end derives.

``Audio.save``, ``mizuoto say`` (``-o``, ``--stream``), long-form, ``mizuoto batch --format``
and the server's ``response_format`` (whole and streamed) all read :data:`FORMATS` and write
through one writer, :func:`mizuoto.audio_encoding.open_writer`; a new format is added here,
once: its row names its encoder (a :class:`mizuoto.audio_encoders.Encoder`, by import path)
and says what every writer must know of it (how libsndfile writes it, the rates it can hold,
whether it keeps metadata, whether it can be handed out before the end).

This module sits below ``contracts``: it imports neither torch nor numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import attrs

from mizuoto.errors import InvalidRequest
from mizuoto.runtime.atomic import is_special


def _frozen(value: Mapping | None) -> Mapping:
    return MappingProxyType(dict(value or {}))


@attrs.frozen
class AudioFormat:
    """One output format.

    ``name``: its ``response_format`` / ``--format`` name. ``extensions``: file suffixes that
    select it (the first names batch files). ``soundfile``: libsndfile's (format, subtype) when
    libsndfile encodes it, with ``settings`` passed to ``SoundFile``; ``None`` when Mizuoto's
    own encoder does (raw PCM; AAC through PyAV). ``rates``: the sample rates it can hold
    (``None``: any); ``fallback_rate``: what other rates are resampled to. ``metadata``: it
    keeps Mizuoto's seed/license tags (WAV INFO, FLAC Vorbis comments). ``container``: it has a
    header (raw PCM has none). ``streamable``: its bytes can be handed out before the audio
    ends. ``needs``: the module its encoder imports, when it is an optional extra.
    ``encoder``: its :class:`~mizuoto.audio_encoders.Encoder`, as ``"module:Class"`` (imported
    when the first file of the format is written, so this table stays light).
    """

    name: str
    extensions: tuple[str, ...]
    media_type: str
    soundfile: tuple[str, str] | None = None
    settings: Mapping[str, object] = attrs.field(factory=dict, converter=_frozen)
    rates: tuple[int, ...] | None = None
    fallback_rate: int | None = None
    metadata: bool = False
    lossless: bool = False
    container: bool = True
    streamable: bool = True
    needs: str | None = None
    encoder: str = "mizuoto.audio_encoders:SoundfileEncoder"

    @property
    def extension(self) -> str:
        return self.extensions[0]

    def output_rate(self, sample_rate: int) -> int:
        """The rate audio of ``sample_rate`` Hz is written at in this format."""
        if self.rates is None or sample_rate in self.rates:
            return sample_rate
        return self.fallback_rate


#: Rates an MPEG layer III stream can have.
MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
#: Rates an ADTS AAC stream can signal.
AAC_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000)
#: Rates libsndfile's Opus encoder accepts.
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
#: The raw ``pcm`` format's rate: 16-bit little-endian mono at 24 kHz, as OpenAI clients assume.
PCM_RATE = 24000

_ENCODERS = "mizuoto.audio_encoders"

# Every format, by name, in the order error messages list them (a test adds a row of its own).
_TABLE: dict[str, AudioFormat] = {fmt.name: fmt for fmt in (
    # a WAV stream's header cannot wait for the length: its own encoder writes "unknown"
    AudioFormat("wav", (".wav",), "audio/wav", ("WAV", "PCM_16"), metadata=True, lossless=True,
                encoder=f"{_ENCODERS}:WavEncoder"),
    AudioFormat("flac", (".flac",), "audio/flac", ("FLAC", "PCM_16"), metadata=True,
                lossless=True,
                # libsndfile writes FLAC's header (STREAMINFO) last: nothing before the end
                streamable=False),
    # Constant bit rate (80 kbit/s at 24 kHz): a streamed MP3 has no Info frame, and decoders
    # then estimate its length from the bit rate, which only a constant one gets right.
    AudioFormat("mp3", (".mp3",), "audio/mpeg", ("MP3", "MPEG_LAYER_III"),
                {"bitrate_mode": "CONSTANT", "compression_level": 0.5}, MP3_RATES, 48000,
                encoder=f"{_ENCODERS}:Mp3Encoder"),
    AudioFormat("opus", (".opus", ".ogg"), "audio/ogg", ("OGG", "OPUS"), rates=OPUS_RATES,
                fallback_rate=48000),
    # libsndfile has no AAC encoder: AAC-LC in ADTS frames comes from PyAV's FFmpeg
    AudioFormat("aac", (".aac",), "audio/aac", rates=AAC_RATES, fallback_rate=48000,
                needs="av", encoder=f"{_ENCODERS}:AdtsEncoder"),
    AudioFormat("pcm", (".pcm",), "audio/pcm", rates=(PCM_RATE,), fallback_rate=PCM_RATE,
                lossless=True, container=False, encoder=f"{_ENCODERS}:PcmEncoder"),
)}

#: Every format, by name, in the order error messages list them.
FORMATS: Mapping[str, AudioFormat] = MappingProxyType(_TABLE)


class _ByExtension(Mapping):
    """The formats by file extension, indexed again only when the table's rows change (a test
    adds one)."""

    def __init__(self) -> None:
        self._rows: tuple[AudioFormat, ...] = ()
        self._by_extension: dict[str, AudioFormat] = {}

    def _index(self) -> dict[str, AudioFormat]:
        rows = tuple(_TABLE.values())
        if len(rows) != len(self._rows) or any(a is not b for a, b in zip(rows, self._rows, strict=True)):
            self._by_extension = {extension: fmt for fmt in rows
                                  for extension in fmt.extensions}
            self._rows = rows
        return self._by_extension

    def __getitem__(self, extension: str) -> AudioFormat:
        return self._index()[extension]

    def __iter__(self):
        return iter(self._index())

    def __len__(self) -> int:
        return len(self._index())


#: Every format by file extension.
BY_EXTENSION: Mapping[str, AudioFormat] = _ByExtension()


def extensions_text() -> str:
    """``.wav, .flac, .mp3, .opus, .ogg, .aac or .pcm``: for messages."""
    names = list(BY_EXTENSION)
    return f"{', '.join(names[:-1])} or {names[-1]}"


def format_named(name: str, field: str = "format") -> AudioFormat:
    """The format called ``name``; :class:`InvalidRequest` for ``field`` lists them all."""
    fmt = FORMATS.get(str(name).lower()) if isinstance(name, str) else None
    if fmt is None:
        raise InvalidRequest(field, f"{name!r} is not a format Mizuoto writes",
                             f"use one of {', '.join(FORMATS)}")
    return fmt


def format_for_path(path: str | Path, field: str = "output") -> AudioFormat:
    """The format a file's extension asks for; :class:`InvalidRequest` for ``field`` names the
    extension and lists every one Mizuoto writes. A device or FIFO (``/dev/stdout``, a pipe)
    without a known extension gets WAV."""
    suffix = Path(path).suffix
    fmt = BY_EXTENSION.get(suffix.lower())
    if fmt is None and is_special(Path(path)):
        return FORMATS["wav"]
    if fmt is None:
        what = f"{suffix} files" if suffix else "a file without an extension"
        raise InvalidRequest(field, f"cannot write {what} ({Path(path).name})",
                             f"name the file {extensions_text()}")
    return fmt
