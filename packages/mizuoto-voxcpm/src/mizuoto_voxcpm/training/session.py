"""One training session: the model, VAE, data order and optimiser of a prepared run, built in
upstream's order so that every random draw lands where upstream's does; its update (with
upstream's validation when the run has validation rows), checkpoints and export files. The run
around it (resume, metrics, the step loop, numbered checkpoints, the export's atomic swap) is
core's `mizuoto.training.StepTrainer`'s."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from mizuoto.contracts.trainer import TrainerParams
from mizuoto.errors import InvalidRequest
from mizuoto.nn.lora import draw_dropout_from
from mizuoto.runtime.atomic import copy_model_files, save_safetensors
from mizuoto.training import LossForward, ProcessWorld, TrainingRunner, TrainingSession
from mizuoto.training.audio_samples import write_audio_samples
from mizuoto.training.checkpoint_folder import (
    load_checkpoint_folder,
    save_checkpoint_folder,
    write_step_files,
)
from mizuoto.training.init_draws import replay
from mizuoto.training.loader_order import epoch_sampler
from mizuoto.training.validation import (
    evaluating,
    is_due,
    validation_batches,
    validation_losses,
)
from mizuoto_voxcpm.audiovae import audio_vae_config_from_model_config, load_audio_vae
from mizuoto_voxcpm.config import VoxCPMConfig, read_config_json
from mizuoto_voxcpm.lora import LoRALinear, apply_lora, kaiming_init_a, write_lora_dir
from mizuoto_voxcpm.model import WEIGHT_FILES, load_model
from mizuoto_voxcpm.training import construction, validation
from mizuoto_voxcpm.training.data import encode_audio, pack
from mizuoto_voxcpm.training.objective import CfmTraining, training_losses
from mizuoto_voxcpm.training.run import BASE_FILES, Run


class Session(TrainingSession):
    """Built by `VoxCPMTrainer.build_session`: ``world``, the run's processes (joined by the
    trainer; an export's: process 0 alone), ``runner`` the run's `TrainingRunner`."""

    progress_losses = ("loss/diff", "loss/stop")

    def __init__(self, run: Run, world: ProcessWorld, runner: TrainingRunner) -> None:
        self.run = run
        self.recipe = recipe = run.recipe
        self.total = recipe.num_iters
        model_dir = run.model_dir
        self.raw = read_config_json(model_dir)
        self.config = config = VoxCPMConfig.from_model_dir(model_dir)
        self.world, self.runner = world, runner
        self.world_size, self.rank = world.size, world.rank
        self.validating = bool(run.val_samples)
        if self.validating and self.world_size > 1:
            raise InvalidRequest("params.val_manifest", "validation runs in a single process "
                                 "only (not under torchrun)")
        self.device = device = runner.device
        self.mixed_precision = self.runner.mixed_precision
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
        replay(self.generator, construction.audio_vae_draws(vae_config))
        replay(self.generator, construction.model_draws(config))
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
            draw_dropout_from(model, self.forward_generator)
        if run.config.memory in ("low", "lowest"):
            # each decoder layer of both LMs, the local encoder and the DiT estimator
            # recompute (LoRA's dropout masks replayed from the run's generator)
            self.runner.checkpoint_activations(
                [*model.base_lm.layers, *model.residual_lm.layers, model.feat_encoder,
                 model.feat_decoder.estimator], self.forward_generator)
            if recipe.lora is not None and self.mixed_precision != "no" and self.validating:
                # upstream's validation speaks through the model outside autocast
                raise InvalidRequest("training.memory", f"{run.config.memory} keeps LoRA's "
                                     f"frozen weights in {self.mixed_precision}, which "
                                     "validation's generation cannot run on",
                                     "use memory default with val_manifest")
        # the stop head stays on the device: the model reads its device and dtype from it
        self.model = self.runner.place_model(model, kinds=(LoRALinear,), keep=(model.stop_head,))
        # training only encodes: the VAE decoder never reaches the device (unless validation's
        # spoken samples decode through noise blocks, whose draws count)
        vae = load_audio_vae(model_dir, vae_config, "cpu")
        # upstream speaks its validation texts: samples on unless turned off
        self.samples = self.validating and TrainerParams.of(run.config.params)[0].samples \
            is not False
        self.out_rate = vae_config.out_sample_rate
        if not (self.validating and (vae_config.use_noise_block or self.samples)):
            vae.decoder = None
        self.vae = vae.to(device)
        self.sampler = epoch_sampler(len(run.samples), recipe.batch_size, self.generator, world)
        # upstream wraps the training forward in DDP (the accelerator's prepare)
        self.forward = self.runner.wrap(LossForward(self.model, self._training_losses))
        self._latents: dict[tuple[bool, int, bool], torch.Tensor | None] = {}
        # the cosine schedule spans max_steps (upstream's 0: num_iters), which may differ from
        # the steps run (past its end the factor rises again along the cosine, as upstream's)
        self.runner.optimize(
            self.model, learning_rate=recipe.learning_rate, weight_decay=recipe.weight_decay,
            schedule=TrainerParams.of(run.config.params)[0].lr_schedule or "cosine",
            warmup=recipe.warmup_steps,
            total=recipe.max_steps if recipe.max_steps > 0 else recipe.num_iters)
        self.done = 0  # steps made (a resumed run's included)

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

    def validate(self, step: int = 0) -> dict[str, float]:
        """Upstream's validation (see :mod:`~mizuoto_voxcpm.training.validation`): the mean
        losses, keyed as :data:`~mizuoto_voxcpm.training.validation.KEYS`."""
        rows = self.run.val_samples
        with evaluating(self.model):
            means = validation_losses(
                (self._pack(indices, val=True) for indices in validation_batches(
                    len(rows), self.recipe.batch_size, self.generator,
                    max_batches=validation.MAX_BATCHES)),
                lambda batch: self._training_losses(self.model, batch, progress=0.0),
                weights=self.recipe.lambdas, autocast=self.runner.precision.autocast)
            spoken = validation.speak(self.model, self.vae, [row.text_ids for row in rows],
                                      self.forward_generator)
            if self.samples and self.world.main:  # named by the 0-based step, as upstream's
                write_audio_samples(self.run.output_dir / "samples", [
                    (f"step_{step}_{i}", audio, f"val/sample_{i}/generated_audio")
                    for i, audio in enumerate(spoken)], self.out_rate, step=step + 1,
                    metrics=self.metrics)
        return means

    # -- training ------------------------------------------------------------------------

    def update(self) -> dict[str, float]:
        run, recipe, step = self.run, self.recipe, self.done
        progress = step / max(1, recipe.num_iters)
        values = self.runner.update(self.next_batch, lambda batch: self.forward(batch, progress),
                                    weights=recipe.lambdas)
        values["epoch"] = float((step * recipe.grad_accum_steps * recipe.batch_size
                                 * self.world_size) / max(1, run.counted_samples))
        self.done += 1
        if self.validating and is_due(step, recipe.valid_interval, recipe.num_iters):
            values.update(self.validate(step))
        return values

    def save(self, path: Path, done: int) -> None:
        save_checkpoint_folder(path, done, model=self.model, runner=self.runner, rank=self.rank,
                               own={"generator": self.generator.get_state(),
                                    "sampler": self.sampler.state()})

    def load(self, path: Path) -> int:
        self.done, own = load_checkpoint_folder(path, model=self.model, runner=self.runner,
                                                rank=self.rank)
        self.generator.set_state(own["generator"])
        self.sampler.restore(own["sampler"])
        if self.forward_generator is not self.generator:
            self.forward_generator.manual_seed(self.recipe.seed + self.done)
        return self.done

    def write_numbered(self, target: Path, checkpoint: Path, done: int) -> None:
        """``step_<done>/`` in upstream's layout: its weights and torch's training files."""
        self._write_weights(target)
        write_step_files(target, done, self.runner)

    def result_metrics(self, values: Mapping[str, float]) -> dict[str, float]:
        """The last step's values over the newest of each metric logged: the last
        validation's (a resumed run with nothing left to do: the log's)."""
        logged = self.metrics.newest() if self.metrics is not None else {}
        return {key: float(value) for key, value in {**logged, **values}.items()}

    # -- export --------------------------------------------------------------------------

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
        copy_model_files(self.run.model_dir, folder, BASE_FILES)

    def write_export(self, folder: Path) -> None:
        """A model directory in ``folder`` (the trained weights loaded): full weights as
        ``model.safetensors``, or the base files plus ``lora_weights.safetensors`` and
        ``lora_config.json``."""
        if self.recipe.lora is not None:
            copy_model_files(self.run.model_dir, folder, BASE_FILES + WEIGHT_FILES,
                             hard_link=True)
            self.model.to("cpu")
        self._write_weights(folder)
