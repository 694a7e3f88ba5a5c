"""The reference voice as upstream F5-TTS prepares it, sample for sample, without pydub.

Upstream (``preprocess_ref_audio_text`` and the start of ``infer_batch_process``) works on the
file's integer PCM samples through pydub: it cuts the recording at silences to at most 12 s,
trims silent edges, appends 50 ms of silence, writes a temporary WAV, reads it back as float,
averages the channels, raises quiet recordings to ``target_rms`` and resamples to 24 kHz.
:class:`~mizuoto_f5tts.pcm.PcmSegment` holds integer PCM with pydub's millisecond arithmetic (rounded lengths, slices
that pad up to 2 ms of zeros, ``audioop`` RMS), so each step here matches pydub exactly.

Decoding: WAV and FLAC in integer PCM are read exactly as pydub reads them (24-bit samples
become 32-bit as pydub converts them). Float WAV is rounded to 32-bit integers as ffmpeg does
for pydub. Other formats (MP3, OGG, ...) are decoded by libsndfile as 16-bit, which may differ
from ffmpeg's decoder. An in-memory :class:`~mizuoto.Audio` is taken as the 16-bit WAV that
soundfile would write from it.
"""

from __future__ import annotations

import io
import logging
import math
from importlib.resources import files
from pathlib import Path

import attrs
import numpy as np
import soundfile
import torch

from mizuoto.contracts.audio import Audio
from mizuoto.contracts.requests import Reference
from mizuoto.errors import InvalidAudio, InvalidRequest
from mizuoto.validation.audio import check_input_audio, check_sample_rate
from mizuoto_f5tts.pcm import PcmSegment, leading_silence_ms, split_on_silence
from mizuoto_f5tts.variants import SAMPLE_RATE

log = logging.getLogger(__name__)

MAX_REFERENCE_MS = 12000
_TAIL_SILENCE_MS = 50
_EDGE_THRESHOLD_DBFS = -42.0


@attrs.frozen
class PreparedReference:
    """A reference ready for the model.

    ``audio`` is mono float32 at 24 kHz, raised to the target RMS when quieter (shape
    ``[1, samples]``); ``rms`` is its RMS before that, which scales the output back down.
    ``text`` is the transcript as upstream's ``preprocess_ref_audio_text`` leaves it (ending in
    ". " or "。"); ``prompt_text`` is what the model reads (one more space after an ASCII end).
    ``source_samples`` / ``source_rate`` give the length of the prepared recording before
    resampling, which sets the chunk size of long texts.
    """

    audio: torch.Tensor
    rms: torch.Tensor
    text: str
    prompt_text: str
    source_samples: int
    source_rate: int
    target_rms: float = 0.1

    @property
    def raised(self) -> bool:
        """True when the reference was quieter than the target and was scaled up."""
        return bool(self.rms < self.target_rms)


# ---------------------------------------------------------------------------------------------
# Decoding


def _read_pcm(source: Audio | Path) -> PcmSegment:
    if isinstance(source, Audio):
        return _audio_as_pcm16(source.samples.numpy()[:, None], source.sample_rate)
    if not source.is_file():
        raise InvalidAudio("reference.audio", f"{source} does not exist",
                           "pass the path of a recording")
    try:
        info = soundfile.info(str(source))
    except (RuntimeError, soundfile.LibsndfileError, OSError) as exc:
        raise InvalidAudio("reference.audio", f"cannot read {source}: {exc}") from exc
    if info.frames == 0:
        raise InvalidAudio("reference.audio", f"{source} holds no samples")
    check_sample_rate(info.samplerate, "reference.audio", str(source))
    subtype = info.subtype
    if subtype == "PCM_16":
        return PcmSegment(_read(source, "int16").astype(np.int64), info.samplerate, 2)
    if subtype == "PCM_U8":
        # pydub reads 8-bit WAV as signed bytes (value - 128)
        return PcmSegment(_read(source, "int16").astype(np.int64) >> 8, info.samplerate, 1)
    if subtype == "PCM_S8":
        return PcmSegment(_read(source, "int16").astype(np.int64) >> 8, info.samplerate, 1)
    if subtype == "PCM_24":
        samples = _read(source, "int32").astype(np.int64)
        # pydub widens 24-bit samples to 32 bits with a low byte of 0xFF when negative
        samples = samples | np.where(samples < 0, 0xFF, 0)
        return PcmSegment(samples, info.samplerate, 4)
    if subtype == "PCM_32":
        return PcmSegment(_read(source, "int32").astype(np.int64), info.samplerate, 4)
    if subtype in ("FLOAT", "DOUBLE"):
        # pydub has ffmpeg convert float WAV to s32: llrintf(x * 2^31), clipped
        values = _read(source, "float32").astype(np.float64) * 2.0**31
        check_input_audio(values, info.samplerate, "reference.audio", str(source))
        samples = np.clip(np.rint(values), -(2**31), 2**31 - 1).astype(np.int64)
        return PcmSegment(samples, info.samplerate, 4)
    # compressed formats: pydub has ffmpeg decode them to 16-bit
    return PcmSegment(_read(source, "int16").astype(np.int64), info.samplerate, 2)


