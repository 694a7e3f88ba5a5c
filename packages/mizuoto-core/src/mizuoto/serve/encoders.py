"""Audio encoders for the speech API: WAV, FLAC, MP3, Opus in Ogg and raw PCM, whole or chunk by
chunk, all through libsndfile (``soundfile``) and soxr, which core already depends on.

Samples are quantized once, here, for the 16-bit formats: ``rint(clip(x, -1, 1) * 32767)``
(:func:`to_int16`), so a client decoding WAV, FLAC or PCM gets exactly those integers.
MP3 and Opus take the float samples. AAC (in ADTS frames, streamable) comes from PyAV's FFmpeg
(the ``serve`` extra installs it): libsndfile has no AAC encoder.
"""

from __future__ import annotations

import struct

import numpy as np

#: The ``response_format`` values this server encodes, and their media types.
MEDIA_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "aac": "audio/aac",
}
#: The raw ``pcm`` format's rate: 16-bit little-endian mono at 24 kHz, as OpenAI clients assume.
PCM_RATE = 24000
#: Rates libsndfile's Opus encoder accepts; other rates are resampled to 48 kHz.
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
#: Rates an MPEG layer III stream can have; other rates are resampled to 48 kHz.
MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
#: Rates an ADTS AAC stream can signal; other rates are resampled to 48 kHz.
AAC_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000)

_SOUNDFILE = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"),
              "opus": ("OGG", "OPUS")}
# Constant bit rate (80 kbit/s at 24 kHz): a streamed MP3 has no Info frame, and decoders then
# estimate its length from the bit rate, which only a constant one gets right.
_SETTINGS = {"mp3": {"bitrate_mode": "CONSTANT", "compression_level": 0.5}}


def to_int16(samples: np.ndarray) -> np.ndarray:
    """Float samples to 16-bit integers: clipped to [-1, 1], scaled by 32767, rounded."""
    return np.rint(np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2")


def output_rate(response_format: str, sample_rate: int) -> int:
    """The sample rate the encoded audio has for a model speaking at ``sample_rate``."""
    if response_format == "pcm":
        return PCM_RATE
    if response_format == "opus" and sample_rate not in OPUS_RATES:
        return 48000
    if response_format == "mp3" and sample_rate not in MP3_RATES:
        return 48000
    if response_format == "aac" and sample_rate not in AAC_RATES:
        return 48000
    return sample_rate


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
    ``hold_from`` on (see :class:`StreamEncoder`)."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.position = 0
        self.sent = 0

    def write(self, data) -> int:
        data = bytes(data)
        end = self.position + len(data)
        if end > len(self.buffer):
            self.buffer.extend(b"\0" * (end - len(self.buffer)))
        self.buffer[self.position:end] = data
        self.position = end
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.position, 2: len(self.buffer)}[whence]
        self.position = base + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def read(self, size: int = -1) -> bytes:
        end = len(self.buffer) if size < 0 else self.position + size
        data = bytes(self.buffer[self.position:end])
        self.position += len(data)
        return data

    def take(self, start: int = 0) -> bytes:
        """The bytes written since the last call, from offset ``start`` on."""
        begin = max(self.sent, start)
        data = bytes(self.buffer[begin:])
        self.sent = max(self.sent, len(self.buffer))
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
        self.sink = _Sink()
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
        if response_format not in MEDIA_TYPES:
            raise ValueError(f"unsupported format {response_format!r}")
        self.format = response_format
        self.rate = output_rate(response_format, sample_rate)
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
        elif response_format in _SOUNDFILE:
            import soundfile as sf

            container, subtype = _SOUNDFILE[response_format]
            self._sink = _Sink()
            self._file = sf.SoundFile(self._sink, "w", self.rate, 1, format=container,
                                      subtype=subtype, **_SETTINGS.get(response_format, {}))

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
        if not self._streaming or self.format == "flac":
            return b""
        if self.format == "mp3" and self._hold_from == 0 and len(self._sink.buffer) >= 4:
            # LAME's Info frame: a placeholder now, rewritten at close; a stream leaves it out
            self._hold_from = _mp3_frame_length(bytes(self._sink.buffer[:4]))
        if self.format == "mp3" and self._hold_from == 0:
            return b""
        return self._sink.take(self._hold_from)


def encode(samples: np.ndarray, sample_rate: int, response_format: str) -> bytes:
    """A whole file of ``response_format`` holding ``samples`` (mono float32)."""
    encoder = StreamEncoder(response_format, sample_rate, streaming=False)
    return encoder.feed(samples) + encoder.close()
