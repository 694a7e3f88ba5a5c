"""The F5-TTS engine: reference voice + text -> mel by flow matching -> Vocos -> 24 kHz audio.

The pipeline follows upstream f5-tts 1.1.22 (``utils_infer.infer_process`` /
``infer_batch_process``, ``api.F5TTS.infer``, ``infer/speech_edit.py``) step for step, so that
on the same weights, seed and threads the audio is identical. Where upstream is not
deterministic (chunks in a thread pool drawing from one global generator) we take the order
it would have with one worker: the chunks draw their noise in order from one generator seeded
once per request, as ``F5TTS.infer`` seeds the global one.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import attrs
import numpy as np
import torch

from mizuoto.contracts.audio import Audio
from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.engine import Engine, ModelInfo
from mizuoto.contracts.placement import Placement, place
from mizuoto.contracts.progress import ProgressCallback, report
from mizuoto.contracts.requests import (
    EditRequest,
    Reference,
    SynthesisRequest,
)
from mizuoto.contracts.results import Rendered, check_finite
from mizuoto.contracts.voice import Voice
from mizuoto.errors import InvalidRequest, ModelFilesMissing
from mizuoto.licenses import is_non_commercial, model_card_license
from mizuoto.options import Options
from mizuoto.text.coverage import dropped_characters_warning
from mizuoto_f5tts import editing, reference
from mizuoto_f5tts.chunking import chunk_text, max_chunk_bytes, split_to_fit
from mizuoto_f5tts.duration import (
    check_positions,
    check_requested_seconds,
    chunk_durations,
    positions_field,
)
from mizuoto_f5tts.fast import autocast_transformer, quantize_transformer, resolve_profile
from mizuoto_f5tts.joining import CrossFade, join_chunks
from mizuoto_f5tts.lora import F5Adapters
from mizuoto_f5tts.settings import F5Options, F5Params
from mizuoto_f5tts.text import to_tokens, token_ids, unknown_tokens
from mizuoto_f5tts.variants import (
    HOP_LENGTH,
    SAMPLE_RATE,
    catalog_variant,
    variant_of_model,
)
from mizuoto_f5tts.vocoding import vocode

# the fast profile on a CPU that emulates bfloat16: F5 v1 Base, real size, 2 threads, AMD EPYC
# Zen 2 (AVX2), exact float32 at 32 steps against int8 at 12 steps, 3.1x (docs/performance.md)
FAST_HINT = ("engines.f5tts.fast=int8 (not exact: int8 attention and feed-forward layers, 12 "
             "steps instead of 32) is about 3x faster than float32 on such a CPU")

DEFAULT_STEPS = 32
#: the fast profiles' step count where a request sets none: upstream's EPSS grid for 12 steps,
#: 3/8 of the transformer's calls. It differs from EPSS 16 only below t = 8/32 (steps of 2/32
#: instead of 1/32), and measured as close to the exact 32 steps as 16 did (docs/performance.md)
FAST_PROFILE_STEPS = 12
DEFAULT_GUIDANCE = 2.0
LICENSE = "CC-BY-NC-4.0"
#: What every F5-TTS and E2-TTS release was trained on (Emilia): English and Chinese.
LANGUAGES = ("en", "zh")
VOCOS_FILES = ("vocos/config.yaml", "vocos/pytorch_model.bin")
_VOICE_TEXT = "reference_text"

class F5Engine(Engine, F5Adapters):
    """F5-TTS v1 Base, F5-TTS Base and E2-TTS Base, with Vocos."""


    name = "f5tts"
    params_class = F5Params
    options_class = F5Options
    compute_options = Engine.compute_options | {"oom_fallback", "compile"}
    # A request's state is its generator (made per call) and its place in its text chunks (a
    # local loop); the weights are only read. So requests take turns per text chunk (the base
    # class takes a turn around each chunk of _stream: one sampler run and its vocoding), and
    # two long requests alternate chunks. Not per request: a short request would wait for a
    # whole long text. Not all at once either: on a CPU a chunk's matrix products (~1,000
    # rows) are compute-bound, so two chunks at once only split the cores and both finish
    # late. The one thing a sampler run keeps in the model, the backbone's text-embedding
    # cache, lasts that run only, inside its turn (a run nested in a progress callback, which
    # runs in the turn, gets its own cache).
    takes_turns_per = "chunk"

    def __init__(self, *, model, vocab: dict[str, int], vocoder, info: ModelInfo,
                 placement: Placement) -> None:
        self.model = model
        self.vocab = vocab
        self.vocoder = vocoder
        self._info = info
        self._base_info = info
        self.placement = placement
        # a fast profile's documented step count where a request leaves steps unset
        self._default_steps = FAST_PROFILE_STEPS if placement.fast_profile else DEFAULT_STEPS

    # -- loading --------------------------------------------------------------------------

    @classmethod
    def recognizes(cls, model_dir: Path) -> bool:
        model_dir = Path(model_dir)
        has_checkpoint = any(model_dir.glob("*.safetensors")) or any(model_dir.glob("*.pt"))
        return has_checkpoint and all((model_dir / name).is_file() for name in VOCOS_FILES)

    @classmethod
    def check_request(cls, request: SynthesisRequest, model_dir: Path) -> None:
        if request.voice is None and request.reference is not None:
            reference.prepare_reference_text(request.reference.text)  # the transcript is due
            if isinstance(request.reference.audio, Path) and request.reference.audio.is_file():
                reference.check_audible(request.reference.audio)  # a short file: read now

    @classmethod
    def load(cls, model_dir: Path, *, options: Options | None = None,
             model_id: str | None = None, progress: ProgressCallback | None = None) -> F5Engine:
        from mizuoto_f5tts.checkpoint import (
            auto_dtype,
            find_checkpoint,
            load_f5_model,
            load_vocos,
            weights_fingerprint,
        )

        # a `train --method lora` export: the base model it names, then the adapter
        exported = cls.load_adapter_export(model_dir, options=options, progress=progress)
        if exported is not None:
            return exported
        model_dir = Path(model_dir)
        options = options or Options()
        engine_options = options.engine_options(cls)
        missing = [name for name in VOCOS_FILES if not (model_dir / name).is_file()]
        if not any(model_dir.glob("*.safetensors")) and not any(model_dir.glob("*.pt")):
            missing.insert(0, "model_<step>.safetensors (the F5-TTS checkpoint)")
        if missing:
            raise ModelFilesMissing(str(model_dir), missing,
                                    "an F5-TTS model directory holds the checkpoint, vocab.txt "
                                    "and vocos/config.yaml + vocos/pytorch_model.bin")
        # float32 on the CPU when auto, as upstream: the emulated-dtype warning only when asked
        placement = place(cls, options.compute, auto_dtype=auto_dtype, fast_hint=FAST_HINT)
        variant = None if engine_options.variant == "auto" else engine_options.variant
        if variant is None and model_id is not None:
            variant = catalog_variant(model_id)
        # a refused fast profile is named before the checkpoint is read
        fast = resolve_profile(engine_options.fast, placement.device, placement.dtype)
        report(progress, "load", 0, 2, "flow-matching model")
        checkpoint = find_checkpoint(model_dir)
        model, vocab = load_f5_model(model_dir, variant, device=placement.device,
                                     dtype=placement.dtype, variant_field="engines.f5tts.variant")
        if fast == "int8":  # before compiling: a compiled transformer holds its layers
            int8_linears = quantize_transformer(model.transformer)
        # the backbone only (the ODE loop and guidance stay eager); dynamic: every request has
        # its own number of frames and tokens
        placement = placement.compile(model.transformer, dynamic=True)
        if fast == "autocast":
            placement = placement.with_settings(
                fast="autocast", fast_dtype=autocast_transformer(model.transformer,
                                                                 placement.device))
        elif fast == "int8":
            placement = placement.with_settings(fast="int8", fast_int8_linears=int8_linears)
        else:
            placement = placement.with_settings(fast="off")
        report(progress, "load", 1, 2, "vocoder")
        vocoder = load_vocos(model_dir / "vocos", device=placement.device)
        report(progress, "load", 2, 2)
        catalog_weights = model_id is not None and catalog_variant(model_id) is not None
        # a directory says its license in its model card (a copy of the Hub repository's)
        license_name = LICENSE if catalog_weights else model_card_license(model_dir)
        capabilities = frozenset({Capability.ZERO_SHOT, Capability.CLONE, Capability.EDIT,
                                  Capability.LONG_TEXT, Capability.VOICE_CACHE,
                                  Capability.STREAM})
        info = placement.model_info(
            model=model_id or str(model_dir), variant=variant_of_model(model),
            sample_rate=SAMPLE_RATE, capabilities=capabilities, dtype=model.dtype,
            license=license_name, non_commercial=is_non_commercial(license_name),
            fingerprint=weights_fingerprint(checkpoint, vocab), languages=LANGUAGES)
        return cls(model=model, vocab=vocab, vocoder=vocoder, info=info, placement=placement)

    def sampler_defaults(self) -> dict[str, int | float]:
        return {"steps": self._default_steps, "guidance": DEFAULT_GUIDANCE}

    def profile_components(self) -> dict[str, list]:
        """For ``mizuoto bench --profile``: the modules of each part of a request."""
        return {"transformer": [self.model.transformer], "vocoder": [self.vocoder]}

    @property
    def info(self) -> ModelInfo:
        return self._info

    # -- references and voices ------------------------------------------------------------

    @staticmethod
    def _resample(audio: torch.Tensor, rate: int, new_rate: int) -> torch.Tensor:
        return _resampler(rate, new_rate)(audio)

    def _build_voice(self, reference_: Reference) -> Voice:
        """A saved voice: the reference prepared as upstream prepares it (clipped, trimmed,
        padded, at its own rate) and its transcript. Loudness and resampling are applied when
        it is used, so a voice speaks exactly like its reference with any ``target_rms``."""
        waveform, rate = reference.prepare_pcm(reference_.audio)  # in the call's turn
        text = reference.prepare_reference_text(reference_.text)
        return Voice(engine=self.name, model_fingerprint=self.info.fingerprint,
                     sample_rate=rate, tensors={"waveform": waveform.contiguous()},
                     texts={_VOICE_TEXT: text}, meta={"variant": self.info.variant})

    def _reference_for(self, request: SynthesisRequest, params: F5Params,
                       warnings: list[str]) -> reference.PreparedReference:
        if request.voice is not None:  # checked against this model by the base class
            voice = request.voice
            if "waveform" not in voice.tensors or _VOICE_TEXT not in voice.texts:
                raise InvalidRequest("voice", "is not an F5-TTS voice (no waveform/text)",
                                     "build it with this engine's build_voice")
            reference.check_voice(voice.tensors["waveform"], voice.sample_rate,
                                  voice.texts[_VOICE_TEXT])
            return reference.condition_prepared(
                voice.tensors["waveform"].to(torch.float32), voice.sample_rate,
                voice.texts[_VOICE_TEXT], target_rms=params.target_rms, resample=self._resample)
        ref = request.reference
        if ref is None:
            ref = reference.default_voice()
            warnings.append("no reference given: spoke with the default voice "
                            "(upstream's basic_ref_en.wav)")
        return reference.prepare_reference(ref.audio, ref.text, target_rms=params.target_rms,
                                           resample=self._resample)

    # -- synthesis ------------------------------------------------------------------------

    def _stream(self, request: SynthesisRequest, params: F5Params,
                generator: torch.Generator, progress: ProgressCallback | None
                ) -> Iterator[Rendered]:
        """Each text chunk's audio as soon as it is generated and vocoded: all of it but the
        last ``cross_fade_duration``, which the next chunk's crossfade blends (the joined
        stream, which ``synthesize`` returns, is upstream's joined audio). With
        ``remove_silence`` the audio comes as one chunk at the end: upstream cuts silences
        across the whole joined audio. Planned now (in the call's first turn, with the
        reference's preparation), so that a bad request is refused at the call."""
        return self._joined_stream(self._plan(request, params), params, generator, progress)

    def _joined_stream(self, plan: _Plan, params: F5Params, generator: torch.Generator,
                       progress: ProgressCallback | None) -> Iterator[Rendered]:
        waves = self._chunk_waves(plan, params, generator, progress)
        if params.remove_silence:
            yield self._whole(plan, waves, params)
            return
        joiner = CrossFade(params.cross_fade_duration)
        for index, wave in enumerate(waves):
            final = joiner.add(wave)
            # none final: a chunk shorter than the crossfade, all of it kept back
            if index + 1 < len(plan.chunks) and len(final):
                yield Rendered(_audio(final), last=False)
        # the last chunk's audio and the tail kept for a crossfade, with what was applied
        yield self._rendered(np.concatenate([final, joiner.finish()]), plan, params)

    def _plan(self, request: SynthesisRequest, params: F5Params) -> _Plan:
        """Check the request and cut its text into chunks, before any sampling."""
        if params.edit_durations is not None:
            raise InvalidRequest("params.edit_durations", "applies to editing only")
        steps = request.steps or self._default_steps
        self._check_time_grid(steps, params)
        guidance = DEFAULT_GUIDANCE if request.guidance is None else float(request.guidance)
        warnings: list[str] = []
        # upstream reads a token its vocabulary lacks as id 0 (a space): kept, and said
        dropped = dropped_characters_warning(unknown_tokens(request.text, self.vocab),
                                             request.text, "spaces (id 0, as upstream does)")
        if dropped:
            warnings.append(dropped)
        prepared = self._reference_for(request, params, warnings)
        max_bytes = max_chunk_bytes(prepared.text, prepared.source_samples,
                                    prepared.source_rate, params.speed)
        chunks = chunk_text(request.text, max_bytes)
        if not chunks:
            raise InvalidRequest("text", "has nothing to speak after splitting")
        chunks = self._fit_positions(chunks, max_bytes, prepared, params)
        durations = chunk_durations(prepared.audio.shape[-1] // HOP_LENGTH,
                                    prepared.prompt_text, chunks, params)
        token_batches = [token_ids(to_tokens(prepared.prompt_text + chunk), self.vocab)[None]
                         for chunk in chunks]
        cond_frames = prepared.audio.shape[-1] // HOP_LENGTH + 1
        prompt_len = token_ids(to_tokens(prepared.prompt_text), self.vocab).shape[-1]
        reference_field = "voice" if request.voice is not None else "reference.text"
        for index, (tokens, frames) in enumerate(zip(token_batches, durations, strict=True)):
            check_positions(self.model.transformer, tokens.shape[-1], cond_frames, frames,
                            f"chunk {index + 1} of {len(chunks)}", **positions_field(
                                params, tokens.shape[-1], prompt_len, cond_frames, frames,
                                reference_field))
        check_requested_seconds(durations, cond_frames - 1, params, request.text)
        return _Plan(prepared, chunks, token_batches, durations, steps, guidance, warnings)

    def _chunk_waves(self, plan: _Plan, params: F5Params, generator: torch.Generator,
                     progress: ProgressCallback | None) -> Iterator[np.ndarray]:
        """Each text chunk's audio, in order, drawing its noise from ``generator``."""
        prepared, chunks = plan.prepared, plan.chunks
        cond = prepared.audio.to(self.model.device)
        ref_frames = prepared.audio.shape[-1] // HOP_LENGTH
        for index, (chunk, tokens, frames) in enumerate(
                zip(chunks, plan.token_batches, plan.durations, strict=True)):
            report(progress, "chunk", index, len(chunks), chunk)
            stage = f" (chunk {index + 1} of {len(chunks)})" if len(chunks) > 1 else ""
            mel, _ = self.model.sample(
                cond, tokens, frames, steps=plan.steps, cfg_strength=plan.guidance,
                sway_sampling_coef=params.sway_sampling_coef, use_epss=params.use_epss,
                method=params.method, generator=generator, on_step=_on_step(progress))
            check_finite(mel, f"f5tts sampler{stage}")
            mel = mel.to(torch.float32)[:, ref_frames:, :].permute(0, 2, 1)
            wave = vocode(self.vocoder, mel, tiled=params.tiled_decode,
                          oom_fallback=self.placement.oom_fallback, fallbacks=plan.fallbacks)
            check_finite(wave, f"f5tts vocoder{stage}")
            if prepared.raised:
                wave = wave * prepared.rms / params.target_rms
            yield wave.squeeze().cpu().numpy()
        report(progress, "chunk", len(chunks), len(chunks))

    def _whole(self, plan: _Plan, waves: Iterator[np.ndarray], params: F5Params) -> Rendered:
        """The chunks' audio joined (and its silences cut, if asked), as one piece."""
        samples = join_chunks(list(waves), params.cross_fade_duration)
        if params.remove_silence:
            samples = self._without_silence(samples, plan)
        return self._rendered(samples, plan, params)

    def _without_silence(self, samples: np.ndarray, plan: _Plan) -> np.ndarray:
        from mizuoto_f5tts.silence import remove_silence

        trimmed = remove_silence(samples, SAMPLE_RATE)
        if len(trimmed):
            return trimmed
        # upstream would write an empty file
        plan.warnings.append("remove_silence found only silence: the audio is kept as "
                             "generated")
        return samples

    def _rendered(self, samples: np.ndarray, plan: _Plan, params: F5Params) -> Rendered:
        """The last (or only) piece of a request's audio, with what was applied."""
        return Rendered(_audio(samples), sampler=_sampler(plan.steps, plan.guidance, params),
                        fallbacks=plan.fallbacks, warnings=plan.warnings,
                        chunks=len(plan.chunks))

    def _fit_positions(self, chunks: list[str], max_bytes: int,
                       prepared: reference.PreparedReference, params: F5Params) -> list[str]:
        """Each chunk longer than the model's text positions cut again at spaces (else between
        characters) into chunks of upstream's size: so any text within the request limit (the
        model card's ``max_input_chars``) is spoken at any speed, where upstream refuses a long
        unpunctuated text. Chunks that fit stay exactly as upstream makes them; a fixed total
        duration is the caller's, so it is not cut."""
        if params.fix_duration is not None:
            return chunks
        ref_frames = prepared.audio.shape[-1] // HOP_LENGTH

        def fits(chunk: str) -> bool:
            frames = chunk_durations(ref_frames, prepared.prompt_text, [chunk], params)[0]
            tokens = token_ids(to_tokens(prepared.prompt_text + chunk), self.vocab)
            try:
                check_positions(self.model.transformer, tokens.shape[-1], ref_frames + 1,
                                frames, "chunk")
            except InvalidRequest:
                return False
            return True

        return [piece for chunk in chunks
                for piece in ([chunk] if fits(chunk) else split_to_fit(chunk, max_bytes))]

    def _check_time_grid(self, steps: int, params: F5Params) -> None:
        """Refuse a time grid that repeats values in the model's dtype (half precision, many
        steps, sway: points near t = 0 round together), which the ODE solver cannot run."""
        from mizuoto.nn.flow import time_grid

        grid = time_grid(steps, use_epss=params.use_epss,
                         sway_sampling_coef=params.sway_sampling_coef, device=self.model.device,
                         dtype=self.model.dtype)
        if not bool((grid[1:] > grid[:-1]).all()):
            dtype = str(self.model.dtype).removeprefix("torch.")
            raise InvalidRequest(
                "steps", f"{steps} steps with sway_sampling_coef={params.sway_sampling_coef} "
                f"give a time grid with repeated values in {dtype}",
                "use fewer steps, params.sway_sampling_coef=None, or compute.dtype=float32")

    # -- editing --------------------------------------------------------------------------

    def _edit(self, request: EditRequest, params: F5Params, generator: torch.Generator,
              progress: ProgressCallback | None) -> Rendered:
        """Regenerate ``request.segments`` of the recording so it says ``request.text``."""
        from mizuoto.nn.dsp.audio_io import read_audio

        steps = request.steps or self._default_steps
        self._check_time_grid(steps, params)
        guidance = DEFAULT_GUIDANCE if request.guidance is None else float(request.guidance)
        fallbacks: list[str] = []
        source = request.reference.audio
        if isinstance(source, Audio):
            waveform, rate = source.samples[None], source.sample_rate
        else:
            waveform, rate = read_audio(source, field="reference.audio")
        tokens = token_ids(to_tokens(request.text), self.vocab)[None]
        # an edit is one sampler run: one turn (the base class's, around the call)
        # upstream's speech_edit reads the recording as it is (torchaudio.load): no clipping
        audio, rms = reference.condition_audio(waveform, rate, params.target_rms,
                                               self._resample)
        original_mel = self.model.mel_spec(audio.to(self.model.device)).permute(0, 2, 1)
        plan = editing.plan_edit(original_mel, request.segments, params.edit_durations)
        check_positions(self.model.transformer, tokens.shape[-1], plan.frames, plan.frames,
                        "the edited recording", **_edit_too_long(
                            request.segments, waveform.shape[-1] / rate,
                            text_longer=tokens.shape[-1] >= plan.frames))
        mel, _ = self.model.sample(
            plan.mel_cond, tokens, plan.frames, steps=steps, cfg_strength=guidance,
            sway_sampling_coef=params.sway_sampling_coef, use_epss=params.use_epss,
            method=params.method, generator=generator, edit_mask=plan.edit_mask,
            on_step=_on_step(progress))
        check_finite(mel, "f5tts sampler")
        wave = vocode(self.vocoder, mel.to(torch.float32).permute(0, 2, 1),
                      tiled=params.tiled_decode, oom_fallback=self.placement.oom_fallback,
                      fallbacks=fallbacks)
        check_finite(wave, "f5tts vocoder")
        if rms < params.target_rms:
            wave = wave * rms / params.target_rms
        return Rendered(Audio(wave.squeeze(0).cpu(), SAMPLE_RATE),
                        sampler=_sampler(steps, guidance, params), fallbacks=fallbacks,
                        extra={"segments": [list(s) for s in request.segments]})


@attrs.define
class _Plan:
    """A synthesis request checked and cut into text chunks; ``fallbacks`` and ``warnings``
    fill in as its chunks are made."""

    prepared: reference.PreparedReference
    chunks: list[str]
    token_batches: list[torch.Tensor]
    durations: list[int]
    steps: int
    guidance: float
    warnings: list[str]
    fallbacks: list[str] = attrs.field(factory=list)


def _audio(samples: np.ndarray) -> Audio:
    """Joined samples (float64 where crossfaded, as upstream's) as float32 audio."""
    return Audio(torch.from_numpy(samples.astype(np.float32, copy=False)), SAMPLE_RATE)


@functools.lru_cache(maxsize=16)
def _resampler(rate: int, new_rate: int) -> torch.nn.Module:
    """torchaudio.transforms.Resample as upstream builds it (float64 kernel cast to float32),
    made once per pair of rates and shared by every request: its forward only reads it."""
    from mizuoto.nn.dsp.resample import SincResampler

    return SincResampler(rate, new_rate)


def _sampler(steps: int, guidance: float, params: F5Params) -> dict:
    return {"steps": steps, "guidance": guidance, "sway": params.sway_sampling_coef,
            "method": params.method, "epss": params.use_epss, "speed": params.speed}


def _on_step(progress: ProgressCallback | None):
    """Each ODE step of the sampler as a ``sampling`` progress report."""
    if progress is None:
        return None
    return lambda done, total: report(progress, "sampling", done, total)


def _edit_too_long(segments, seconds: float, *, text_longer: bool) -> dict[str, str]:
    """What to name when an edit is longer than the model's positions: the text when it is
    what is long, else the segments (each is regenerated at its own length, as upstream's
    speech_edit, so one that ends past the recording makes the edit longer than it)."""
    if text_longer:
        return {}
    past = [f"{start:g}:{end:g}" for start, end in segments if end > seconds]
    where = (f", and {', '.join(past)} ends past the recording's end at {seconds:.2f} s, "
             "which lengthens the edit by the difference" if past else "")
    return {"field": "segments",
            "fix": "shorten the segments or params.edit_durations: each segment is "
                   f"regenerated at its own length{where}"}