def _read(path: Path, dtype: str) -> np.ndarray:
    try:
        data, _ = soundfile.read(str(path), dtype=dtype, always_2d=True)
    except (RuntimeError, soundfile.LibsndfileError) as exc:
        raise InvalidAudio("reference.audio", f"cannot decode {path}: {exc}") from exc
    return data


def _audio_as_pcm16(samples: np.ndarray, rate: int) -> PcmSegment:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    buffer.seek(0)
    data, _ = soundfile.read(buffer, dtype="int16", always_2d=True)
    return PcmSegment(data.astype(np.int64), rate, 2)


def _trim_silent_edges(segment: PcmSegment,
                       threshold_dbfs: float = _EDGE_THRESHOLD_DBFS) -> PcmSegment:
    segment = segment.slice(leading_silence_ms(segment, threshold_dbfs), None)
    trailing = leading_silence_ms(segment.reverse(), threshold_dbfs)
    if trailing > 0:
        segment = segment.slice(None, len(segment) - trailing)
    return segment


def _join_until_limit(parts: list[PcmSegment]) -> PcmSegment:
    """Join parts while the result stays within 12 s (always at least 6 s of them)."""
    joined = PcmSegment.silent(0)
    for part in parts:
        if len(joined) > MAX_REFERENCE_MS // 2 and len(joined + part) > MAX_REFERENCE_MS:
            break
        joined = joined + part
    return joined


