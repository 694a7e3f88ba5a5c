"""The F5-TTS engine: reference voice + text -> mel by flow matching -> Vocos -> 24 kHz audio.

The pipeline follows upstream f5-tts 1.1.22 (``utils_infer.infer_process`` /
``infer_batch_process``, ``api.F5TTS.infer``, ``infer/speech_edit.py``) step for step, so that
on the same weights, seed and threads the audio is identical. Where upstream is not
deterministic (chunks in a thread pool drawing from one global generator) we take the order
it would have with one worker: the chunks draw their noise in order from one generator seeded
once per request, as ``F5TTS.infer`` seeds the global one.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Literal

import attrs
import numpy as np
import torch

from mizuoto.contracts.audio import Audio
from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.engine import Engine, ModelInfo
from mizuoto.contracts.progress import ProgressCallback, report
from mizuoto.contracts.ranges import check_number, number_in
from mizuoto.contracts.requests import (
    MAX_SEGMENT_SECONDS,
    EditRequest,
    Reference,
    SynthesisRequest,
)
from mizuoto.contracts.results import Applied, SynthesisResult, check_finite
from mizuoto.contracts.voice import Voice
from mizuoto.errors import InvalidRequest, ModelFilesMissing
from mizuoto.options import Options
from mizuoto.runtime.device import emulated_dtype_warning, select_device, select_dtype
from mizuoto.runtime.seeds import resolve_seed
from mizuoto.runtime.threads import apply_cpu_threads
from mizuoto_f5tts import editing, reference
from mizuoto_f5tts.chunking import chunk_text, max_chunk_bytes
from mizuoto_f5tts.text import to_tokens, token_ids

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
HOP_LENGTH = 256
DEFAULT_STEPS = 32
DEFAULT_GUIDANCE = 2.0
LICENSE = "CC-BY-NC-4.0"
VOCOS_FILES = ("vocos/config.yaml", "vocos/pytorch_model.bin")
# Vocos tiles when decoding runs out of memory (frames; overlap frames shared by neighbours).
TILE_FRAMES, TILE_OVERLAP = 256, 32
_MAX_DURATION = 65536  # upstream CFM.sample's cap on frames
_VOICE_TEXT = "reference_text"
# Ranges of the params (docs/engines/f5tts.md, Settings); durations are in seconds.
SPEED_RANGE = (0.1, 10.0)
MAX_CROSS_FADE = 10.0


def _boolean(instance, attribute, value):
    if not isinstance(value, bool):
        raise InvalidRequest(f"params.{attribute.name}", f"must be true or false, got {value!r}")


def _durations(value):
    if value is None:
        return None
    if isinstance(value, (int, float)):
        value = (value,)
    if not isinstance(value, (list, tuple)):
        raise InvalidRequest("params.edit_durations", "must be a list of seconds, one per segment")
    for seconds in value:
        check_number("params.edit_durations", seconds, 0.0, MAX_SEGMENT_SECONDS, low_open=True)
    return tuple(float(v) for v in value)


def _param(name: str, low: float, high: float, **kwargs):
    return number_in(f"params.{name}", low, high, **kwargs)


@attrs.frozen
class F5Params:
    """F5-TTS settings of one request (``SynthesisRequest.params`` / ``EditRequest.params``).

    Defaults are upstream's. ``speed`` scales the estimated duration (a chunk under 10 bytes
    is spoken at 0.3, as upstream does); ``fix_duration`` (seconds) is the total length of
    reference + generated audio instead of the estimate. ``cross_fade_duration`` (seconds)
    joins chunks of long text. ``target_rms`` is the loudness a quiet reference is raised to
    (and the output lowered back from). ``method`` is the ODE solver; ``use_epss`` uses the
    pruned time grid for 5, 6, 7, 10, 12 or 16 steps; ``sway_sampling_coef`` (None: off)
    crowds the steps near the noise. ``remove_silence`` applies upstream's optional
    post-processing (cut silences over 1 s down to 0.5 s each side, on 16-bit samples).
    ``edit_durations`` (editing only) gives each regenerated span its new length in seconds.
    ``tiled_decode`` forces the Vocos tile decoding used as the out-of-memory fallback.
    Ranges (finite numbers): ``sway_sampling_coef`` [-1, 1], ``speed`` [0.1, 10],
    ``fix_duration`` and each of ``edit_durations`` (0, 3600], ``cross_fade_duration`` [0, 10],
    ``target_rms`` (0, 1].
    """

    sway_sampling_coef: float | None = attrs.field(
        default=-1.0, validator=_param("sway_sampling_coef", -1.0, 1.0, optional=True))
    speed: float = attrs.field(default=1.0, validator=_param("speed", *SPEED_RANGE))
    fix_duration: float | None = attrs.field(
        default=None, validator=_param("fix_duration", 0.0, MAX_SEGMENT_SECONDS, low_open=True,
                                       optional=True))
    cross_fade_duration: float = attrs.field(
        default=0.15, validator=_param("cross_fade_duration", 0.0, MAX_CROSS_FADE))
    target_rms: float = attrs.field(default=0.1,
                                    validator=_param("target_rms", 0.0, 1.0, low_open=True))
    method: Literal["euler", "midpoint"] = attrs.field(default="euler")
    use_epss: bool = attrs.field(default=True, validator=_boolean)
    remove_silence: bool = attrs.field(default=False, validator=_boolean)
    edit_durations: tuple[float, ...] | None = attrs.field(default=None, converter=_durations)
    tiled_decode: bool = attrs.field(default=False, validator=_boolean)

    @method.validator
    def _method(self, attribute, value):
        if value not in ("euler", "midpoint"):
            raise InvalidRequest("params.method", f"must be euler or midpoint, got {value!r}")


@attrs.frozen
class F5Options:
    """``engines.f5tts.*`` options: ``variant`` (``auto`` detects it from the checkpoint)."""

    variant: str = attrs.field(default="auto")

    @variant.validator
    def _variant(self, attribute, value):
        from mizuoto_f5tts.variants import VARIANT_NAMES

        if value != "auto" and value not in VARIANT_NAMES:
            raise InvalidRequest("engines.f5tts.variant",
                                 f"must be auto or one of {', '.join(VARIANT_NAMES)}, "
                                 f"got {value!r}")


def default_voice() -> Reference:
    """Upstream's CLI default reference (``basic_ref_en.wav``), shipped with this package."""
    data = Path(str(files("mizuoto_f5tts").joinpath("data")))
    text = (data / "default_voice_en.txt").read_text(encoding="utf-8").strip()
    return Reference(data / "default_voice_en.wav", text=text)


