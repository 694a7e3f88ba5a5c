"""Encoding audio into the formats of :mod:`mizuoto.audio_formats`: whole files, streams
chunk by chunk, and files on disk.

:class:`StreamEncoder` and :func:`encode` make the bytes the speech API sends: samples are
quantized once, here, for the 16-bit formats: ``rint(clip(x, -1, 1) * 32767)``
(:func:`to_int16`), so a client decoding WAV, FLAC or PCM gets exactly those integers; MP3 and
Opus take the float samples; AAC (in ADTS frames, streamable) comes from PyAV's FFmpeg (the
``serve`` extra installs it): libsndfile has no AAC encoder.

:func:`write_audio` writes a file (what ``Audio.save`` and ``SynthesisResult.save`` do): WAV
and FLAC through libsndfile with Mizuoto's metadata tags, every other format through
:func:`encode`, atomically.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from mizuoto.audio_formats import FORMATS, PCM_RATE, AudioFormat, format_for_path
from mizuoto.errors import InvalidRequest, NonFiniteAudio

#: The ``response_format`` values encoded here, and their media types.
MEDIA_TYPES = {name: fmt.media_type for name, fmt in FORMATS.items()}
#: Metadata keys the formats with tags can store (WAV INFO chunk, FLAC Vorbis comments).
METADATA_KEYS = ("title", "copyright", "software", "artist", "comment", "date", "album",
                 "license", "tracknumber", "genre")

__all__ = ["MEDIA_TYPES", "METADATA_KEYS", "PCM_RATE", "StreamEncoder", "encode", "output_rate",
           "to_int16", "wav_header", "write_audio"]


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
    ``hold_from`` on (see :class:`StreamEncoder`). A writer that never goes back (PyAV's ADTS
    muxer) gets ``keep_sent=False``: bytes handed out are dropped, so a stream of hours holds
    only what is not yet handed out, not the whole file.
    """

    def __init__(self, *, keep_sent: bool = True) -> None:
        self.buffer = bytearray()  # the file's bytes from offset ``start`` on
        self.start = 0
        self.position = 0
        self.sent = 0
        self._keep_sent = keep_sent

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

    def take(self, start: int = 0) -> bytes:
        """The bytes written since the last call, from offset ``start`` on."""
        begin = max(self.sent, start)
        data = bytes(self.buffer[begin - self.start:])
        self.sent = max(self.sent, self.size)
        if not self._keep_sent:
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
        return self._stream.resample_chunk(samples, last=last)


class _AacWriter:
    """AAC-LC in ADTS frames through PyAV: each encoded packet is a self-contained frame, so a
    stream hands them out as they come (the encoder holds about two frames of lookahead)."""

    def __init__(self, rate: int) -> None:
        try:
            import av
        except ImportError:
            raise RuntimeError("AAC needs PyAV: pip install 'mizuoto-core[serve]'") from None
        self._av = av
        self.sink = _Sink(keep_sent=False)  # ADTS frames are written once, in order
        self._container = av.open(self.sink, "w", format="adts")
        self._stream = self._container.add_stream("aac", rate=rate)
        self._stream.layout = "mono"
        self._rate = rate
        self._pts = 0

    def write(self, samples: np.ndarray) -> None:
        frame = self._av.AudioFrame.from_ndarray(
            np.ascontiguousarray(samples, dtype=np.float32)[None], format="fltp", layout="mono")
        frame.sample_rate = self._rate
        frame.pts = self._pts
        self._pts += samples.size
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def close(self) -> None:
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()


