"""One training session: the model, VAE, data order and optimiser of a prepared run, built in
upstream's order so that every random draw lands where upstream's does; then the loop (with
upstream's validation when the run has validation rows) and the export."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch

from mizuoto.contracts import TrainingResult
from mizuoto.contracts.progress import ProgressCallback
from mizuoto.errors import InvalidRequest
from mizuoto.options import ComputeOptions
from mizuoto.runtime import precision
from mizuoto.runtime.atomic import atomic_directory, file_mode, save_safetensors
from mizuoto.runtime.device import select_device
from mizuoto.training import (
    Cadence,
    MetricsLog,
    Precision,
    StepLoop,
    StepProgress,
    barrier,
    join,
    process_world,
    rotate,
)
from mizuoto.training.trainer import training_precision
from mizuoto_voxcpm.audiovae import audio_vae_config_from_model_config, load_audio_vae
from mizuoto_voxcpm.config import VoxCPMConfig
from mizuoto_voxcpm.lora import apply_lora, kaiming_init_a, lora_layers, write_lora_dir
from mizuoto_voxcpm.model import WEIGHT_FILES, load_model
from mizuoto_voxcpm.training import construction, distributed, loop, validation
from mizuoto_voxcpm.training.data import (
    DistributedEpochSampler,
    EpochSampler,
    encode_audio,
    pack,
)
from mizuoto_voxcpm.training.memory import (
    checkpoint_blocks,
    frozen_linears_to,
    stream_frozen_linears,
)
from mizuoto_voxcpm.training.objective import CfmTraining, dropout_with, training_losses
from mizuoto_voxcpm.training.run import BASE_FILES, Run, link_or_copy

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"


def pick_device(local_rank: int = 0, compute: ComputeOptions | None = None) -> torch.device:
    """``compute.device``; ``auto``: upstream's accelerator, CUDA when present (the process's
    local rank under torchrun), else the CPU."""
    name = "auto" if compute is None else compute.device
    if name == "auto":
        return torch.device("cuda", local_rank) if torch.cuda.is_available() \
            else torch.device("cpu")
    device = select_device(compute)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    return device


def pick_mixed_precision(device: torch.device, requested: str) -> str:
    """``auto``: upstream's, bf16 autocast + gradient scaler on CUDA, none elsewhere (its
    ``autocast("cuda")`` is disabled on the CPU). ``bf16``/``fp16`` need CUDA."""
    return training_precision(requested, device, auto="bf16" if device.type == "cuda" else "no",
                              cuda_only=("bf16", "fp16"), why="upstream autocasts on CUDA only")


class Session:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.recipe = recipe = run.recipe
        model_dir = run.model_dir
        self.raw = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        self.config = config = VoxCPMConfig.from_model_dir(model_dir)
        self.world = world = process_world()
        self.world_size, self.rank = world.size, world.rank
        self.validating = bool(run.val_samples)
        if self.validating and self.world_size > 1:
            raise InvalidRequest("params.val_manifest", "validation runs in a single process "
                                 "only (not under torchrun)")
        self.device = device = pick_device(world.local_rank, run.config.compute)
        self.mixed_precision = pick_mixed_precision(device, run.config.mixed_precision)
        if self.rank == 0:
            log.info("training on %s, mixed precision %s, memory %s", device,
                     self.mixed_precision, run.config.memory)
        join(world, device.type)
        # the CPU has no bf16 training recipe upstream (its forward casts inputs to the config
        # dtype while the weights stay fp32): float32 there and without autocast; with bf16
        # autocast the config dtype, as upstream; with fp16 autocast float16
        self.dtype = {"no": torch.float32, "bf16": config.torch_dtype,
                      "fp16": torch.float16}[self.mixed_precision]
        self.cfm = CfmTraining.from_config_json(self.raw)
        vae_config = audio_vae_config_from_model_config(self.raw)

        # upstream: Accelerator(seed=42) seeds every generator, then from_local builds the
        # VAE, the model and the LoRA A matrices with default initialisations
        self.generator = torch.Generator().manual_seed(recipe.seed)
        construction.replay(self.generator, construction.audio_vae_draws(vae_config))
        construction.replay(self.generator, construction.model_draws(config))
        if device.type == "cuda":
            self.forward_generator = torch.Generator(device).manual_seed(recipe.seed)
        else:
            self.forward_generator = self.generator

        model = load_model(model_dir, config, dtype=torch.float32, device="cpu")
        model.caches = None  # inference-only static caches
        if recipe.lora is not None:
            for parameter in model.parameters():
                parameter.requires_grad_(False)
            apply_lora(model, recipe.lora, kaiming_init_a(self.generator))
            for layer in lora_layers(model):
                layer.dropout_fn = dropout_with(self.forward_generator, recipe.lora.dropout)
        if run.config.memory in ("low", "lowest"):
            checkpoint_blocks(model, self.forward_generator)
            if recipe.lora is not None and self.mixed_precision != "no":
                if self.validating:
                    # upstream's validation speaks through the model outside autocast
                    raise InvalidRequest("training.memory", f"{run.config.memory} keeps LoRA's "
                                         "frozen weights "
                                         f"in {self.mixed_precision}, which validation's "
                                         "generation cannot run on",
                                         "use memory default with val_manifest")
                frozen_linears_to(model, precision.DTYPES[self.mixed_precision])
        self.model = model.to(device).train()
        if run.config.memory == "lowest":
            if self.world_size > 1:
                raise InvalidRequest("training.memory", "lowest streams frozen weights from "
                                     "host memory in a single process only (not under "
                                     "torchrun)", "use low")
            # the stop head stays: the model reads its device and dtype from it
            stream_frozen_linears(self.model, device, keep=(self.model.stop_head,))
        # training only encodes: the VAE decoder never reaches the device (unless validation's
        # spoken samples decode through noise blocks, whose draws count)
        vae = load_audio_vae(model_dir, vae_config, "cpu")
        self.samples = self.validating and run.config.params.get("samples", True)
        self.out_rate = vae_config.out_sample_rate
        if not (self.validating and (vae_config.use_noise_block or self.samples)):
            vae.decoder = None
        self.vae = vae.to(device)
        if self.world_size > 1:
            self.sampler = DistributedEpochSampler(len(run.samples), recipe.batch_size,
                                                   self.generator, rank=self.rank,
                                                   world=self.world_size)
        else:
            self.sampler = EpochSampler(len(run.samples), recipe.batch_size, self.generator)
        self.forward, self.no_sync = distributed.wrap(
            distributed.TrainingForward(self.model, self._training_losses), device,
            self.world_size)
        self._latents: dict[tuple[bool, int, bool], torch.Tensor | None] = {}

    @classmethod
    def open(cls, run: Run) -> Session:
        return cls(run)

    # -- data ----------------------------------------------------------------------------

    def _latent(self, index: int, reference: bool = False, *, val: bool = False
                ) -> torch.Tensor | None:
        key = (val, index, reference)
        if key not in self._latents:
            sample = (self.run.val_samples if val else self.run.samples)[index]
            audio = sample.ref_audio if reference else sample.audio
            self._latents[key] = (None if audio is None else
                                  encode_audio(self.vae, audio, self.config.patch_size))
        return self._latents[key]

    def _pack(self, indices: list[int], *, val: bool = False):
        rows = self.run.val_samples if val else self.run.samples
        return pack([rows[i] for i in indices], [self._latent(i, val=val) for i in indices],
                    self.config.max_length, [self._latent(i, True, val=val) for i in indices])

    def next_batch(self):
        return self._pack(self.sampler.next_batch())

    def _training_losses(self, model, batch, progress: float):
        return training_losses(model, batch, cfm=self.cfm, generator=self.forward_generator,
                               progress=progress, dtype=self.dtype)

    def losses(self, batch, *, progress: float):
        return self.forward(batch, progress)

    def validate(self, scaling: Precision, step: int = 0, metrics: MetricsLog | None = None
                 ) -> dict[str, float]:
        """Upstream's validation (see :mod:`~mizuoto_voxcpm.training.validation`): the mean
        losses, keyed as :data:`~mizuoto_voxcpm.training.validation.KEYS`."""
        rows = self.run.val_samples
        self.model.eval()
        try:
            outputs = []
            with torch.no_grad():
                for indices in validation.batches(len(rows), self.recipe.batch_size,
                                                  self.generator):
                    batch = self._pack(indices, val=True)
                    with scaling.autocast():
                        losses = self._training_losses(self.model, batch, progress=0.0)
                    outputs.append({key: value.detach() for key, value in losses.items()})
            means = validation.mean_losses(outputs, self.recipe.lambdas)
            spoken = validation.speak(self.model, self.vae, [row.text_ids for row in rows],
                                      self.forward_generator)
            if self.samples and self.world.main:
                validation.write_samples(spoken, self.run.output_dir / "samples", step,
                                         self.out_rate, metrics)
        finally:
            self.model.train()
        return means

    # -- training ------------------------------------------------------------------------

    def run_loop(self, progress: ProgressCallback | None = None) -> TrainingResult:
        run, recipe = self.run, self.recipe
        optimizer, scheduler = loop.build_optimizer(self.model, recipe)
        scaling = loop.precision_for(self.device, self.mixed_precision)
        checkpoints = run.output_dir / CHECKPOINTS
        start, resumed = 0, None
        found = loop.find_checkpoint(checkpoints)
        if found is not None:
            start = loop.load_checkpoint(found, model=self.model, optimizer=optimizer,
                                         scheduler=scheduler, scaling=scaling,
                                         generator=self.generator, sampler=self.sampler,
                                         rank=self.rank)
            if self.forward_generator is not self.generator:
                self.forward_generator.manual_seed(recipe.seed + start)
            resumed = start
        metrics = MetricsLog(run.output_dir, resume_from=start) if self.world.main else None
        barrier()
        rows = metrics.rows if metrics is not None else []
        validated = next(({key: row[key] for key in validation.KEYS if key in row}
                          for row in reversed(rows) if validation.KEYS[0] in row), {})

        def save(done: int) -> None:
            loop.save_checkpoint(checkpoints, model=self.model, optimizer=optimizer,
                                 scheduler=scheduler, scaling=scaling,
                                 generator=self.generator, sampler=self.sampler, step=done,
                                 rank=self.rank)

        def numbered(done: int) -> None:
            """``step_<done>/`` in upstream's layout, then the rotation (process 0)."""
            if self.world.main:
                loop.write_numbered(checkpoints, done, self._write_weights,
                                    optimizer=optimizer, scheduler=scheduler)
                rotate(checkpoints, "step_", keep=run.keep_checkpoints)

        def update() -> dict[str, float]:
            step = steps.done
            values = loop.train_step(self.model, optimizer, scheduler, scaling,
                                     self.next_batch, self.losses, recipe, step,
                                     no_sync=self.no_sync)
            values["epoch"] = float((step * recipe.grad_accum_steps * recipe.batch_size
                                     * self.world_size) / max(1, run.counted_samples))
            if self.validating and validation.is_due(step, recipe.valid_interval,
                                                     recipe.num_iters):
                validated.clear()
                validated.update(self.validate(scaling, step, metrics))
                values.update(validated)
            return values

        steps = StepLoop(
            start=start, total=recipe.num_iters, world=self.world, save=save,
            numbered=numbered, metrics=metrics,
            cadence=Cadence(run.config.save_every, run.checkpoint_every, run.keep_checkpoints),
            progress=StepProgress(progress, recipe.num_iters, start,
                                  losses=("loss/diff", "loss/stop")),
            stop_device=self.device)
        try:
            outcome = steps.run(update)
        finally:
            if metrics is not None:
                metrics.close()
        if outcome.interrupted is not None and self.world.main:
            log.info("%s: stopped at step %d, checkpoint saved in %s; train again on it to "
                     "resume", outcome.interrupted, outcome.done, checkpoints)
        # the last step's values, and the last validation's
        last = steps.values or (rows[-1] if rows else {})
        metrics_out = {k: float(v) for k, v in {**validated, **last}.items() if k != "step"}
        return TrainingResult(run.output_dir, outcome.done, resumed, metrics=metrics_out,
                              interrupted=outcome.interrupted)

    # -- export --------------------------------------------------------------------------

    def load_trained(self) -> None:
        """The weights of the last checkpoint (the base weights when there is none)."""
        from safetensors.torch import load_file

        found = loop.find_checkpoint(self.run.output_dir / CHECKPOINTS)
        if found is None:
            return
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in load_file(str(found / loop.TRAINABLE)).items():
                params[name].copy_(value)

    def _write_weights(self, folder: Path) -> None:
        """What upstream's checkpoint folder holds besides the training state: full
        fine-tuning's ``model.safetensors`` (float32) and copies of the base model's config, VAE
        and tokenizer files; LoRA's ``lora_weights.safetensors`` and ``lora_config.json``."""
        if self.recipe.lora is not None:
            write_lora_dir(folder, self.model, self.recipe.lora, base_model=self.run.config.model)
            return
        state = {k: v.detach().to("cpu", torch.float32).contiguous()
                 for k, v in self.model.state_dict().items()}
        save_safetensors(state, folder / "model.safetensors")
        for name in BASE_FILES:
            if (self.run.model_dir / name).is_file():
                shutil.copy2(self.run.model_dir / name, folder / name)

    def export(self, destination: Path) -> Path:
        """A model directory: full weights as ``model.safetensors``, or the base files plus
        ``lora_weights.safetensors`` and ``lora_config.json``; replaced whole."""
        self.load_trained()
        if self.rank != 0:  # process 0 writes it
            barrier()
            return destination
        base = self.run.model_dir
        with atomic_directory(destination) as staging:
            if self.recipe.lora is not None:
                for name in BASE_FILES + WEIGHT_FILES:
                    if (base / name).is_file():
                        link_or_copy((base / name).resolve(), staging / name)
                self.model.to("cpu")
            self._write_weights(staging)
            for path in staging.iterdir():
                if not path.is_symlink() and path.stat().st_nlink == 1:
                    path.chmod(file_mode())
        barrier()
        return destination