def _fingerprint(checkpoint: Path, vocab: dict[str, int]) -> str:
    """Identity of the weights: name, size and the first and last MiB of the checkpoint, and
    the vocabulary (a voice's tokens depend on it)."""
    digest = hashlib.sha256()
    size = checkpoint.stat().st_size
    digest.update(f"{checkpoint.name}:{size}".encode())
    with open(checkpoint, "rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(0, size - (1 << 20)))
        digest.update(handle.read(1 << 20))
    digest.update("\n".join(sorted(vocab)).encode())
    return digest.hexdigest()


class F5Engine(Engine):
    """F5-TTS v1 Base, F5-TTS Base and E2-TTS Base, with Vocos."""

    name = "f5tts"
    params_class = F5Params
    options_class = F5Options
    compute_options = frozenset({"device", "dtype", "cpu_threads", "oom_fallback"})

    def __init__(self, *, model, vocab: dict[str, int], vocoder, info: ModelInfo,
                 oom_fallback: bool = True, load_warnings: tuple[str, ...] = ()) -> None:
        self.model = model
        self.vocab = vocab
        self.vocoder = vocoder
        self._info = info
        self._resamplers: dict[tuple[int, int], torch.nn.Module] = {}
        self._oom_fallback = oom_fallback
        self._load_warnings = load_warnings

    # -- loading --------------------------------------------------------------------------

    @classmethod
    def recognizes(cls, model_dir: Path) -> bool:
        model_dir = Path(model_dir)
        has_checkpoint = any(model_dir.glob("*.safetensors")) or any(model_dir.glob("*.pt"))
        return has_checkpoint and all((model_dir / name).is_file() for name in VOCOS_FILES)

    @classmethod
    def load(cls, model_dir: Path, *, options: Options | None = None,
             model_id: str | None = None, progress: ProgressCallback | None = None) -> F5Engine:
        from mizuoto_f5tts.checkpoint import (
            auto_dtype,
            find_checkpoint,
            load_f5_model,
            load_vocos,
        )

        model_dir = Path(model_dir)
        options = options or Options()
        engine_options = options.engine_options(cls)
        compute = options.compute
        missing = [name for name in VOCOS_FILES if not (model_dir / name).is_file()]
        if not any(model_dir.glob("*.safetensors")) and not any(model_dir.glob("*.pt")):
            missing.insert(0, "model_<step>.safetensors (the F5-TTS checkpoint)")
        if missing:
            raise ModelFilesMissing(str(model_dir), missing,
                                    "an F5-TTS model directory holds the checkpoint, vocab.txt "
                                    "and vocos/config.yaml + vocos/pytorch_model.bin")
        apply_cpu_threads(compute)
        device = select_device(compute)
        dtype = select_dtype(compute, device, auto=auto_dtype)
        variant = None if engine_options.variant == "auto" else engine_options.variant
        if variant is None and model_id is not None:
            variant = _catalog_variant(model_id)
        report(progress, "load", 0, 2, "flow-matching model")
        checkpoint = find_checkpoint(model_dir)
        model, vocab = load_f5_model(model_dir, variant, device=device, dtype=dtype)
        report(progress, "load", 1, 2, "vocoder")
        vocoder = load_vocos(model_dir / "vocos", device=device)
        report(progress, "load", 2, 2)
        catalog_weights = model_id is not None and _catalog_variant(model_id) is not None
        capabilities = frozenset({Capability.ZERO_SHOT, Capability.CLONE, Capability.EDIT,
                                  Capability.LONG_TEXT, Capability.VOICE_CACHE})
        variant_name = _variant_name(model)
        info = ModelInfo(
            engine=cls.name,
            model=model_id or str(model_dir),
            variant=variant_name,
            sample_rate=SAMPLE_RATE,
            dtype=str(model.dtype).removeprefix("torch."),
            device=str(device),
            capabilities=capabilities,
            license=LICENSE if catalog_weights else None,
            non_commercial=catalog_weights,
            fingerprint=_fingerprint(checkpoint, vocab),
        )
        # only when asked for: auto is float32 on the CPU, as upstream
        slow = emulated_dtype_warning(model.dtype, device, setting="compute.dtype",
                                      speedup="several times")
        if slow:
            log.warning("%s", slow)
        return cls(model=model, vocab=vocab, vocoder=vocoder, info=info,
                   oom_fallback=compute.oom_fallback, load_warnings=(slow,) if slow else ())

    @property
    def info(self) -> ModelInfo:
        return self._info

    # -- references and voices ------------------------------------------------------------

    def _resample(self, audio: torch.Tensor, rate: int, new_rate: int) -> torch.Tensor:
        # torchaudio.transforms.Resample as upstream builds it: float64 kernel cast to float32
        from mizuoto.nn.dsp.resample import SincResampler

        if (rate, new_rate) not in self._resamplers:
            self._resamplers[rate, new_rate] = SincResampler(rate, new_rate)
        return self._resamplers[rate, new_rate](audio)

    def _prepared_pcm(self, ref: Reference) -> tuple[torch.Tensor, int, str]:
        text = reference.prepare_reference_text(ref.text)
        waveform, rate = reference.prepare_pcm(ref.audio)
        return waveform, rate, text

    def _condition(self, waveform: torch.Tensor, rate: int, text: str,
                   params: F5Params) -> reference.PreparedReference:
        audio, rms = reference.condition_audio(waveform, rate, params.target_rms, self._resample)
        return reference.PreparedReference(
            audio=audio, rms=rms, text=text, prompt_text=reference.prompt_text(text),
            source_samples=int(waveform.shape[-1]), source_rate=rate,
            target_rms=params.target_rms)

    def build_voice(self, reference_: Reference) -> Voice:
        """A saved voice: the reference prepared as upstream prepares it (clipped, trimmed,
        padded, at its own rate) and its transcript. Loudness and resampling are applied when
        it is used, so a voice speaks exactly like its reference with any ``target_rms``."""
        waveform, rate, text = self._prepared_pcm(reference_)
        return Voice(engine=self.name, model_fingerprint=self.info.fingerprint,
                     sample_rate=rate, tensors={"waveform": waveform.contiguous()},
                     texts={_VOICE_TEXT: text}, meta={"variant": self.info.variant})

    def _reference_for(self, request: SynthesisRequest, params: F5Params,
                       warnings: list[str]) -> reference.PreparedReference:
        if request.voice is not None:
            voice = request.voice
            voice.check(self.name, self.info.fingerprint)
            if "waveform" not in voice.tensors or _VOICE_TEXT not in voice.texts:
                raise InvalidRequest("voice", "is not an F5-TTS voice (no waveform/text)",
                                     "build it with this engine's build_voice")
            return self._condition(voice.tensors["waveform"].to(torch.float32),
                                   voice.sample_rate, voice.texts[_VOICE_TEXT], params)
        ref = request.reference
        if ref is None:
            ref = default_voice()
            warnings.append("no reference given: spoke with the default voice "
                            "(upstream's basic_ref_en.wav)")
        waveform, rate, text = self._prepared_pcm(ref)
        return self._condition(waveform, rate, text, params)

    # -- synthesis ------------------------------------------------------------------------

    def synthesize(self, request: SynthesisRequest, *,
                   progress: ProgressCallback | None = None) -> SynthesisResult:
        if request.instruction is not None:
            self.require(Capability.DESIGN)
        params = self.parse_params(request.params)
        if params.edit_durations is not None:
            raise InvalidRequest("params.edit_durations", "applies to editing only")
        steps = request.steps or DEFAULT_STEPS
        guidance = DEFAULT_GUIDANCE if request.guidance is None else float(request.guidance)
        seed, drawn = resolve_seed(request.seed)
        warnings: list[str] = []
        fallbacks: list[str] = []

        prepared = self._reference_for(request, params, warnings)
        max_bytes = max_chunk_bytes(prepared.text, prepared.source_samples,
                                    prepared.source_rate, params.speed)
        chunks = chunk_text(request.text, max_bytes)
        if not chunks:
            raise InvalidRequest("text", "has nothing to speak after splitting")
        durations = self._chunk_durations(prepared, chunks, params)
        token_batches = [token_ids(to_tokens(prepared.prompt_text + chunk), self.vocab)[None]
                         for chunk in chunks]
        cond_frames = prepared.audio.shape[-1] // HOP_LENGTH + 1
        for index, (tokens, frames) in enumerate(zip(token_batches, durations, strict=True)):
            self._check_positions(tokens.shape[-1], cond_frames, frames,
                                  f"chunk {index + 1} of {len(chunks)}")

        generator = torch.Generator(device=self.model.device).manual_seed(seed)
        cond = prepared.audio.to(self.model.device)
        ref_frames = prepared.audio.shape[-1] // HOP_LENGTH
        waves: list[np.ndarray] = []
        for index, (chunk, tokens, frames) in enumerate(
                zip(chunks, token_batches, durations, strict=True)):
            report(progress, "chunk", index, len(chunks), chunk)
            with _step_progress(self.model, progress, steps, params.method):
                mel, _ = self.model.sample(
                    cond, tokens, frames, steps=steps, cfg_strength=guidance,
                    sway_sampling_coef=params.sway_sampling_coef, use_epss=params.use_epss,
                    method=params.method, generator=generator)
            stage = f" (chunk {index + 1} of {len(chunks)})" if len(chunks) > 1 else ""
            check_finite(mel, f"f5tts sampler{stage}")
            mel = mel.to(torch.float32)[:, ref_frames:, :].permute(0, 2, 1)
            wave = self._vocode(mel, params, fallbacks)
            check_finite(wave, f"f5tts vocoder{stage}")
            if prepared.raised:
                wave = wave * prepared.rms / params.target_rms
            waves.append(wave.squeeze().cpu().numpy())
        report(progress, "chunk", len(chunks), len(chunks))

        samples = _join_chunks(waves, params.cross_fade_duration)
        if params.remove_silence:
            from mizuoto_f5tts.silence import remove_silence

            trimmed = remove_silence(samples, SAMPLE_RATE)
            if len(trimmed):
                samples = trimmed
            else:  # upstream would write an empty file
                warnings.append("remove_silence found only silence: the audio is kept as "
                                "generated")
        samples = samples.astype(np.float32, copy=False)
        applied = self._applied(seed, drawn, steps, guidance, params, len(chunks), fallbacks,
                                warnings)
        return SynthesisResult(Audio(torch.from_numpy(samples), SAMPLE_RATE), applied)

    def _chunk_durations(self, prepared: reference.PreparedReference, chunks: list[str],
                         params: F5Params) -> list[int]:
        """Total frames (reference + new speech) per chunk, as upstream estimates them."""
        ref_frames = prepared.audio.shape[-1] // HOP_LENGTH
        if params.fix_duration is not None and len(chunks) > 1:
            # upstream shares a fixed total among the chunks by byte count (crossfades added)
            ref_seconds = ref_frames * HOP_LENGTH / SAMPLE_RATE
            weights = [len(c.encode("utf-8")) for c in chunks]
            spare = (params.fix_duration - ref_seconds
                     + params.cross_fade_duration * (len(chunks) - 1))
            fixed = [ref_seconds + spare * w / sum(weights) for w in weights]
        else:
            fixed = [params.fix_duration] * len(chunks)
        ref_bytes = len(prepared.prompt_text.encode("utf-8"))
        durations = []
        for chunk, fix in zip(chunks, fixed, strict=True):
            if fix is not None:
                durations.append(int(fix * SAMPLE_RATE / HOP_LENGTH))
                continue
            chunk_bytes = len(chunk.encode("utf-8"))
            speed = 0.3 if chunk_bytes < 10 else params.speed  # upstream: short text slowly
            durations.append(ref_frames + int(ref_frames / ref_bytes * chunk_bytes / speed))
        return durations

    def _check_positions(self, text_len: int, cond_frames: int, duration: int,
                         what: str) -> None:
        """Refuse what upstream's DiT cannot run: more frames than its text position table."""
        from mizuoto.nn.transformer import DiT

        backbone = self.model.transformer
        if not isinstance(backbone, DiT):
            return  # UNetT clamps positions past its table, as upstream
        limit = backbone.text_embed.max_positions
        frames = min(max(max(text_len, cond_frames) + 1, duration), _MAX_DURATION)
        if frames > limit:
            seconds = limit * HOP_LENGTH / SAMPLE_RATE
            raise InvalidRequest(
                "text", f"{what} needs {frames} frames (reference included), more than the "
                f"{limit} ({seconds:.1f} s) this model's text positions cover",
                "shorten the text or the reference, or raise params.speed")

    def _vocode(self, mel: torch.Tensor, params: F5Params, fallbacks: list[str]) -> torch.Tensor:
        from mizuoto.nn.dsp.tiles import decode_tiled

        if params.tiled_decode:
            return self._decode_tiled(mel, decode_tiled, fallbacks)
        try:
            return self.vocoder.decode(mel)
        except torch.OutOfMemoryError:
            if not self._oom_fallback:
                raise
            log.warning("Vocos ran out of memory on %d frames: decoding in tiles",
                        mel.shape[-1])
            if mel.is_cuda:
                torch.cuda.empty_cache()
            return self._decode_tiled(mel, decode_tiled, fallbacks)

    def _decode_tiled(self, mel, decode_tiled, fallbacks: list[str]) -> torch.Tensor:
        if "vocos_tiled" not in fallbacks:
            fallbacks.append("vocos_tiled")
        return decode_tiled(self.vocoder.decode, mel, tile=TILE_FRAMES, overlap=TILE_OVERLAP,
                            hop=HOP_LENGTH)

    def _applied(self, seed: int, drawn: bool, steps: int, guidance: float, params: F5Params,
                 chunks: int, fallbacks: list[str], warnings: list[str], **extra) -> Applied:
        sampler = {"steps": steps, "guidance": guidance, "sway": params.sway_sampling_coef,
                   "method": params.method, "epss": params.use_epss, "speed": params.speed}
        return Applied(
            engine=self.name, model=self.info.model, seed=seed, seed_drawn=drawn,
            dtype=self.info.dtype, device=self.info.device, sampler=sampler,
            fallbacks=tuple(fallbacks), warnings=self._load_warnings + tuple(warnings),
            license=self.info.license,
            non_commercial=self.info.non_commercial, chunks=chunks, extra=extra)

    # -- editing --------------------------------------------------------------------------

    def edit(self, request: EditRequest, *,
             progress: ProgressCallback | None = None) -> SynthesisResult:
        """Regenerate ``request.segments`` of the recording so it says ``request.text``."""
        from mizuoto.nn.dsp.audio_io import read_audio

        params = self.parse_params(request.params)
        steps = request.steps or DEFAULT_STEPS
        guidance = DEFAULT_GUIDANCE if request.guidance is None else float(request.guidance)
        seed, drawn = resolve_seed(request.seed)
        fallbacks: list[str] = []
        source = request.reference.audio
        if isinstance(source, Audio):
            waveform, rate = source.samples[None], source.sample_rate
        else:
            waveform, rate = read_audio(source, field="reference.audio")
        # upstream's speech_edit reads the recording as it is (torchaudio.load): no clipping
        audio, rms = reference.condition_audio(waveform, rate, params.target_rms, self._resample)
        original_mel = self.model.mel_spec(audio.to(self.model.device)).permute(0, 2, 1)
        plan = editing.plan_edit(original_mel, request.segments, params.edit_durations)
        tokens = token_ids(to_tokens(request.text), self.vocab)[None]
        self._check_positions(tokens.shape[-1], plan.frames, plan.frames, "the edited recording")
        generator = torch.Generator(device=self.model.device).manual_seed(seed)
        with _step_progress(self.model, progress, steps, params.method):
            mel, _ = self.model.sample(
                plan.mel_cond, tokens, plan.frames, steps=steps, cfg_strength=guidance,
                sway_sampling_coef=params.sway_sampling_coef, use_epss=params.use_epss,
                method=params.method, generator=generator, edit_mask=plan.edit_mask)
        check_finite(mel, "f5tts sampler")
        wave = self._vocode(mel.to(torch.float32).permute(0, 2, 1), params, fallbacks)
        check_finite(wave, "f5tts vocoder")
        if rms < params.target_rms:
            wave = wave * rms / params.target_rms
        applied = self._applied(seed, drawn, steps, guidance, params, 1, fallbacks, [],
                                segments=[list(s) for s in request.segments])
        return SynthesisResult(Audio(wave.squeeze(0).cpu(), SAMPLE_RATE), applied)


def _join_chunks(waves: list[np.ndarray], cross_fade_duration: float) -> np.ndarray:
    """Join chunk audio as upstream does, in upstream's dtype.

    Upstream's crossfade weights are float64 ``np.linspace``, so its multi-chunk output is
    float64 (one chunk, or no crossfade, stays float32). The engine casts the result to
    float32 last, after the optional silence removal, which quantises upstream's dtype.
    """
    if len(waves) == 1:
        return waves[0]
    if cross_fade_duration <= 0:
        return np.concatenate(waves)
    fade = int(cross_fade_duration * SAMPLE_RATE)
    # Upstream concatenates the whole joined audio at every chunk (quadratic in the length).
    # Here only the tail a crossfade can still reach (the last ``fade`` samples) is rebuilt;
    # the samples and the final dtype are upstream's.
    done: list[np.ndarray] = []
    tail, total = waves[0], len(waves[0])
    for following in waves[1:]:
        overlap = min(fade, total, len(following))
        if overlap <= 0:
            tail = np.concatenate([tail, following])
        else:
            fade_out = np.linspace(1, 0, overlap)
            fade_in = np.linspace(0, 1, overlap)
            blended = tail[-overlap:] * fade_out + following[:overlap] * fade_in
            tail = np.concatenate([tail[:-overlap], blended, following[overlap:]])
        total += len(following) - overlap
        if len(tail) > fade:
            done.append(tail[:len(tail) - fade])
            tail = tail[len(tail) - fade:]
    return np.concatenate([*done, tail])


@contextlib.contextmanager
def _step_progress(model, progress: ProgressCallback | None, steps: int,
                   method: str) -> Iterator[None]:
    """Report each backbone evaluation of the ODE solver as a ``sampling`` step."""
    if progress is None:
        yield
        return
    total = steps * (2 if method == "midpoint" else 1)
    done = [0]

    def hook(module, inputs, output):
        done[0] += 1
        report(progress, "sampling", done[0], total)

    handle = model.transformer.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _catalog_variant(model_id: str) -> str | None:
    from mizuoto_f5tts.catalog import ENTRIES

    for entry in ENTRIES:
        if entry.id == model_id:
            return entry.variant
    return None


def _variant_name(model) -> str:
    from mizuoto.nn.transformer import DiT

    backbone = model.transformer
    if not isinstance(backbone, DiT):
        return "e2_base"
    return "v1_base" if backbone.text_embed.mask_padding else "base"
