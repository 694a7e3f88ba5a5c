"""``VoxCPMTrainer``: full and LoRA fine-tuning with upstream's recipe, step for step
(docs/engines/voxcpm.md, "Fine-tuning"): ``prepare`` reads the manifests and fills the recipe,
the session (`mizuoto_voxcpm.training.session`) builds model, data and loss on core's runner,
``export`` writes a model directory the engine and upstream load, and a preview.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from mizuoto.contracts import TrainingConfig
from mizuoto.contracts.progress import ProgressCallback, report
from mizuoto.contracts.trainer import checkpoint_retention
from mizuoto.errors import InvalidRequest
from mizuoto.loading import resolve_for_engine
from mizuoto.runtime.atomic import atomic_path
from mizuoto.runtime.device import cuda_or_cpu
from mizuoto.training import (
    ProcessWorld,
    RecipeQuirks,
    RunDirectory,
    StepTrainer,
    process_world,
)
from mizuoto.training.checkpoint_folder import load_trainable
from mizuoto.training.manifest import find_manifests, usable_rows
from mizuoto.training.preview import PREVIEW, speak_preview
from mizuoto_voxcpm.config import read_config_json
from mizuoto_voxcpm.training.params import VoxCPMTrainingParams
from mizuoto_voxcpm.training.run import BASE_FILES, Run

#: upstream's loop, unlike accelerate's: it logs the scheduler's rate after its step, clips at
#: 1e9 when clipping is off (the norm always from clip_grad_norm_), steps the scheduler even
#: when the gradient scaler skipped the update, and scales bf16 too (its accelerator on CUDA)
QUIRKS = RecipeQuirks(logs_next_update_lr=True, clip_at_when_off=1e9,
                      schedule_steps_on_skipped_update=True, scales_bf16=True)


class VoxCPMTrainer(StepTrainer):
    engine = "voxcpm"
    params_class = VoxCPMTrainingParams
    methods = frozenset({"full", "lora"})
    memory_levels = ("default", "low", "lowest")
    # upstream's layout: checkpoints/latest/ (resumable; core's checkpoint folder) and
    # checkpoints/step_<N>/ folders, named as upstream's save_checkpoint names them
    checkpoint = Path("checkpoints") / "latest"
    numbered_checkpoint = "step_{:07d}"
    checkpoint_folders = True
    # upstream's accelerator: CUDA when present, else the CPU (never MPS), its group on NCCL
    # there; bf16 autocast on CUDA (its autocast("cuda") is off elsewhere)
    device_auto = staticmethod(cuda_or_cpu)
    world_on_device = True
    precision_auto = {"cuda": "bf16"}
    precision_cuda_only = ("bf16", "fp16")
    precision_cuda_only_why = "upstream autocasts on CUDA only"

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

        self.check(config)
        params = VoxCPMTrainingParams.parse(config.params, trainer="VoxCPM")  # before any read
        if config.memory == "lowest" and config.method != "lora":
            raise InvalidRequest("training.memory", "lowest streams LoRA's frozen weights from "
                                 "host memory; full fine-tuning trains them all", "use low")
        # the device and precision are checked here (process 0's device), used by the session
        self.device_and_precision(config)
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
        usable_rows(samples, rejected, manifest, field="dataset", batch_size=recipe.batch_size)
        val_samples, val_rejected = [], []
        if recipe.val_manifest is not None:
            val_manifest = find_manifests(recipe.val_manifest, field="params.val_manifest")[0]
            recipe = attrs.evolve(recipe, val_manifest=str(val_manifest))
            # upstream validates on every row (no max_batch_tokens filter)
            val_samples, val_rejected, _ = _read_samples(model_dir, raw, val_manifest, None,
                                                         "params.val_manifest")
            usable_rows(val_samples, val_rejected, val_manifest, field="params.val_manifest")
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
        prepared = {"samples": _listed(samples), "rejected": [attrs.asdict(r) for r in rejected]}
        if recipe.val_manifest is not None:
            prepared.update(val_samples=_listed(val_samples),
                            val_rejected=[attrs.asdict(r) for r in val_rejected])
        with atomic_path(output / "prepared.json") as tmp:
            tmp.write_text(json.dumps(prepared, indent=1), encoding="utf-8")
        report(progress, "prepare", 1, 1)
        return Run(config, model_dir, output, recipe, tuple(samples), counted,
                   tuple((r.line, r.reason) for r in rejected),
                   tuple(s.text for s in samples), tuple(val_samples), keep, every)

    # -- the run (core's StepTrainer around it) -------------------------------------------

    def build_session(self, run: Run, world: ProcessWorld | None = None):
        """The run's model, data and loss on its runner (an export's: process 0 alone)."""
        from mizuoto_voxcpm.training.session import Session

        world = world or ProcessWorld()
        return Session(run, world, self.runner(
            run, world, grad_accumulation=run.recipe.grad_accum_steps,
            max_grad_norm=run.recipe.max_grad_norm, quirks=QUIRKS))

    def start(self, run: Run, world: ProcessWorld):
        return self.build_session(run, world)

    def write_export(self, run: Run, folder: Path) -> None:
        session = self.build_session(run)
        load_trainable(self.find_checkpoint(run.output_dir), session.model)
        session.write_export(folder)

    def export(self, run: Run, destination: Path) -> Path:
        """Write the model directory; then (process 0, unless ``params.preview`` is false)
        speak the first row's text with it into ``<output_dir>/preview.wav`` (core's
        `speak_preview`), with the base model's ``mizuoto-defaults.json``."""
        from mizuoto.contracts.model_defaults import read_model_defaults
        from mizuoto_voxcpm.engine import VoxCPMEngine

        exported = super().export(run, Path(destination))
        if (VoxCPMTrainingParams.parse(run.config.params, trainer="VoxCPM").preview
                and process_world().main):
            engine = VoxCPMEngine.load(exported)
            speak_preview(engine, run.output_dir / PREVIEW, text=run.texts[0],
                          clips=((s.audio, s.text) for s in run.samples),
                          rate=engine.vae.sample_rate, seed=run.config.seed,
                          params={**read_model_defaults(run.model_dir),
                                  "retry_badcase": False})
        return exported


def _listed(samples) -> list[dict]:
    """``prepared.json``'s entries for usable rows."""
    return [{"line": s.line, "audio": s.audio_path, "text_ids": s.text_ids,
             **({"is_prompt": True} if s.is_prompt else {})} for s in samples]


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
