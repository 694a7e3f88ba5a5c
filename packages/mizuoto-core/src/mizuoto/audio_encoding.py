# Long on purpose: every encoder the format table names and the one writer that drives them,
# read together when a format is added (split the encoders out at the next one).
"""Encoding audio into the formats of :mod:`mizuoto.audio_formats`, through one writer.

:func:`open_writer` opens an :class:`AudioWriter` on a path (written atomically) or a binary
file: it resamples to a rate the format holds and hands the samples to the encoder the format's
row names (an :class:`Encoder`: libsndfile for WAV, FLAC, MP3 and Opus; Mizuoto's own raw PCM
and streamed WAV header; AAC-LC in ADTS frames from PyAV's FFmpeg, which the ``serve`` extra
installs, since libsndfile has no AAC encoder). Every front end writes through it:

- :func:`write_audio` (``Audio.save``, ``SynthesisResult.save``) and long-form's last pass:
  files, WAV and FLAC with Mizuoto's metadata tags;
- :func:`write_stream` (``mizuoto say --stream``): a file written chunk by chunk as it comes;
- :class:`StreamEncoder` and :func:`encode` (the speech API, streamed and whole): samples are
  quantized once, here, for the 16-bit formats: ``rint(clip(x, -1, 1) * 32767)``
  (:func:`to_int16`), so a client decoding WAV, FLAC or PCM gets exactly those integers.
"""

from __future__ import annotations

import contextlib
import importlib
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import attrs
import numpy as np

from mizuoto.audio_formats import FORMATS, PCM_RATE, AudioFormat, format_for_path, format_named
from mizuoto.errors import InvalidRequest, NonFiniteAudio


class _MediaTypes(Mapping):
    """Each format's media type, read from the table at each look-up."""

    def __getitem__(self, name: str) -> str:
        return FORMATS[name].media_type

    def __iter__(self) -> Iterator[str]:
        return iter(FORMATS)

    def __len__(self) -> int:
        return len(FORMATS)


#: The ``response_format`` values encoded here, and their media types.
MEDIA_TYPES: Mapping[str, str] = _MediaTypes()
#: Metadata keys the formats with tags can store (WAV INFO chunk, FLAC Vorbis comments).
METADATA_KEYS = ("title", "copyright", "software", "artist", "comment", "date", "album",
                 "license", "tracknumber", "genre")

#: The largest data chunk a plain WAV file can describe: its size fields are 32 bits, and
#: the header and the metadata tags (well under 64 KiB) count too. Longer audio (about 12.4 h
#: of 16-bit audio at 24 kHz) is written as RF64, WAV's 64-bit form.
WAV_MAX_DATA_BYTES = 0xFFFFFFFF - (1 << 16)
#: Bytes per sample of libsndfile's subtypes, for the size a WAV's data will have.
_SAMPLE_BYTES = {"PCM_U8": 1, "PCM_S8": 1, "PCM_16": 2, "PCM_24": 3, "PCM_32": 4, "FLOAT": 4,
                 "DOUBLE": 8}

__all__ = ["MEDIA_TYPES", "METADATA_KEYS", "PCM_RATE", "AudioWriter", "BytesEncoder", "Encoder",
           "StreamEncoder", "WriteSettings", "encode", "open_writer", "output_rate", "to_int16",
           "wav_header", "write_audio", "write_stream"]


def to_int16(samples: np.ndarray) -> np.ndarray:
    """Float samples to 16-bit integers: clipped to [-1, 1], scaled by 32767, rounded."""
    return np.rint(np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2")


def output_rate(response_format: str, sample_rate: int) -> int:
    """The sample rate the encoded audio has for a model speaking at ``sample_rate``."""
    return FORMATS[response_format].output_rate(sample_rate)


def wav_header(sample_rate: int, data_bytes: int | None) -> bytes:
    """A 44-byte 16-bit mono WAV header; ``data_bytes=None`` (a stream of unknown length)
    writes the sizes as 0xFFFFFFFF, which decoders read as "up to the end of the data"."""
    data = 0xFFFFFFFF if data_bytes is None else data_bytes
    riff = 0xFFFFFFFF if data_bytes is None else 36 + data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data))