class StreamEncoder:
    """Encode audio chunk by chunk: :meth:`feed` returns the bytes ready so far, :meth:`close`
    the rest. Concatenated, they are a complete file of ``response_format``.

    What a stream can hand out early: PCM and WAV (a header of unknown length, then samples)
    every chunk; MP3 (constant bit rate) every frame, without LAME's leading Info frame (it is
    written last, so a stream has none — as in any live MP3 stream); Opus every Ogg page (about one second of
    audio); FLAC only at the end (libsndfile writes its header last, and cannot read a FLAC
    file without it).
    """

    def __init__(self, response_format: str, sample_rate: int, *, streaming: bool = True) -> None:
        if response_format not in FORMATS:
            raise ValueError(f"unsupported format {response_format!r}")
        fmt = FORMATS[response_format]
        self.format = response_format
        self._handed_out_early = fmt.streamable
        self.rate = fmt.output_rate(sample_rate)
        self._resample = _Resampler(sample_rate, self.rate)
        self._streaming = streaming
        self._frames = 0
        self._pcm: list[bytes] = []
        self._file = None
        self._sink = None
        self._hold_from = 0
        self._header_sent = False
        if response_format == "aac":
            self._file = _AacWriter(self.rate)
            self._sink = self._file.sink
        elif response_format not in ("pcm", "wav"):  # WAV's header and PCM are ours
            import soundfile as sf

            container, subtype = fmt.soundfile
            self._sink = _Sink()
            self._file = sf.SoundFile(self._sink, "w", self.rate, 1, format=container,
                                      subtype=subtype, **fmt.settings)

    def feed(self, samples: np.ndarray) -> bytes:
        return self._encode(self._resample(np.asarray(samples, dtype=np.float32)))

    def close(self) -> bytes:
        tail = self._encode(self._resample(np.zeros(0, np.float32), last=True))
        if self._file is not None:
            self._file.close()
            self._file = None
            return tail + self._sink.take(self._hold_from)
        if self.format == "wav" and not self._streaming:
            body = b"".join(self._pcm)
            return wav_header(self.rate, len(body)) + body
        return tail

    def _encode(self, samples: np.ndarray) -> bytes:
        if self.format in ("pcm", "wav"):
            data = to_int16(samples).tobytes()
            if self.format == "wav" and not self._streaming:
                self._pcm.append(data)  # the header needs the length: written at close
                return b""
            if self.format == "wav" and not self._header_sent:
                self._header_sent = True
                data = wav_header(self.rate, None) + data
            return data
        if samples.size:
            self._file.write(to_int16(samples) if self.format == "flac" else samples)
        if not self._streaming or not self._handed_out_early:
            return b""
        if self.format == "mp3" and self._hold_from == 0 and self._sink.size >= 4:
            # LAME's Info frame: a placeholder now, rewritten at close; a stream leaves it out
            self._hold_from = _mp3_frame_length(bytes(self._sink.buffer[:4]))
        if self.format == "mp3" and self._hold_from == 0:
            return b""
        return self._sink.take(self._hold_from)


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

    WAV and FLAC go through libsndfile: ``subtype`` is soundfile's (``"PCM_16"`` default,
    ``"PCM_24"``, ``"FLOAT"`` for WAV), float samples beyond ±1 are clipped by libsndfile, and
    ``metadata`` (keys :data:`METADATA_KEYS`) is stored. Every other format is mono, made by
    :func:`encode` (the server's bytes) and keeps no metadata. Returns the path. NaN or
    infinite samples raise :class:`~mizuoto.errors.NonFiniteAudio`; nothing is written.
    """
    import soundfile as sf

    from mizuoto.runtime.atomic import atomic_path

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
        encoded = encode(mono.astype(np.float32), int(sample_rate), fmt.name)
        with atomic_path(path) as tmp:
            tmp.write_bytes(encoded)
        return path
    frames = np.ascontiguousarray(data.T)
    container, default_subtype = fmt.soundfile
    with atomic_path(path) as tmp, sf.SoundFile(tmp, "w", samplerate=int(sample_rate),
                                                channels=frames.shape[1],
                                                subtype=subtype or default_subtype,
                                                format=container) as file:
        for key, value in (metadata or {}).items():
            setattr(file, key, str(value))
        file.write(frames)
    return path


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
