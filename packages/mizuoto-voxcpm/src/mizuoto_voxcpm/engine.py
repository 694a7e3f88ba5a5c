# Long on purpose: one class whose request paths (plan, chunks, rows, LoRA, voices) share one
# plan; what stands alone is in generation, patch_rows, decoding, prompt, voice and lora.
"""The VoxCPM engine: VoxCPM-0.5B and VoxCPM1.5 (``architecture: voxcpm``) and VoxCPM2.

Reproduces voxcpm 2.0.3's ``VoxCPM.generate`` / ``generate_streaming`` bit for bit on the same
seed (see docs/engines/voxcpm.md for what differs on purpose).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from mizuoto.adapters import Adapter, AdapterHost
from mizuoto.contracts.audio import Audio
from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.engine import Engine, ModelInfo
from mizuoto.contracts.features import SupportsSteps
from mizuoto.contracts.placement import Placement, place
from mizuoto.contracts.progress import ProgressCallback, report
from mizuoto.contracts.requests import Reference, SynthesisRequest
from mizuoto.contracts.results import Applied, Rendered
from mizuoto.contracts.scheduler import scheduler_for
from mizuoto.contracts.voice import Voice
from mizuoto.errors import (
    CheckpointMismatch,
    InvalidOption,
    InvalidRequest,
    ModelFilesMissing,
)
from mizuoto.options import Options
from mizuoto.runtime import bf16_dot
from mizuoto.runtime.device import dtype_name, preferred_device
from mizuoto.runtime.prepack import (
    MAX_ROWS,
    has_packable_layers,
    prepack_linears,
    prepack_report,
)
from mizuoto.runtime.prepack_conv_transpose import (
    conv_transpose_report,
    has_packable_conv_transposes,
    prepack_conv_transposes,
)
from mizuoto.runtime.prepack_fused import FusedPrepack
from mizuoto.text.coverage import dropped_characters_warning
from mizuoto_voxcpm.audiovae import audio_vae_config_from_model_config, load_audio_vae
from mizuoto_voxcpm.cache_pool import CachePool
from mizuoto_voxcpm.config import ConfigError, VoxCPMConfig, read_config_json, torch_dtype
from mizuoto_voxcpm.decoding import can_decode_tails, rehearse_stream_decode
from mizuoto_voxcpm.fast import (
    apply_fast,
    apply_fast_vae,
    cache_attention,
    check_fast,
    fast_settings,
    fast_traces_applied,
    trace_fast_steps,
)
from mizuoto_voxcpm.generation import (
    PromptCache,
    PromptSequence,
    Sampling,
    build_sequence,
    patch_cap,
)
from mizuoto_voxcpm.layer_fusion import fuse_prepacked
from mizuoto_voxcpm.long_text import pack_chunks
from mizuoto_voxcpm.lora import LORA_TARGETS, read_adapter
from mizuoto_voxcpm.model import WEIGHT_FILES, find_weights, load_model
from mizuoto_voxcpm.patch_decoder import rehearse_patches
from mizuoto_voxcpm.patch_graphs import PatchGraphs
from mizuoto_voxcpm.patch_rows import ChunkRun, PatchRow, PatchSteps, Retry
from mizuoto_voxcpm.prompt import encode_prompt, read_prompt_audio
from mizuoto_voxcpm.settings import DEFAULT_CACHE_SLOTS, VoxCPMOptions, VoxCPMParams
from mizuoto_voxcpm.text import model_text, prepare_prompt_text, prepare_target_text
from mizuoto_voxcpm.tokenizer import VoxCPMTokenizer
from mizuoto_voxcpm.voice import (
    ENGINE,
    check_voice_latents,
    model_fingerprint,
    prompt_from_voice,
    voice_from_prompt,
)

log = logging.getLogger(__name__)

LICENSE = "Apache-2.0"
#: What the model cards say the models speak (BCP 47): VoxCPM 0.5B and 1.5 Chinese and
#: English, VoxCPM2 the languages its README lists.
LANGUAGES = ("en", "zh")
V2_LANGUAGES = ("ar", "da", "de", "el", "en", "es", "fi", "fr", "he", "hi", "it", "ja", "ko",
                "ms", "nl", "no", "pl", "pt", "ru", "sv", "sw", "th", "tr", "vi", "zh")
VAE_FILES = ("audiovae.safetensors", "audiovae.pth")


def _needs_transcript() -> InvalidRequest:
    return InvalidRequest("reference.text", "is required by VoxCPM-0.5B and VoxCPM1.5",
                          "give the transcript of the reference recording")


#: the most seconds a batching model's step that admits requests waits for others arriving
#: together (the core scheduler's admission_wait)
ADMISSION_WAIT = 0.1
# a chunk k of a split text samples with seed + CHUNK_SEED_STRIDE * k
CHUNK_SEED_STRIDE = 1000
# how much faster float32 is than a reduced precision the CPU emulates, VoxCPM-0.5B size, one
# thread, AVX2 (docs/performance.md): bfloat16 1.6x (a whole 12-patch stream) to 2.7x (first
# audio); float16 measured on its matrix products only
FLOAT32_SPEEDUP = {torch.bfloat16: "1.6x to 2.7x", torch.float16: "several times"}
# the fast profile on such a CPU: VoxCPM-0.5B, real size, 2 threads, AMD EPYC Zen 2 (AVX2),
# 20 patches, 14.80 s float32 -> 3.07 s (docs/performance.md, "The fast profiles side by side")
FAST_HINT = ("engines.voxcpm.fast=int8 (not exact: int8 linear layers, 5 sampler steps instead "
             "of 10) is about 4.8x faster than float32 on such a CPU")
#: the fast profiles' sampler steps where neither the request (``steps``,
#: ``inference_timesteps``) nor the model directory's defaults set them: 5 of upstream's 10
#: DiT evaluations a patch (the DiT is the largest part of one); one step above the knee (4)
#: where the quality measured against the exact path falls off (VoxCPM-0.5B, int8, 20
#: patches: 6 steps 18.8 / 24.7 dB wave / mel SNR, 5 steps 18.7 / 24.6, 4 steps 15.3 / 21.0),
#: docs/performance.md
FAST_PROFILE_STEPS = 5
#: ``applied.compute["fast_stream_decode"]`` where a fast profile's stream decodes only each
#: window's newest patch (the first generation's VAE; mizuoto_voxcpm.decoding)
TAIL_DECODE = "newest patch of each window"


def _float32_speedup(prepack: str) -> dict:
    """FLOAT32_SPEEDUP, but nothing to say of bfloat16 where its linear layers will run core's
    bf16dot kernel (an AVX2 CPU with a compiler): torch's bits, and a VoxCPM-0.5B stream 1.3x
    faster than in float32 there (docs/performance.md)."""
    def bfloat16() -> str | None:
        if prepack != "off" and bf16_dot.runs():
            return None
        return FLOAT32_SPEEDUP[torch.bfloat16]

    return {**FLOAT32_SPEEDUP, torch.bfloat16: bfloat16}


@attrs.frozen
class _Plan:
    """One request resolved: what to tokenize, the prompt, the sampler settings."""

    chunks: tuple[str, ...]
    prompt: PromptCache | None
    params: VoxCPMParams
    sampling: Sampling
    seed: int
    warnings: tuple[str, ...]


class VoxCPMEngine(Engine, AdapterHost, SupportsSteps):
    name = "voxcpm"
    # its targets and upstream's files (serve finds adapters by them); set_lora reads
    # upstream's LoRAConfig (per LM, DiT and projections), core checks and swaps it in
    lora_targets = LORA_TARGETS
    params_class = VoxCPMParams
    options_class = VoxCPMOptions
    compute_options = Engine.compute_options | {"oom_fallback", "compile", "attention",
                                                "cuda_graphs", "prepack"}
    # each request is a row of the core's scheduler (patch_rows.py): its own cache slot,
    # generator, buffers and decoder state, stepped from one thread at a time (the scheduler
    # is the engine's scheduling object: SupportsSteps declares it, no lock here)
    # batched matrix products and VAE convolutions may round otherwise than a row's alone: a
    # row stepped alone is exact, and never draws its mates' noise
    batch_exact = False
    # the scheduler's rows (max_rows) are the cache slots
    rows_setting = "engines.voxcpm.cache_slots"

    def __init__(self, *, model_dir: Path, config: VoxCPMConfig, model, vae,
                 tokenizer: VoxCPMTokenizer, info: ModelInfo, placement: Placement,
                 cache_slots: int = DEFAULT_CACHE_SLOTS, max_batch: int = 1) -> None:
        self.model_dir = model_dir
        self.config = config
        self.model = model
        self.vae = vae
        self.tokenizer = tokenizer
        self._info = info
        self._base_info = info
        self.placement = placement
        self._pool = CachePool(model, size=cache_slots, attention=model.caches.lm.attention,
                               first=model.caches)
        # every open request holds a slot: the scheduler opens as many rows as there are
        self.max_rows = cache_slots
        self._steps = PatchSteps(model, vae, self._pool, max_batch=max_batch,
                                 oom_fallback=placement.oom_fallback,
                                 tail_decode="fast_stream_decode" in placement.settings)
        if max_batch > 1:
            self._pool.reserve(max_batch)

    # -- loading ------------------------------------------------------------------------

    @classmethod
    def recognizes(cls, model_dir: Path) -> bool:
        config = Path(model_dir) / "config.json"
        if not config.is_file() or not any((Path(model_dir) / f).is_file() for f in VAE_FILES):
            return False
        # the files are VoxCPM's layout (its audio VAE is no other engine's): a config.json
        # that is damaged is this engine's to name at load, not "install mizuoto-voxcpm"
        return True

    @classmethod
    def check_request(cls, request: SynthesisRequest, model_dir: Path) -> None:
        ref = request.reference
        if request.voice is not None or ref is None or (ref.text and ref.text.strip()):
            return
        try:
            raw = read_config_json(model_dir)
        except ConfigError:
            return  # the load names what is wrong with the file
        if str(raw.get("architecture", "voxcpm")).lower() != "voxcpm2":
            raise _needs_transcript()

    @classmethod
    def load(cls, model_dir: Path, *, options: Options | None = None,
             model_id: str | None = None, progress: ProgressCallback | None = None
             ) -> VoxCPMEngine:
        model_dir = Path(model_dir)
        options = options or Options()
        engine_options = options.engine_options(cls) or VoxCPMOptions()
        config = VoxCPMConfig.from_model_dir(model_dir)
        if not (model_dir / "tokenizer.json").is_file():
            raise ModelFilesMissing(str(model_dir), ["tokenizer.json"],
                                    "VoxCPM needs its tokenizer files in the model directory")
        # auto follows upstream: the config's device where it is available
        placement = place(cls, options.compute, device=lambda: preferred_device(config.device),
                          dtype=_dtype_setting(engine_options.dtype, options.compute.dtype),
                          auto_dtype=lambda device: _auto_dtype(config, device,
                                                                engine_options.fast),
                          dtype_setting="engines.voxcpm.dtype",
                          speedup=_float32_speedup(options.compute.prepack),
                          fast_hint=FAST_HINT)
        device = placement.device
        # a refused fast profile is named before the checkpoint is read
        check_fast(engine_options.fast, device, placement.dtype,
                   engine_options.int8_kernel, engine_options.fast_vae)
        report(progress, "load", 0, 3, "language model")
        _check_gpu_options(options.compute, device)
        attention = cache_attention(engine_options.fast, options.compute.attention)
        model = load_model(model_dir, config, dtype=placement.dtype, device=device,
                           attention=attention)
        if options.compute.cuda_graphs:
            model.patch_graphs = PatchGraphs(model)
        # the local DiT only, as upstream's optimize() (which compiles the LMs too, on CUDA
        # only); its shapes are fixed per model, so no dynamic shapes. A LoRA attached later
        # replaces layers inside it: dynamo's guards see that and recompile
        placement = placement.compile(model.feat_decoder.estimator).with_settings(
            attention=model.caches.lm.attention, cuda_graphs=model.patch_graphs is not None)
        kernel = engine_options.int8_kernel  # a fast profile's: packed or dynamic int8
        apply_fast(model.component_groups(), engine_options.fast, kernel)
        placement = placement.with_settings(fast=engine_options.fast,
                                            **fast_settings(engine_options.fast, kernel,
                                                            engine_options.fast_vae))
        # a compiled DiT keeps the plain layers: the compiler fuses around F.linear itself
        compiled = [model.feat_decoder.estimator] if options.compute.compile else []
        # the DiT's guided evaluation of a long patch (VoxCPM1.5, VoxCPM2: 18-22 rows) is a
        # decode step's fixed shape too: packed 1.3-1.6x faster there (bf16, 2 threads); so
        # are a batched step's (max_batch rows: up to 80 DiT rows, 24 encoder rows for the
        # 0.5B at 8), each row count proven on its first step
        batch = engine_options.max_batch
        prepack_linears(model.component_groups(), options.compute.prepack, skip=compiled,
                        max_rows={"dit": model.dit_rows * batch,
                                  "encoder": max(MAX_ROWS, model.encoder_rows * batch)})
        # a decoder layer's q/k/v and gate/up as one packed product each, where that is proven
        # to give the separate products' bits (bfloat16 at a step: 0.86-0.91 of their time)
        fuse_prepacked([module for group in model.component_groups().values()
                        for module in group], FusedPrepack.over)
        compiled_dit = bool(options.compute.compile)
        traced = trace_fast_steps(model, engine_options.fast, compiled=compiled_dit)
        if traced or has_packable_layers(model.component_groups()):
            # the packed kernels' and traces' proofs now, not in the first request (a second
            # patch confirms the LM step traces; the exact path needs one)
            rehearse_patches(model, patches=2 if traced else 1)
        placement = placement.with_settings(**fast_traces_applied(model, engine_options.fast))
        placement = placement.with_settings(prepack=options.compute.prepack)
        report(progress, "load", 1, 3, "audio VAE")
        vae_config = audio_vae_config_from_model_config(
            {"architecture": config.architecture, "audio_vae_config": config.audio_vae})
        vae = load_audio_vae(model_dir, vae_config, device)
        if vae.latent_dim != config.feat_dim:
            raise CheckpointMismatch(str(model_dir / "config.json"),
                                     detail=f"feat_dim {config.feat_dim} differs from the audio "
                                     f"VAE's latent_dim {vae.latent_dim}")
        # its transposed convolutions keep their weight laid out for their kernel at a stream's
        # fixed shapes (oneDNN's per-call reorder or the BLAS's transposed read skipped:
        # VoxCPM1.5's first upsampling 60 -> 9 ms a patch, VoxCPM-0.5B's 42 -> 9), proven at load
        apply_fast_vae(vae, engine_options.fast, engine_options.fast_vae)
        # a fast profile's stream decodes only each window's newest patch (never exact)
        tail = placement.fast_profile and can_decode_tails(vae, v2=config.is_v2)
        if tail:
            placement = placement.with_settings(fast_stream_decode=TAIL_DECODE)
        prepack_conv_transposes({"vae": [vae]}, options.compute.prepack)
        if has_packable_conv_transposes({"vae": [vae]}):
            rehearse_stream_decode(vae, v2=config.is_v2, patch_size=config.patch_size,
                                   feat_dim=config.feat_dim, tail=tail,
                                   max_batch=engine_options.max_batch)
        report(progress, "load", 2, 3, "tokenizer")
        tokenizer = VoxCPMTokenizer.from_model_dir(model_dir, config.lm.vocab_size)
        report(progress, "load", 3, 3)
        weights = [find_weights(model_dir).name,
                   next(f for f in VAE_FILES if (model_dir / f).is_file())]
        capabilities = {Capability.ZERO_SHOT, Capability.CLONE, Capability.CONTINUATION,
                        Capability.STREAM, Capability.VOICE_CACHE, Capability.LONG_TEXT}
        if config.is_v2:
            capabilities.add(Capability.DESIGN)
        info = placement.model_info(
            model=model_id or str(model_dir), variant=config.architecture,
            sample_rate=vae.out_sample_rate, capabilities=capabilities, license=LICENSE,
            fingerprint=model_fingerprint(model_dir, weights),
            languages=V2_LANGUAGES if config.is_v2 else LANGUAGES)
        log.info("loaded VoxCPM %s from %s (%s, %s)", config.architecture, model_dir,
                 info.dtype, info.device)
        engine = cls(model_dir=model_dir, config=config, model=model, vae=vae,
                     tokenizer=tokenizer, info=info, placement=placement,
                     cache_slots=engine_options.cache_slots,
                     max_batch=engine_options.max_batch)
        if cls.is_lora_export(model_dir):
            engine.set_lora(model_dir)
        return engine

    def sampler_defaults(self) -> dict[str, int | float]:
        # the params' defaults (over the model directory's): a request's steps / guidance win
        params = self.parse_params({})
        return {"steps": self._unset_steps({}, params), "guidance": params.cfg_value}

    def _unset_steps(self, given: Mapping[str, Any], params: VoxCPMParams) -> int:
        """The steps of a request that sets no ``steps``: its params' ``inference_timesteps``,
        or a fast profile's own count where nothing set that either."""
        if (self.placement.fast_profile
                and "inference_timesteps" not in {**self.model_defaults, **given}):
            return FAST_PROFILE_STEPS
        return params.inference_timesteps

    @property
    def info(self) -> ModelInfo:
        return self._info

    def profile_components(self) -> dict[str, list]:
        """For ``mizuoto bench --profile``: the modules of each part of a patch (the stop head
        runs once a patch) and the VAE."""
        return {**self.model.component_groups(), "vae": [self.vae]}

    # -- batching (SupportsSteps: the core's scheduler steps the rows) ---------------------

    @classmethod
    def batch_options(cls, section, max_batch: int) -> dict:
        section = dict(section)
        section.setdefault("max_batch", max_batch)
        # each batched stream holds a cache slot: at least as many slots as rows
        section.setdefault("cache_slots", max(DEFAULT_CACHE_SLOTS, int(section["max_batch"])))
        return section

    @property
    def max_batch(self) -> int:
        """Rows sampled in one batched kernel call (``engines.voxcpm.max_batch``; 1: each
        row alone, the open requests taking turns per patch)."""
        return self._steps.max_batch

    @property
    def batch_stats(self):
        return self._steps.stats

    @property
    def admission_wait(self) -> float:
        # listeners connecting together are admitted at one step, when rows batch: their
        # first patches from one batched step (a row alone never waits)
        return ADMISSION_WAIT if self._steps.max_batch > 1 else 0.0

    def open_row(self, request: SynthesisRequest, params: VoxCPMParams,
                 generator: torch.Generator) -> PatchRow:
        """A stream's row: one chunk per patch (no badcase retry: upstream disables it when
        streaming); the last carries the applied record. Planned now: a bad request is
        refused here, in the caller's thread."""
        return self._row(self._plan(request, params, generator.initial_seed()), whole=False)

    def step_rows(self, rows: Sequence[PatchRow]) -> list:
        made = self._steps.step(list(rows))
        return [pieces if isinstance(pieces, BaseException) else
                [self._made(row, samples, last) for samples, last in pieces]
                for row, pieces in zip(rows, made, strict=True)]

    def close_row(self, row: PatchRow) -> None:
        self._steps.close(row)

    def row_progress(self, row: PatchRow) -> tuple[str, int, int | None]:
        if not row.whole:
            return "sampling", row.patches, None
        stage = f"sampling {row.chunk + 1}/{len(row.runs)}" if len(row.runs) > 1 \
            else "sampling"
        return stage, row.sampled, row.run.sampling.max_patches

    def _row(self, plan: _Plan, *, whole: bool) -> PatchRow:
        params = plan.params
        retry = Retry(params.retry_badcase, params.retry_badcase_max_times,
                      params.retry_badcase_ratio_threshold) if whole else None
        return PatchRow(tuple(self._chunk_run(plan, index, target)
                              for index, target in enumerate(plan.chunks)),
                        retry=retry, tiled=params.tiled_decode, owner=plan)

    def _made(self, row: PatchRow, samples: torch.Tensor, last: bool) -> Rendered:
        audio = Audio(samples, self.info.sample_rate)
        if not last:
            return Rendered(audio, last=False)
        return self._rendered(row.owner, audio, retries=row.retries, patches=row.patches,
                              streamed=not row.whole, fallbacks=tuple(row.fallbacks),
                              batched=row.batched)

    def _applied(self, call, rendered: Rendered) -> Applied:
        # compute["batched"]: whether this request was stepped (or prefilled) in one kernel
        # call with other requests at least once (then its bits may differ from alone)
        applied = super()._applied(call, rendered)
        extra = dict(applied.extra)
        batched = bool(extra.pop("batched", False))
        # compute["prepack"]: per component, how many linear layers have run a packed kernel
        # (proven bit-identical on this CPU) and how many F.linear only
        mode = self.placement.settings["prepack"]
        prepack = prepack_report(self.model.component_groups(), mode)
        if mode != "off":  # and the VAE's transposed convolutions (the rest of it is plain)
            prepack["modules"].update(conv_transpose_report({"vae": [self.vae]}))
        return attrs.evolve(applied, extra=extra,
                            compute={**applied.compute, "batched": batched,
                                     "prepack": prepack})

    # -- LoRA ---------------------------------------------------------------------------

    def lora_root(self):
        return self.model

    def base_fingerprint(self) -> str:
        return self._base_info.fingerprint

    def read_adapter(self, path: str | Path) -> Adapter:
        return read_adapter(path, self.model, is_v2=self.config.is_v2)

    def set_lora(self, path: str | Path | None) -> None:
        """Apply the LoRA directory ``path`` (``lora_weights.safetensors`` +
        ``lora_config.json``), replacing the current one, or remove it with ``None``; the base
        weights stay loaded. The fingerprint (``info``, voices) then names base and LoRA.
        Refused while a request is open (a stream between two chunks): its voice would change
        mid-utterance."""
        if path is not None and self.placement.settings["fast"] != "off":
            raise InvalidOption("engines.voxcpm.fast", "a LoRA needs the float linear layers "
                                "the int8 fast profile replaced: load with "
                                "engines.voxcpm.fast=off")
        super().set_lora(path)

    @contextlib.contextmanager
    def adapter_turn(self):
        with scheduler_for(self).hold_rows():  # refused while a request is open
            self._steps.memo.clear()  # its prefills were made with the old weights
            yield

    def adapter_changed(self, adapter: Adapter | None) -> None:
        self._info = self._base_info if adapter is None else attrs.evolve(
            self._base_info, fingerprint=f"{self._base_info.fingerprint}+lora:"
                                         f"{adapter.digest[:32]}")
        self._recapture()

    def _recapture(self) -> None:
        """Drop the captured patches (they hold the old layers); new ones are captured on use."""
        if self.placement.settings["cuda_graphs"]:
            self.model.patch_graphs = PatchGraphs(self.model)

    # -- voices -------------------------------------------------------------------------

    def _build_voice(self, reference: Reference) -> Voice:
        """Encode ``reference`` once. VoxCPM2 without a transcript gives a reference-only voice;
        the first generation needs the transcript (its voices are continuation prompts)."""
        prompt = self._encode_reference(reference, reference_prefix=True, both=True,
                                        instruction=None)
        return voice_from_prompt(prompt, fingerprint=self.info.fingerprint,
                                 sample_rate=self.info.sample_rate,
                                 generation=self.config.architecture)

    def _encode_reference(self, reference: Reference, *, reference_prefix: bool, both: bool,
                          instruction: str | None) -> PromptCache:
        v2 = self.config.is_v2
        text = reference.text if reference.text and reference.text.strip() else None
        if not v2 and text is None:
            raise _needs_transcript()
        audio = read_prompt_audio(reference.audio, self.vae.sample_rate, v2=v2)
        use_prompt = text is not None and (not v2 or instruction is None or both)
        use_reference = v2 and (not use_prompt or reference_prefix or both)
        patch_size = self.config.patch_size
        prompt = reference_latents = None
        if use_prompt:
            prompt = encode_prompt(self.vae, audio, patch_size=patch_size, pad_left=True)
        if use_reference:
            reference_latents = encode_prompt(self.vae, audio, patch_size=patch_size,
                                              pad_left=False)
        return PromptCache(prompt_text=prepare_prompt_text(text) if use_prompt else None,
                           prompt_latents=prompt, reference_latents=reference_latents)

    # -- requests -------------------------------------------------------------------------

    def _plan(self, request: SynthesisRequest, params: VoxCPMParams, seed: int) -> _Plan:
        """The request resolved (capabilities, params and seed checked by the base class)."""
        warnings = []
        # upstream reads a character its vocab lacks as <unk>: kept, and said
        dropped = dropped_characters_warning(self.tokenizer.unknown_tokens(request.text),
                                             request.text, "<unk> (as upstream does)")
        if dropped:
            warnings.append(dropped)
        if request.voice is not None:
            request.voice.check(ENGINE, self.info.fingerprint)
            check_voice_latents(request.voice, patch_size=self.config.patch_size,
                                feat_dim=self.config.feat_dim,
                                max_length=self.config.max_length, is_v2=self.config.is_v2)
            prompt = prompt_from_voice(request.voice, fingerprint=self.info.fingerprint,
                                       reference_prefix=params.reference_prefix,
                                       use_prompt=request.instruction is None)
        elif request.reference is not None:
            prompt = self._encode_reference(request.reference,
                                            reference_prefix=params.reference_prefix,
                                            both=False, instruction=request.instruction)
        else:
            prompt = None
        transcript = (request.reference is not None and bool(request.reference.text)) or \
            (request.voice is not None and bool(request.voice.texts))
        if request.instruction is not None and transcript:
            warnings.append("with an instruction the reference is used as a reference voice "
                            "only; its transcript is not used (upstream does not combine a "
                            "style instruction with a continuation prompt)")
        steps = request.steps if request.steps is not None else \
            self._unset_steps(request.params or {}, params)
        guidance = request.guidance if request.guidance is not None else params.cfg_value
        chunks = self._chunks(request, params, prompt)
        sampling = Sampling(steps=steps, guidance=float(guidance), min_len=params.min_len,
                            max_patches=params.max_len)
        return _Plan(tuple(chunks), prompt, params, sampling, seed, tuple(warnings))

    def _target_text(self, text: str, instruction: str | None, params: VoxCPMParams) -> str:
        return prepare_target_text(text, instruction=instruction, normalize=params.normalize)

    def _chunks(self, request: SynthesisRequest, params: VoxCPMParams,
                prompt: PromptCache | None) -> list[str]:
        whole = self._target_text(request.text, request.instruction, params)
        if not params.split_text and self._fits(whole, prompt, params):
            return [whole]
        pieces = pack_chunks(request.text, lambda s: len(self.tokenizer.encode(s)),
                             params.chunk_tokens)
        chunks = [self._target_text(p, request.instruction, params) for p in pieces]
        for chunk in chunks:
            # a sentence longer than the context cannot be split further: refuse it up front
            # (the LM's position table may be shorter than the text, not only its cache)
            positions = self._sequence(chunk, prompt).tokens.size(1)
            if positions > self.config.max_length:
                raise self._too_long(request, chunk, prompt, positions)
        return chunks

    def _too_long(self, request: SynthesisRequest, chunk: str, prompt: PromptCache | None,
                  positions: int) -> InvalidRequest:
        """The error for a chunk past the context, blaming the largest of its parts: the
        instruction, the prompt's transcript (the reference's or the voice's), or the text."""
        encode = self.tokenizer.encode
        instruction = len(encode(request.instruction or ""))
        parts = {"text": len(encode(chunk)) - instruction,  # the chunk holds the instruction
                 "instruction": instruction,
                 "voice" if request.voice is not None else "reference.text":
                     len(encode(prompt.prompt_text or "")) if prompt is not None else 0}
        field = max(parts, key=parts.get)
        context = self.config.max_length
        if field == "text":
            return InvalidRequest(
                "text", f"a sentence needs {positions} positions (prompt included), more "
                f"than the model's context of {context}",
                "split it with sentence punctuation or shorten it")
        return InvalidRequest(
            field, f"takes {parts[field]} of the {positions} positions a sentence needs, more "
            f"than the model's context of {context}", f"shorten the {field.replace('.', ' ')}")

    def _fits(self, target: str, prompt: PromptCache | None, params: VoxCPMParams) -> bool:
        sequence = self._sequence(target, prompt)
        cap = patch_cap(len(self.tokenizer.encode(target)),
                        params.retry_badcase_ratio_threshold, params.max_len)
        return sequence.tokens.size(1) + cap <= self.config.max_length

    def _sequence(self, target: str, prompt: PromptCache | None) -> PromptSequence:
        prompt_text = prompt.prompt_text if prompt is not None else None
        ids = self.tokenizer.encode(model_text(target, prompt_text))
        return build_sequence(ids, prompt, patch_size=self.config.patch_size,
                              feat_dim=self.config.feat_dim)

    def _rendered(self, plan: _Plan, audio: Audio, *, retries: int, patches: int,
                  streamed: bool, fallbacks: tuple[str, ...] = (),
                  batched: bool = False) -> Rendered:
        mode = plan.prompt.mode if plan.prompt is not None else "zero_shot"
        return Rendered(
            audio,
            sampler={"solver": "euler", "steps": plan.sampling.steps,
                     "guidance": plan.sampling.guidance, "guidance_rule": "cfg-zero-star",
                     "sway_sampling": 1.0, "min_len": plan.sampling.min_len,
                     "max_len": plan.sampling.max_patches},
            retries=retries, fallbacks=fallbacks, warnings=plan.warnings,
            chunks=len(plan.chunks),
            extra={"generation": self.config.architecture, "mode": mode, "patches": patches,
                   "normalize": plan.params.normalize, "streamed": streamed,
                   "lora": self.lora.path if self.lora else None, "batched": batched},
        )

    def _chunk_run(self, plan: _Plan, index: int, target: str) -> ChunkRun:
        """What generating text chunk ``index`` needs, the same whether streamed or not: its
        token sequence, its patch cap (upstream's badcase rule) and its seed."""
        tokens = len(self.tokenizer.encode(target))
        cap = patch_cap(tokens, plan.params.retry_badcase_ratio_threshold, plan.params.max_len)
        return ChunkRun(sequence=self._sequence(target, plan.prompt), tokens=tokens,
                         sampling=attrs.evolve(plan.sampling, max_patches=cap),
                         seed=plan.seed + CHUNK_SEED_STRIDE * index)

    def _synthesize(self, request: SynthesisRequest, params: VoxCPMParams,
                    generator: torch.Generator, progress: ProgressCallback | None) -> Rendered:
        """The whole utterance, as upstream's ``generate``: each text chunk decoded at once,
        with its badcase retry; a row of the scheduler beside the open streams."""
        plan = self._plan(request, params, generator.initial_seed())
        row = scheduler_for(self).enqueue(self._row(plan, whole=True), progress=progress)
        try:
            return list(row)[-1]
        finally:
            if not row.ended:  # interrupted: its slot goes back
                row.cancel()