class _Sink:
    """A seekable in-memory file for libsndfile that hands out its bytes as they are written.

    libsndfile goes back at close to fill in headers (FLAC's STREAMINFO, MP3's Info frame):
    bytes already handed out cannot change, so a stream only hands out bytes from
    ``hold_from`` on (see :class:`StreamEncoder`). An encoder that never goes back (PyAV's
    ADTS muxer, raw PCM, a streamed WAV: :attr:`Encoder.goes_back` False) gets
    ``keep_sent=False``: bytes handed out are dropped, so a stream of hours holds only what is
    not yet handed out, not the whole file.
    """

    def __init__(self, *, keep_sent: bool = True) -> None:
        self.buffer = bytearray()  # the file's bytes from offset ``start`` on
        self.start = 0
        self.position = 0
        self.sent = 0
        self.keep_sent = keep_sent

    @property
    def size(self) -> int:
        """The file's length so far."""
        return self.start + len(self.buffer)

    def write(self, data) -> int:
        data = bytes(data)
        if self.position < self.start:
            raise OSError(f"cannot write at byte {self.position}: bytes before {self.start} "
                          "were handed out and dropped")
        begin, end = self.position - self.start, self.position - self.start + len(data)
        if end > len(self.buffer):
            self.buffer.extend(b"\0" * (end - len(self.buffer)))
        self.buffer[begin:end] = data
        self.position += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.position, 2: self.size}[whence]
        self.position = base + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def read(self, size: int = -1) -> bytes:
        begin = max(self.position, self.start) - self.start
        end = len(self.buffer) if size < 0 else begin + size
        data = bytes(self.buffer[begin:end])
        self.position = self.start + begin + len(data)
        return data

    def head(self, size: int) -> bytes:
        """The file's first ``size`` bytes, as far as written (and not dropped)."""
        return bytes(self.buffer[:max(0, size - self.start)]) if self.start == 0 else b""

    def take(self, start: int = 0) -> bytes:
        """The bytes written since the last call, from offset ``start`` on."""
        begin = max(self.sent, start)
        data = bytes(self.buffer[begin - self.start:])
        self.sent = max(self.sent, self.size)
        if not self.keep_sent:
            del self.buffer[:self.sent - self.start]
            self.start = self.sent
        return data


def _mp3_frame_length(header: bytes) -> int:
    """Length in bytes of the MPEG layer III frame starting with ``header`` (4 bytes)."""
    version = (header[1] >> 3) & 3  # 3: MPEG-1, 2: MPEG-2, 0: MPEG-2.5
    bitrate_index, rate_index = header[2] >> 4, (header[2] >> 2) & 3
    padding = (header[2] >> 1) & 1
    if version == 3:
        kbps = (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320)[bitrate_index]
        rate = (44100, 48000, 32000)[rate_index]
        return 144000 * kbps // rate + padding
    kbps = (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)[bitrate_index]
    rate = (22050, 24000, 16000)[rate_index] // (1 if version == 2 else 2)
    return 72000 * kbps // rate + padding


