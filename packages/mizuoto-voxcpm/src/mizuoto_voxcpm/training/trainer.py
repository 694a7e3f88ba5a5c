"""``VoxCPMTrainer``: full and LoRA fine-tuning with upstream's recipe, step for step.

``prepare`` reads the manifest (bad rows reported and skipped), fills the recipe and writes
``run.json`` + ``prepared.json`` in the run directory; ``train`` runs (or resumes) the loop,
logging every step to ``metrics.jsonl`` (on SIGINT or SIGTERM it stops after the current step,
its checkpoint saved: ``TrainingResult.interrupted``); ``export`` writes a model directory the
engine (and upstream) loads: full fine-tuning as ``model.safetensors`` beside the base model's
other files, LoRA as the base files (hard links where possible) plus
``lora_weights.safetensors`` and ``lora_config.json``.

``config.compute.device`` (``auto``: CUDA when present, else the CPU, as upstream's
accelerator) is where it trains; ``config.mixed_precision`` ``auto`` is upstream's (bf16
autocast + gradient scaler on CUDA, none on the CPU); ``bf16``/``fp16`` need CUDA.

``params.keep_last_n_checkpoints`` (default 0: none; -1: all; N: the newest N) numbered
checkpoints ``checkpoints/step_<N>/`` (upstream's folder layout and files) are written every
``params.checkpoint_every`` steps (default ``save_every``) and rotated by step number, across
resumes too; ``checkpoints/latest`` stays the resumable one.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import attrs

from mizuoto.contracts import TrainingConfig
from mizuoto.contracts.progress import ProgressCallback, report
from mizuoto.contracts.trainer import checkpoint_retention
from mizuoto.errors import InvalidRequest
from mizuoto.loading import resolve_for_engine
from mizuoto.runtime.atomic import atomic_path
from mizuoto.training import ProcessWorld, RunDirectory, StepTrainer, join, process_world
from mizuoto.training.checkpoint_folder import find_checkpoint_folder
from mizuoto.training.manifest import find_manifests
from mizuoto.training.preview import PREVIEW, speak_preview
from mizuoto_voxcpm.config import read_config_json
from mizuoto_voxcpm.training.loop import CHECKPOINTS, LATEST, NUMBERED
from mizuoto_voxcpm.training.params import VoxCPMTrainingParams
from mizuoto_voxcpm.training.run import BASE_FILES, Run

log = logging.getLogger(__name__)

class VoxCPMTrainer(StepTrainer):
    engine = "voxcpm"
    params_class = VoxCPMTrainingParams
    methods = frozenset({"full", "lora"})
    memory_levels = ("default", "low", "lowest")
    # upstream's layout: checkpoints/latest/ (resumable) and checkpoints/step_<N>/ folders
    checkpoint = Path(CHECKPOINTS) / LATEST
    numbered_checkpoint = NUMBERED
    checkpoint_folders = True

    def defaults(self, method: str, model: str) -> dict:
        from mizuoto_voxcpm.training.recipe import cli_defaults, generation_of

        model_dir = resolve_for_engine(model, self.engine).path
        raw = read_config_json(model_dir)
        return cli_defaults(method if method in self.methods else "full", generation_of(raw))

    def upstream_recipe(self, settings) -> dict:
        from mizuoto_voxcpm.training.recipe import translate_yaml

        return translate_yaml(settings)

    # -- prepare -------------------------------------------------------------------------

    def prepare(self, config: TrainingConfig, *, progress: ProgressCallback | None = None) -> Run:
        from mizuoto_voxcpm.audiovae import audio_vae_config_from_model_config
        from mizuoto_voxcpm.config import VoxCPMConfig
        from mizuoto_voxcpm.model import WEIGHT_FILES
        from mizuoto_voxcpm.training.recipe import build_recipe, generation_of
        from mizuoto_voxcpm.training.session import pick_device, pick_mixed_precision

        self.check(config)
        params = VoxCPMTrainingParams.parse(config.params, trainer="VoxCPM")  # before any read
        if config.memory == "lowest" and config.method != "lora":
            raise InvalidRequest("training.memory", "lowest streams LoRA's frozen weights from "
                                 "host memory; full fine-tuning trains them all", "use low")
        # the device and precision are checked here (process 0's device), used by the session
        pick_mixed_precision(pick_device(config.compute), config.mixed_precision)
        model_dir = resolve_for_engine(config.model, self.engine).path
        raw = read_config_json(model_dir)
        VoxCPMConfig.from_model_dir(model_dir)  # validates
        generation = generation_of(raw)
        recipe = build_recipe(config, generation, params)
        keep, every = checkpoint_retention(config)
        vae_rate = audio_vae_config_from_model_config(raw).sample_rate
        rate = params.sample_rate
        if rate is not None and rate != vae_rate:
            raise InvalidRequest("params.sample_rate", f"{rate} is not the model's AudioVAE "
                                 f"rate, {vae_rate}", "drop it or set the model's rate")
        manifest, found_val = find_manifests(config.dataset)
        if recipe.val_manifest is None and found_val is not None:
            recipe = attrs.evolve(recipe, val_manifest=str(found_val))
        report(progress, "prepare", 0, 1, "reading the manifest")
        samples, rejected, counted = _read_samples(model_dir, raw, manifest, recipe, "dataset")
        for item in rejected:
            log.warning("%s line %d skipped: %s", manifest, item.line, item.reason)
        val_samples, val_rejected = [], []
        if recipe.val_manifest is not None:
            val_manifest = find_manifests(recipe.val_manifest, field="params.val_manifest")[0]
            recipe = attrs.evolve(recipe, val_manifest=str(val_manifest))
            # upstream validates on every row (no max_batch_tokens filter)
            val_samples, val_rejected, _ = _read_samples(model_dir, raw, val_manifest, None,
                                                         "params.val_manifest")
            for item in val_rejected:
                log.warning("%s line %d skipped: %s", val_manifest, item.line, item.reason)
            if not val_samples:
                raise InvalidRequest("params.val_manifest", f"no usable rows in {val_manifest}"
                                     + (f"; skipped: {val_rejected[0].reason}"
                                        if val_rejected else ""))
        if len(samples) < recipe.batch_size:
            raise InvalidRequest("dataset", f"{len(samples)} usable rows in {manifest}, fewer "
                                 f"than one batch of {recipe.batch_size}"
                                 + (f"; skipped: {rejected[0].reason}" if rejected else ""),
                                 f"pass --batch-size {max(len(samples), 1)} or less, or add "
                                 "rows")
        output = Path(config.output_dir)
        self.claim_run(
            config, weights=(model_dir / name for name in BASE_FILES + WEIGHT_FILES
                             if (model_dir / name).is_file()),
            rows=((s.text, s.audio_path) for s in samples + list(val_samples)),
            recipe={"engine": self.engine, "method": config.method, "generation": generation,
                    **recipe.to_dict(), "memory": config.memory,
                    "save_every": config.save_every, "keep_last_n_checkpoints": keep,
                    "checkpoint_every": every})
        run_info = {"method": config.method, "model": str(model_dir), "model_id": config.model,
                    "manifest": str(manifest), "recipe": recipe.to_dict(),
                    "memory": config.memory, "save_every": config.save_every}
        if config.mixed_precision != "auto":  # (runs from before the setting have none)
            run_info["mixed_precision"] = config.mixed_precision
        RunDirectory(output).pin_settings(run_info)
        prepared = {"samples": _listed(samples), "rejected": _reasons(rejected)}
        if recipe.val_manifest is not None:
            prepared.update(val_samples=_listed(val_samples), val_rejected=_reasons(val_rejected))
        with atomic_path(output / "prepared.json") as tmp:
            tmp.write_text(json.dumps(prepared, indent=1), encoding="utf-8")
        report(progress, "prepare", 1, 1)
        return Run(config, model_dir, output, recipe, tuple(samples), counted,
                   tuple((r.line, r.reason) for r in rejected),
                   tuple(s.text for s in samples), tuple(val_samples), keep, every)

    # -- the run (core's StepTrainer around it) -------------------------------------------

    def find_checkpoint(self, output_dir: Path) -> Path | None:
        return find_checkpoint_folder(Path(output_dir) / CHECKPOINTS / LATEST)

    def world(self, run: Run) -> ProcessWorld:
        """torchrun's group on the training device's backend (NCCL on CUDA, as upstream)."""
        from mizuoto_voxcpm.training.session import pick_device

        return join(process_world(), pick_device(run.config.compute).type)

    def start(self, run: Run, world: ProcessWorld):
        from mizuoto_voxcpm.training.session import Session

        session = Session(run, world)
        if world.main:
            log.info("training on %s, mixed precision %s, memory %s", session.device,
                     session.mixed_precision, run.config.memory)
        return session

    def write_export(self, run: Run, folder: Path) -> None:
        from mizuoto_voxcpm.training.session import Session

        Session(run).write_export(folder)

    def export(self, run: Run, destination: Path) -> Path:
        """Write the model directory; then (process 0, unless ``params.preview`` is false)
        speak a preview with it into ``<output_dir>/preview.wav``."""
        exported = super().export(run, Path(destination))
        preview = VoxCPMTrainingParams.parse(run.config.params, trainer="VoxCPM").preview
        if preview and process_world().main:
            write_preview(run, exported, run.output_dir / PREVIEW)
        return exported


def write_preview(run: Run, model_dir: Path, path: Path) -> Path:
    """The first row's text spoken by the exported model (core's `speak_preview`: cloning the
    first 3-15 s clip of the data with its transcript when there is one, else zero-shot),
    with the base model's ``mizuoto-defaults.json``, as it would apply to the base model."""
    from mizuoto.contracts.model_defaults import read_model_defaults
    from mizuoto_voxcpm.audiovae import audio_vae_config_from_model_config
    from mizuoto_voxcpm.engine import VoxCPMEngine

    raw = read_config_json(model_dir)
    return speak_preview(
        VoxCPMEngine.load(model_dir), path, text=run.texts[0],
        clips=((s.audio, s.text) for s in run.samples),
        rate=audio_vae_config_from_model_config(raw).sample_rate, seed=run.config.seed,
        params={**read_model_defaults(run.model_dir), "retry_badcase": False})


