"""Encoding audio into the formats of :mod:`mizuoto.audio_formats`, through one writer.

:func:`open_writer` opens an :class:`AudioWriter` on a path (written atomically) or a binary
file: it resamples to a rate the format holds and hands the samples to the encoder the format's
row names (an :class:`~mizuoto.audio_encoders.Encoder`, in :mod:`mizuoto.audio_encoders`).
Every front end writes through it:

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
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np

from mizuoto.audio_encoders import (
    BytesEncoder,
    Encoder,
    WriteSettings,
    to_int16,
    wav_header,
)
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


__all__ = ["MEDIA_TYPES", "METADATA_KEYS", "PCM_RATE", "AudioWriter", "BytesEncoder", "Encoder",
           "StreamEncoder", "WriteSettings", "encode", "open_writer", "output_rate", "to_int16",
           "wav_header", "write_audio", "write_stream"]


def output_rate(response_format: str, sample_rate: int) -> int:
    """The sample rate the encoded audio has for a model speaking at ``sample_rate``."""
    return FORMATS[response_format].output_rate(sample_rate)


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