class _Resampler:
    """soxr's streaming resampler, or nothing when the rates agree."""

    def __init__(self, rate: int, new_rate: int) -> None:
        self._stream = None
        if rate != new_rate:
            import soxr

            self._stream = soxr.ResampleStream(rate, new_rate, 1, dtype="float32")

    def __call__(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        if self._stream is None:
            return samples
        return self._stream.resample_chunk(np.asarray(samples, dtype=np.float32), last=last)


@attrs.frozen
class WriteSettings:
    """What a writer is asked for besides the format and rate.

    ``channels``: 1, or more for the formats with metadata (WAV, FLAC). ``metadata``: tags
    (:data:`METADATA_KEYS`), kept by the formats with metadata and ignored by the others.
    ``subtype``: libsndfile's sample type, where the format has a choice (``None``: the row's).
    ``quantize``: 16-bit samples are :func:`to_int16`'s integers (the speech API's promise)
    rather than libsndfile's own conversion of the floats (what files have always held).
    ``stream``: the bytes are read while they are written, so nothing may wait for the end
    (a WAV header then says "length unknown"). ``frames``: how many frames will come, when
    known (a WAV too long for 32-bit sizes is then written as RF64).
    """

    channels: int = 1
    metadata: Mapping[str, str] | None = None
    subtype: str | None = None
    quantize: bool = False
    stream: bool = False
    frames: int | None = None


class Encoder:
    """Writes one format's bytes to ``file`` (a binary file object, or a path) at ``rate``.

    A format's row names its encoder; the writer resamples first, so an encoder only sees
    rates its format holds. Subclasses implement :meth:`write` and :meth:`close`.
    """

    #: It goes back in the file to finish a header at close: a stream must then keep what it
    #: has handed out (see :class:`_Sink`).
    goes_back = True

    def __init__(self, file: BinaryIO | Path, fmt: AudioFormat, rate: int,
                 settings: WriteSettings) -> None:
        self.format = fmt
        self.rate = rate
        self.settings = settings

    def write(self, samples: np.ndarray) -> None:
        """Encode ``(frames,)`` or ``(frames, channels)`` samples (float, or int16/int32 where
        libsndfile takes them)."""
        raise NotImplementedError

    def flush(self) -> None:
        """Push what is encoded so far to the file (``say --stream``: readable as it grows)."""

    def close(self) -> None:
        raise NotImplementedError

    def stream_start(self, head: bytes) -> int | None:
        """The first byte of the file a stream hands out, given the file's first bytes so far;
        None while that is not known yet."""
        return 0


class BytesEncoder(Encoder):
    """An encoder that writes the bytes itself, in order, to :attr:`file` (a file object, or
    one it opens on a path): a new format of this kind implements :meth:`write` only."""

    goes_back = False

    def __init__(self, file, fmt, rate, settings) -> None:
        super().__init__(file, fmt, rate, settings)
        self._owned = open(file, "wb") if isinstance(file, (str, Path)) else None
        self.file = self._owned or file

    def flush(self) -> None:
        with contextlib.suppress(AttributeError):
            self.file.flush()

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()


class PcmEncoder(BytesEncoder):
    """Raw 16-bit little-endian samples, no header (OpenAI's ``pcm``)."""

    def write(self, samples: np.ndarray) -> None:
        self.file.write(to_int16(samples).tobytes())


class SoundfileEncoder(Encoder):
    """libsndfile writes the row's ``soundfile`` (container, subtype) with its ``settings``,
    and the metadata tags where the format keeps them."""

    def __init__(self, file, fmt, rate, settings) -> None:
        import soundfile as sf

        super().__init__(file, fmt, rate, settings)
        container, subtype = fmt.soundfile
        subtype = settings.subtype or subtype
        self._quantize = settings.quantize and subtype == "PCM_16"
        self._file = sf.SoundFile(file, "w", samplerate=rate, channels=settings.channels,
                                  format=self.container(container, subtype), subtype=subtype,
                                  **fmt.settings)
        if fmt.metadata:
            for key, value in (settings.metadata or {}).items():
                setattr(self._file, key, str(value))

    def container(self, container: str, subtype: str) -> str:
        """libsndfile's container for this file (the row's)."""
        return container

    def write(self, samples: np.ndarray) -> None:
        self._file.write(to_int16(samples) if self._quantize else samples)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class Mp3Encoder(SoundfileEncoder):
    """libsndfile's LAME. Its first frame is an Info frame, a placeholder rewritten at close:
    a stream leaves it out (as in any live MP3 stream)."""

    def stream_start(self, head: bytes) -> int | None:
        return _mp3_frame_length(head[:4]) if len(head) >= 4 else None


class WavEncoder(SoundfileEncoder):
    """libsndfile's WAV, RF64 when the data will not fit 32-bit sizes; a stream's header is
    Mizuoto's, with its sizes "unknown" (libsndfile would write them at close)."""

    def __init__(self, file, fmt, rate, settings) -> None:
        self._stream = None
        if settings.stream:
            Encoder.__init__(self, file, fmt, rate, settings)
            self._stream = PcmEncoder(file, fmt, rate, settings)
            self._stream.file.write(wav_header(rate, None))
            self.goes_back = False
        else:
            super().__init__(file, fmt, rate, settings)

    def container(self, container: str, subtype: str) -> str:
        frames = self.settings.frames
        data_bytes = 0 if frames is None else \
            frames * self.settings.channels * _SAMPLE_BYTES.get(subtype, 8)
        return wav_container(data_bytes)

    def write(self, samples: np.ndarray) -> None:
        (self._stream or super()).write(samples)

    def flush(self) -> None:
        (self._stream or super()).flush()

    def close(self) -> None:
        (self._stream or super()).close()


def wav_container(data_bytes: int) -> str:
    """libsndfile's container for a WAV of ``data_bytes`` of audio: RF64 past
    :data:`WAV_MAX_DATA_BYTES` (libsndfile would write 0xFFFFFFFF, which readers take for
    2**31 - 1 frames)."""
    return "RF64" if data_bytes > WAV_MAX_DATA_BYTES else "WAV"


class AdtsEncoder(BytesEncoder):
    """AAC-LC in ADTS frames through PyAV: each encoded packet is a self-contained frame, so a
    stream hands them out as they come (the encoder holds about two frames of lookahead)."""

    def __init__(self, file, fmt, rate, settings) -> None:
        try:
            import av
        except ImportError:
            raise RuntimeError("AAC needs PyAV: pip install 'mizuoto-core[serve]'") from None
        super().__init__(file, fmt, rate, settings)
        self._av = av
        self._container = av.open(self.file, "w", format="adts")
        self._stream = self._container.add_stream("aac", rate=rate)
        self._stream.layout = "mono"
        self._pts = 0

    def write(self, samples: np.ndarray) -> None:
        frame = self._av.AudioFrame.from_ndarray(
            np.ascontiguousarray(samples, dtype=np.float32)[None], format="fltp", layout="mono")
        frame.sample_rate = self.rate
        frame.pts = self._pts
        self._pts += samples.size
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def close(self) -> None:
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        super().close()


def _encoder_class(fmt: AudioFormat) -> type[Encoder]:
    module, _, name = fmt.encoder.partition(":")
    return getattr(importlib.import_module(module), name)


class AudioWriter:
    """An open output of one format: :meth:`write` samples as they come, then :meth:`close`
    (or use it as a context manager: an error leaves no file behind at a path)."""

    def __init__(self, encoder: Encoder, resample: _Resampler, files: contextlib.ExitStack
                 ) -> None:
        self.encoder = encoder
        self.format = encoder.format
        #: the rate written (the format's, when it cannot hold the input's)
        self.rate = encoder.rate
        self._resample = resample
        self._files = files
        self._closed = False

    def write(self, samples) -> None:
        samples = self._resample(np.asarray(samples))
        if samples.size:
            self.encoder.write(samples)

    def flush(self) -> None:
        self.encoder.flush()

    def close(self) -> None:
        """Encode what the resampler holds, finish the file and (at a path) move it into
        place."""
        if self._closed:
            return
        self._closed = True
        with self._files:
            tail = self._resample(np.zeros(0, np.float32), last=True)
            if tail.size:
                self.encoder.write(tail)
            self.encoder.close()

    def abort(self, error: BaseException) -> None:
        """Give the output up: at a path, nothing is left behind."""
        if not self._closed:
            self._closed = True
            self._files.__exit__(type(error), error, error.__traceback__)

    def __enter__(self) -> AudioWriter:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if error is None:
            self.close()
        else:
            self.abort(error)


def open_writer(target: str | Path | BinaryIO, fmt: AudioFormat | str, rate: int,
                settings: WriteSettings | None = None) -> AudioWriter:
    """An :class:`AudioWriter` of ``fmt`` (a row of :data:`~mizuoto.audio_formats.FORMATS`, or
    its name) for audio at ``rate`` Hz, written to ``target``: a path (atomically: the file
    appears when the writer closes) or a binary file object. The audio is resampled to
    ``fmt.output_rate(rate)`` where the format cannot hold ``rate``."""
    from mizuoto.runtime.atomic import atomic_path

    fmt = fmt if isinstance(fmt, AudioFormat) else format_named(fmt)
    settings = settings or WriteSettings()
    files = contextlib.ExitStack()
    try:
        if isinstance(target, (str, Path)):
            target = files.enter_context(atomic_path(Path(target)))
        new_rate = fmt.output_rate(rate)
        encoder = _encoder_class(fmt)(target, fmt, new_rate, settings)
    except BaseException:
        files.close()
        raise
    return AudioWriter(encoder, _Resampler(rate, new_rate), files)


class StreamEncoder:
    """Encode audio chunk by chunk: :meth:`feed` returns the bytes ready so far, :meth:`close`
    the rest. Concatenated, they are a complete file of ``response_format``.

    What a stream can hand out early (``streaming``; the row's ``streamable``): PCM and WAV (a
    header of unknown length, then samples) every chunk; MP3 (constant bit rate) every frame,
    without LAME's leading Info frame (:class:`Mp3Encoder`); Opus every Ogg page (about one
    second of audio); FLAC only at the end (libsndfile writes its header last, and cannot read
    a FLAC file without it).
    """

    def __init__(self, response_format: str, sample_rate: int, *, streaming: bool = True) -> None:
        if response_format not in FORMATS:
            raise ValueError(f"unsupported format {response_format!r}")
        fmt = FORMATS[response_format]
        self.format = response_format
        self._streaming = streaming
        self._handed_out_early = streaming and fmt.streamable
        self._sink = _Sink()
        self._writer = open_writer(self._sink, fmt, sample_rate,
                                   WriteSettings(quantize=True, stream=streaming))
        self._sink.keep_sent = self._writer.encoder.goes_back
        self.rate = self._writer.rate
        self._hold_from: int | None = None  # where the handed-out bytes begin, once known

    def feed(self, samples: np.ndarray) -> bytes:
        self._writer.write(np.asarray(samples, dtype=np.float32))
        if not self._handed_out_early:
            return b""
        if self._hold_from is None:
            self._hold_from = self._writer.encoder.stream_start(self._sink.head(4))
            if self._hold_from is None:
                return b""
        return self._sink.take(self._hold_from)

    def close(self) -> bytes:
        self._writer.close()
        return self._sink.take(self._hold_from or 0)


def encode(samples: np.ndarray, sample_rate: int, response_format: str) -> bytes:
    """A whole file of ``response_format`` holding ``samples`` (mono float32)."""
    encoder = StreamEncoder(response_format, sample_rate, streaming=False)
    return encoder.feed(samples) + encoder.close()


def write_audio(
    path: str | Path,
    samples,
    sample_rate: int,
    *,
    metadata: Mapping[str, str] | None = None,
    subtype: str | None = None,
    file_format: AudioFormat | None = None,
) -> Path:
    """Write ``(samples,)`` or ``(channels, samples)`` audio to ``path``, atomically, in the
    format its extension names (:mod:`mizuoto.audio_formats`; ``file_format`` overrides it).

    The formats with metadata (WAV, FLAC) take any channel count and libsndfile's conversion:
    ``subtype`` is soundfile's (``"PCM_16"`` default, ``"PCM_24"``, ``"FLOAT"`` for WAV),
    float samples beyond ±1 are clipped, and ``metadata`` (keys :data:`METADATA_KEYS`) is
    stored. Every other format is mono, the bytes the server sends (:func:`encode`), and keeps
    no metadata. Returns the path. NaN or infinite samples raise
    :class:`~mizuoto.errors.NonFiniteAudio`; nothing is written.
    """
    import soundfile as sf

    path = Path(path)
    fmt = file_format or format_for_path(path)
    if subtype is not None and not (fmt.metadata and sf.check_format(fmt.soundfile[0], subtype)):
        choices = sf.available_subtypes(fmt.soundfile[0]) if fmt.metadata else {}
        raise InvalidRequest("subtype", f"{fmt.name} cannot hold {subtype!r}",
                             f"use one of {', '.join(choices)}" if choices
                             else "leave it unset: the format has its own")
    unknown = sorted(set(metadata or {}) - set(METADATA_KEYS))
    if unknown:
        raise InvalidRequest("metadata", f"unsupported keys {unknown}",
                             f"use {', '.join(METADATA_KEYS)}")
    data = _frames(samples)
    _check_finite(data, f"audio written to {path.name}")
    if not fmt.metadata:
        if data.shape[0] != 1:
            raise InvalidRequest("samples", f"{fmt.name} is written mono here, got "
                                 f"{data.shape[0]} channels", "mix down, or write .wav/.flac")
        mono = data[0]
        if not np.issubdtype(mono.dtype, np.floating):  # integer PCM scaled as soundfile reads it
            mono = mono / float(-np.iinfo(mono.dtype).min)
        data = mono.astype(np.float32)[None]
    settings = WriteSettings(channels=data.shape[0], metadata=metadata, subtype=subtype,
                             quantize=not fmt.metadata, frames=data.shape[1])
    with open_writer(path, fmt, int(sample_rate), settings) as writer:
        writer.write(np.ascontiguousarray(data.T) if fmt.metadata else data[0])
    return path


def write_stream(chunks: Iterable, path: str | Path, sample_rate: int, *,
                 field: str = "output",
                 on_chunk: Callable[[int, float], None] | None = None):
    """Write a stream of :class:`~mizuoto.AudioChunk` to ``path`` as it comes (atomically: the
    file appears once the stream has ended), in the format its extension names (an unknown
    one is an :class:`InvalidRequest` for ``field``). Each chunk is flushed to the file as it
    is written; ``on_chunk(chunks_written, seconds_written)`` follows each. Returns the last
    chunk's ``applied`` (None for an empty stream). WAV and FLAC keep no metadata here: the
    tags come from ``applied``, known only at the end."""
    fmt = format_for_path(path, field)
    applied, seconds = None, 0.0
    with open_writer(path, fmt, int(sample_rate)) as writer:
        for index, chunk in enumerate(chunks, 1):
            writer.write(chunk.audio.numpy())
            writer.flush()
            seconds += chunk.audio.duration
            if on_chunk is not None:
                on_chunk(index, seconds)
            if chunk.is_last:
                applied = chunk.applied
    return applied


def _frames(samples) -> np.ndarray:
    """``samples`` as a ``(channels, samples)`` numpy array of a type libsndfile writes."""
    if hasattr(samples, "detach"):  # a torch tensor: torch is not imported for numpy input
        import torch

        if samples.dtype not in (torch.float32, torch.float64, torch.int16, torch.int32):
            samples = samples.float()  # bfloat16 / float16 have no numpy or libsndfile type
        samples = samples.detach().cpu().numpy()
    data = np.asarray(samples)
    if data.ndim == 1:
        data = data[None]
    if data.ndim != 2:
        raise ValueError(f"expected (samples,) or (channels, samples), got shape {data.shape}")
    if data.dtype not in (np.float32, np.float64, np.int16, np.int32):
        data = data.astype(np.float32)
    return data


def _check_finite(data: np.ndarray, stage: str) -> None:
    # numpy's own check: this module sits below contracts (whose check_finite takes tensors)
    if np.issubdtype(data.dtype, np.floating) and not np.isfinite(data).all():
        raise NonFiniteAudio(stage, int(np.isnan(data).sum()), int(np.isinf(data).sum()),
                             data.size)