def _listed(samples) -> list[dict]:
    """``prepared.json``'s entries for usable rows."""
    return [{"line": s.line, "audio": s.audio_path, "text_ids": s.text_ids,
             **({"is_prompt": True} if s.is_prompt else {})} for s in samples]


def _reasons(rejected) -> list[dict]:
    return [{"line": r.line, "reason": r.reason} for r in rejected]


def _read_samples(model_dir: Path, raw: dict, manifest: Path, recipe, field: str):
    from mizuoto_voxcpm.audiovae import audio_vae_config_from_model_config
    from mizuoto_voxcpm.config import VoxCPMConfig
    from mizuoto_voxcpm.tokenizer import VoxCPMTokenizer
    from mizuoto_voxcpm.training.data import batch_token_filter, read_manifest

    config = VoxCPMConfig.from_model_dir(model_dir)
    vae = audio_vae_config_from_model_config(raw)
    tokenizer = VoxCPMTokenizer.from_model_dir(model_dir)
    samples, rejected = read_manifest(
        manifest, sample_rate=vae.sample_rate, tokenize=tokenizer.encode,
        max_length=config.max_length, patch_size=config.patch_size, hop_length=vae.hop_length,
        field=field)
    if recipe is None:  # validation rows: not filtered
        return samples, rejected, len(samples)
    kept, dropped = batch_token_filter(
        samples, frames_per_second=vae.sample_rate / vae.hop_length,
        patch_size=config.patch_size, max_batch_tokens=recipe.max_batch_tokens,
        batch_size=recipe.batch_size)
    return kept, sorted(rejected + dropped, key=lambda r: r.line), len(samples)