def clip_reference(segment: PcmSegment) -> PcmSegment:
    """Upstream's reference clipping: cut at a long silence (1 s below -50 dBFS), else at a
    short one (0.1 s below -40 dBFS), else hard at 12 s; trim the edges; add 50 ms silence."""
    clipped = _join_until_limit(split_on_silence(segment, 1000, -50, 1000, 10))
    if len(clipped) > MAX_REFERENCE_MS:
        clipped = _join_until_limit(split_on_silence(segment, 100, -40, 1000, 10))
    if len(clipped) > MAX_REFERENCE_MS:
        clipped = clipped.slice(None, MAX_REFERENCE_MS)
    if len(segment) > MAX_REFERENCE_MS:
        # upstream keeps the whole transcript for the clipped audio: the model then reads
        # words the reference does not say, which the user can only fix at the source
        log.warning("the reference recording is %.1f s: F5-TTS uses only its first %.1f s "
                    "(cut at a silence; the limit is %d s). Give a clip of at most %d s with "
                    "the transcript of just that part (--ref-text), or the output may repeat "
                    "or skip words", len(segment) / 1000, len(clipped) / 1000,
                    MAX_REFERENCE_MS // 1000, MAX_REFERENCE_MS // 1000)
    # upstream pads through audioop.ratecv: 1198 samples at 24 kHz, not 1200
    return _trim_silent_edges(clipped) + PcmSegment.silent(_TAIL_SILENCE_MS)


# ---------------------------------------------------------------------------------------------
# Text


def prepare_reference_text(text: str | None) -> str:
    """End the transcript as upstream does: with ". " unless it ends in ". " or "。"."""
    if text is None or not text.strip():
        raise InvalidRequest("reference.text", "is required by F5-TTS",
                             "give the transcript of the reference recording")
    if not text.endswith(". ") and not text.endswith("。"):
        text += " " if text.endswith(".") else ". "
    return text


def prompt_text(text: str) -> str:
    """The transcript as the model reads it: one more space after a 1-byte last character."""
    return text + " " if len(text[-1].encode("utf-8")) == 1 else text


# ---------------------------------------------------------------------------------------------
# The whole preparation


def check_audible(source: Audio | Path) -> None:
    """Refuse a reference that upstream's edge trimming would remove whole: every 10 ms of it
    below :data:`_EDGE_THRESHOLD_DBFS`. Upstream then keeps only its 50 ms of padding, whose
    RMS of zero turns the loudness matching into a division by zero; run before the model
    loads (``F5Engine.check_request``) as after it (:func:`prepare_pcm`)."""
    segment = _read_pcm(source)
    if leading_silence_ms(segment, _EDGE_THRESHOLD_DBFS) < len(segment):
        return
    loudest = max((segment.dbfs_of(start, start + 10) for start in range(0, len(segment), 10)),
                  default=-math.inf)
    level = "digital silence" if loudest == -math.inf else f"its loudest 10 ms are at " \
        f"{loudest:.0f} dBFS"
    raise InvalidAudio("reference.audio", f"is silent to F5-TTS: quieter than its "
                       f"{_EDGE_THRESHOLD_DBFS:.0f} dBFS edge trimming throughout ({level}), "
                       "so upstream would trim all of it away", "raise its level, e.g. ffmpeg -i ref.wav -af loudnorm "
                       "louder.wav, or record closer to the microphone")


def prepare_pcm(source: Audio | Path) -> tuple[torch.Tensor, int]:
    """The clipped, trimmed, padded reference as float32 ``[channels, samples]`` and its rate:
    what upstream reads back from its temporary WAV."""
    pcm = clip_reference(_read_pcm(source))
    waveform = pcm.to_float()
    if not bool(waveform.abs().amax() > 0):
        check_audible(source)  # names the level and the fix
        raise InvalidAudio("reference.audio", "is silent once trimmed",
                           "give a recording of the voice")
    return waveform, pcm.rate


# a saved voice holds the clipped reference (upstream keeps under 12 s): a minute is generous
_VOICE_SECONDS = 60
_VOICE_RATES = (1000, 384_000)
_RESAVE = "save the voice again from its recording (--save-voice)"


def check_voice(waveform: torch.Tensor, rate: int, text: str) -> None:
    """Refuse, naming the voice, a saved voice that is not what :func:`prepare_pcm` and
    :func:`prepare_reference_text` make: float ``[channels, samples]`` audio, not empty, not
    silent, finite, of a plausible rate and length, with a transcript."""
    shape = tuple(waveform.shape)
    if waveform.ndim != 2 or not 1 <= shape[0] <= 8 or shape[1] == 0:
        raise InvalidRequest("voice", f"its waveform has shape {shape}, not [channels, "
                             "samples] with audio in it", _RESAVE)
    if not waveform.is_floating_point():
        raise InvalidRequest("voice", f"its waveform is {waveform.dtype}, not float", _RESAVE)
    if not _VOICE_RATES[0] <= rate <= _VOICE_RATES[1]:
        raise InvalidRequest("voice", f"its sample rate {rate} is outside "
                             f"{_VOICE_RATES[0]}..{_VOICE_RATES[1]} Hz", _RESAVE)
    if shape[1] > _VOICE_SECONDS * rate:
        raise InvalidRequest("voice", f"its waveform is {shape[1] / rate:.0f} s long, more than "
                             f"{_VOICE_SECONDS} s", "save a voice from a shorter recording")
    if not bool(torch.isfinite(waveform).all()) or not bool(waveform.abs().amax() > 0):
        raise InvalidRequest("voice", "its waveform is silent or not finite", _RESAVE)
    if not text.strip():
        raise InvalidRequest("voice", "its reference text is empty", _RESAVE + " with the "
                             "recording's transcript")


def condition_audio(waveform: torch.Tensor, rate: int, target_rms: float,
                    resample) -> tuple[torch.Tensor, torch.Tensor]:
    """Average the channels, raise to ``target_rms`` when quieter (RMS measured before
    resampling, as upstream), and resample to 24 kHz. Returns ``(audio [1, n], rms)``."""
    audio = waveform
    if audio.shape[0] > 1:
        audio = torch.mean(audio, dim=0, keepdim=True)
    rms = torch.sqrt(torch.mean(torch.square(audio)))
    if rms < target_rms:
        audio = audio * target_rms / rms
    if rate != SAMPLE_RATE:
        audio = resample(audio, rate, SAMPLE_RATE)
    return audio, rms


def prepare_reference(source: Audio | Path, text: str | None, *, target_rms: float = 0.1,
                      resample=None) -> PreparedReference:
    """Prepare a reference recording and its transcript exactly as upstream F5-TTS does."""
    if resample is None:
        from mizuoto.nn.dsp.resample import resample
    prepared_text = prepare_reference_text(text)
    waveform, rate = prepare_pcm(source)
    return condition_prepared(waveform, rate, prepared_text, target_rms=target_rms,
                              resample=resample)


def condition_prepared(waveform: torch.Tensor, rate: int, prepared_text: str, *,
                       target_rms: float, resample) -> PreparedReference:
    """A prepared reference (clipped PCM at its own rate and its prepared transcript: what
    :func:`prepare_pcm` and :func:`prepare_reference_text` give, or a saved voice holds) made
    ready for sampling: loudness raised, resampled to 24 kHz."""
    audio, rms = condition_audio(waveform, rate, target_rms, resample)
    return PreparedReference(audio=audio, rms=rms, text=prepared_text,
                             prompt_text=prompt_text(prepared_text),
                             source_samples=int(waveform.shape[-1]), source_rate=rate,
                             target_rms=target_rms)


def default_voice() -> Reference:
    """Upstream's CLI default reference (``basic_ref_en.wav``), shipped with this package."""
    data = Path(str(files("mizuoto_f5tts").joinpath("data")))
    text = (data / "default_voice_en.txt").read_text(encoding="utf-8").strip()
    return Reference(data / "default_voice_en.wav", text=text)
