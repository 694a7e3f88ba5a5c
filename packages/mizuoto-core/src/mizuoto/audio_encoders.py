"""The encoders the rows of :mod:`mizuoto.audio_formats` name: each writes one format's bytes
at a rate the format holds (:func:`mizuoto.audio_encoding.open_writer` resamples first).

libsndfile writes WAV, FLAC, MP3 and Opus (:class:`SoundfileEncoder`); Mizuoto writes raw PCM
and a streamed WAV's header itself; AAC-LC in ADTS frames comes from PyAV's FFmpeg (the
``serve`` extra), since libsndfile has no AAC encoder. A new format whose bytes Mizuoto writes
subclasses :class:`BytesEncoder` and implements ``write``; its row names it
(``encoder="package.module:Class"``), in this module or any other.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import attrs
import numpy as np

from mizuoto.audio_formats import AudioFormat

__all__ = ["WAV_MAX_DATA_BYTES", "AdtsEncoder", "BytesEncoder", "Encoder", "Mp3Encoder",
           "PcmEncoder", "SoundfileEncoder", "WavEncoder", "WriteSettings", "to_int16",
           "wav_container", "wav_header"]


#: The largest data chunk a plain WAV file can describe: its size fields are 32 bits, and
#: the header and the metadata tags (well under 64 KiB) count too. Longer audio (about 12.4 h
#: of 16-bit audio at 24 kHz) is written as RF64, WAV's 64-bit form.
WAV_MAX_DATA_BYTES = 0xFFFFFFFF - (1 << 16)


#: Bytes per sample of libsndfile's subtypes, for the size a WAV's data will have.
_SAMPLE_BYTES = {"PCM_U8": 1, "PCM_S8": 1, "PCM_16": 2, "PCM_24": 3, "PCM_32": 4, "FLOAT": 4,
                 "DOUBLE": 8}



def to_int16(samples: np.ndarray) -> np.ndarray:
    """Float samples to 16-bit integers: clipped to [-1, 1], scaled by 32767, rounded."""
    return np.rint(np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2")



def wav_header(sample_rate: int, data_bytes: int | None) -> bytes:
    """A 44-byte 16-bit mono WAV header; ``data_bytes=None`` (a stream of unknown length)
    writes the sizes as 0xFFFFFFFF, which decoders read as "up to the end of the data"."""
    data = 0xFFFFFFFF if data_bytes is None else data_bytes
    riff = 0xFFFFFFFF if data_bytes is None else 36 + data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data))



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