def _check_gpu_options(compute, device: torch.device) -> None:
    """``compute.attention=fast`` and ``compute.cuda_graphs`` are CUDA-only; refuse them, and
    the combinations that cannot work, by name rather than ignore them."""
    if compute.attention == "fast" and device.type != "cuda":
        raise InvalidOption("compute.attention", f"fast is offered on CUDA only (the model "
                            f"is on {device}): on the CPU, exact attention already spans only "
                            "the filled part of the cache (in steps of 256 positions) with "
                            "upstream's bits")
    if not compute.cuda_graphs:
        return
    if device.type != "cuda":
        raise InvalidOption("compute.cuda_graphs", f"needs the model on a CUDA device (it is "
                            f"on {device}); set compute.device=cuda or leave it off")
    if compute.compile:
        raise InvalidOption("compute.cuda_graphs", "does not combine with compute.compile "
                            "(both take over the same kernels): choose one")
    if compute.attention != "exact":
        raise InvalidOption("compute.cuda_graphs", "replays a fixed attention span, so it "
                            "needs compute.attention=exact")


def _dtype_setting(engine_dtype: str, compute_dtype: str) -> str:
    """``engines.voxcpm.dtype`` wins over ``compute.dtype``; upstream's spellings (bf16, fp32)
    become the canonical names."""
    requested = engine_dtype if engine_dtype != "auto" else compute_dtype
    return requested if requested == "auto" else dtype_name(torch_dtype(requested))


def _auto_dtype(config: VoxCPMConfig, device: torch.device, fast: str = "off") -> torch.dtype:
    """The config's dtype, as upstream; float32 on MPS, where upstream's autoregressive loop
    glitches in low precision, and for an int8 fast profile on the CPU (its kernels quantize
    float32 layers: asking for the profile is asking for that dtype; an explicit other dtype
    is still refused by :func:`~mizuoto_voxcpm.fast.check_fast`)."""
    if device.type == "mps" or (fast != "off" and device.type == "cpu"):
        return torch.float32
    return config.torch_dtype


__all__ = ["VoxCPMEngine", "VoxCPMOptions", "VoxCPMParams", "WEIGHT_FILES"]
