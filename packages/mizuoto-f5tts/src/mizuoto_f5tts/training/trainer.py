"""`F5Trainer`: fine-tuning F5-TTS v1 Base, v0 Base and E2 as upstream's ``f5-tts_finetune-cli``
does it, byte for byte on the CPU, on core's `StepTrainer`: `prepare` checks the model, the run
directory and the data set (written to ``prepared/``); `start` builds the model as upstream does
(its random draws: torch seeded with ``config.seed``) and its `FineTuning`
(`mizuoto_f5tts.training.loop`); `write_export` writes the EMA weights as a model directory
(`write_model`), or a ``lora`` run's adapter alone (peft's files, core's
`StepTrainer.write_lora_export`), naming its base model by id and fingerprint.

``config.method``: ``full`` (upstream's fine-tuning) or ``lora``, core's method for the
declared `mizuoto_f5tts.lora.LORA_TARGETS` (the DiT's attention and feed-forward projections;
``params.lora_r`` 8, ``lora_alpha`` 16, ``lora_dropout`` 0, ``lora_targets``: see
`mizuoto.training.StepTrainer.add_lora`), with no EMA copy of the model (the adapter is
exported as trained). There is no upstream F5 LoRA to match.

``config.params``: `F5TrainingParams`. Training stops after ``config.steps`` updates or at
the end of the last epoch. ``config.mixed_precision`` is ``accelerate launch --mixed_precision``
(``auto`` = ``no``, upstream's default; ``fp16`` needs CUDA, as accelerate's loss scaling).
"""

from __future__ import annotations

import logging
import math
import random
from pathlib import Path

import attrs
import torch

from mizuoto.contracts.progress import ProgressCallback
from mizuoto.contracts.trainer import MAX_STEPS, TrainingConfig, checkpoint_retention
from mizuoto.errors import InvalidRequest
from mizuoto.nn.lora import LoRASettings
from mizuoto.runtime.checkpoint import load_into, load_state_dict_file
from mizuoto.training import (
    ProcessWorld,
    RunDirectory,
    StepTrainer,
    warn_long_warmup,
)
from mizuoto.training.schedules import check_warmup
from mizuoto.training.state import load_state_file
from mizuoto_f5tts.lora import LORA_TARGETS
from mizuoto_f5tts.training.batching import MelDataset, frame_batches
from mizuoto_f5tts.training.data import (
    REPORT,
    PreparedData,
    extended_vocab,
    prepare_dataset,
    write_prepared,
    write_vocab,
)
from mizuoto_f5tts.training.export import write_model
from mizuoto_f5tts.training.loop import LOG_FILE, QUIRKS, FineTuning, LoopSettings
from mizuoto_f5tts.training.params import F5TrainingParams
from mizuoto_f5tts.training.recipe import CLI_DEFAULTS, translate_finetune_cli
from mizuoto_f5tts.training.samples import TrainingSamples
from mizuoto_f5tts.variants import F5Variant

logger = logging.getLogger(__name__)


@attrs.frozen
class F5Run:
    """What `F5Trainer.prepare` found: the run's inputs, checked."""

    config: TrainingConfig
    model_dir: Path
    checkpoint: Path
    variant: F5Variant
    vocab: dict[str, int]
    data: PreparedData
    settings: LoopSettings
    vocab_file: Path | None = None  # the base model's, or the extended one in prepared/
    new_tokens: int = 0  # text-embedding rows added for an extended vocabulary
    finetune: bool = True  # false: random initialisation, no base weights
    device: str = "cpu"
    params: F5TrainingParams = attrs.field(factory=F5TrainingParams)  # config.params, checked


def _check_vocab_size(base: dict, vocab: dict, field: str, vocab_file: Path) -> None:
    """A fine-tune keeps the base model's text embedding: ``len(vocab) + 1`` rows (upstream
    would fail loading the weights with a size mismatch)."""
    rows = next((w.shape[0] for k, w in base.items() if k.endswith("text_embed.weight")), None)
    if rows is not None and rows != len(vocab) + 1:
        raise InvalidRequest(field, f"{vocab_file} has {len(vocab)} tokens but the base model's "
                             f"text embedding has {rows - 1}",
                             "fine-tune with the base model's vocabulary (extend_vocab adds "
                             "tokens), or set finetune: false to train from scratch")


def _settings(config: TrainingConfig, params: F5TrainingParams, data: PreparedData,
              mixed_precision: str = "no", lora: LoRASettings | None = None) -> LoopSettings:
    kind = params.batch_size_type
    # a setting of the other batching mode would be ignored: refused instead
    if kind == "frame" and config.batch_size != 1:
        raise InvalidRequest("batch_size", f"{config.batch_size} does not apply under frame "
                             "batching (batch_size_type frame, upstream's default)",
                             "set params.batch_frames (frames per batch), or "
                             "batch_size_type=sample to batch by clips")
    if kind == "sample":
        # (at upstream's default they change nothing: finetune_cli passes them whatever the
        # batching, and so may a recipe)
        for name in ("batch_frames", "max_samples"):
            if getattr(params, name) != getattr(F5TrainingParams(), name):
                raise InvalidRequest(f"params.{name}", "applies to frame batching only, not "
                                     "batch_size_type sample", "set batch_size (clips per "
                                     "batch) instead")
    # upstream's finetune_cli: no accumulation, clipping at 1.0
    accumulation = 1 if params.grad_accumulation is None else params.grad_accumulation
    norm = 1.0 if params.max_grad_norm is None else params.max_grad_norm
    if kind == "frame":
        per_epoch = len(frame_batches(data.durations, params.batch_frames, params.max_samples))
        if per_epoch == 0:
            raise InvalidRequest("params.batch_frames", f"no clip fits in {params.batch_frames} "
                                 "frames", "raise batch_frames (24000 / 256 frames per second)")
    else:
        per_epoch = -(-len(data.clips) // config.batch_size)
    updates_per_epoch = math.ceil(per_epoch / accumulation)
    epochs = params.epochs or math.ceil(config.steps / updates_per_epoch)  # default: enough
    total = updates_per_epoch * epochs
    warmup = min(20000, total // 10) if params.warmup_updates is None else params.warmup_updates
    check_warmup(params.lr_schedule or "linear", warmup, total)  # upstream divides by zero
    # upstream runs it (its CLI default of 20000 does on small data sets)
    warn_long_warmup("warmup_updates", warmup, steps=config.steps, schedule=total,
                     learning_rate=config.learning_rate)
    return LoopSettings(
        epochs=epochs, learning_rate=config.learning_rate, warmup_updates=warmup,
        batch_size_type=kind, max_samples=params.max_samples, grad_accumulation=accumulation,
        batch_size=params.batch_frames if kind == "frame" else config.batch_size,
        max_grad_norm=float(norm), shuffle_seed=params.shuffle_seed, save_every=config.save_every,
        steps=config.steps, mixed_precision=mixed_precision,
        lr_schedule=params.lr_schedule or "linear",
        lora=None if lora is None else lora.as_dict())


class F5Trainer(StepTrainer):
    engine = "f5tts"
    params_class = F5TrainingParams
    methods = frozenset({"full", "lora"})
    memory_levels = ("default", "low", "lowest")
    lora_targets = LORA_TARGETS
    # an extended vocabulary or training from scratch changes the base model a LoRA adapts
    lora_keeps = {"extend_vocab": False, "finetune": True, "vocab_file": None}
    precision_cuda_only_why = "accelerate's loss scaling refuses it there too"
    seeds_torch = True  # upstream seeds torch, the device's generator too (its draws count)

    def defaults(self, method: str, model: str) -> dict:
        """``f5-tts_finetune-cli``'s defaults: 100 epochs (``steps`` unbounded), learning rate
        1e-5, 20000 warm-up updates, frame batching of 3200 frames and at most 64 clips, the
        resumable checkpoint every 5000 updates (``last_per_updates``) and a numbered one every
        50000 (``save_per_updates``), all kept. Upstream does not seed its runs; ours seed 0."""
        return {"steps": MAX_STEPS, "learning_rate": 1e-5, "save_every": 5000,
                "params": dict(CLI_DEFAULTS)}

    def upstream_recipe(self, settings) -> dict:
        return translate_finetune_cli(settings)

    def prepare(self, config: TrainingConfig, *, progress: ProgressCallback | None = None
                ) -> F5Run:
        from mizuoto.loading import resolve_for_engine
        from mizuoto_f5tts.checkpoint import (
            VOCAB_FILE,
            checkpoint_variant,
            find_checkpoint,
            model_vocab_path,
            read_checkpoint,
        )
        from mizuoto_f5tts.text import read_vocab

        self.check(config)
        # every param checked before the model is read
        params = F5TrainingParams.parse(config.params, trainer="F5-TTS")
        lora = self.lora_settings(config)
        device, mixed_precision = self.device_and_precision(config)
        model_dir = resolve_for_engine(config.model, self.engine, progress=progress).path
        checkpoint = find_checkpoint(model_dir)
        finetune = params.finetune
        vocab_file = (model_vocab_path(model_dir) if params.vocab_file is None
                      else Path(params.vocab_file))  # a file: checked by F5TrainingParams
        vocab = read_vocab(vocab_file)
        base = read_checkpoint(checkpoint)
        variant = checkpoint_variant(checkpoint, base, params.variant, field="params.variant")
        if finetune:
            _check_vocab_size(base, vocab, "params.vocab_file" if params.vocab_file is not None
                              else "model", vocab_file)
        del base
        # model + EMA + AdamW's two moments, twice (the old checkpoint stays until replaced),
        # plus the numbered copies kept
        run_dir = RunDirectory(config.output_dir)
        keep = checkpoint_retention(config)[0]
        run_dir.check_writable(needed_bytes=4 * checkpoint.stat().st_size * (2 + max(keep, 0)))
        prepared_dir = run_dir.path / "prepared"
        extend = params.extend_vocab
        new_tokens = 0
        if extend is False:
            data = prepare_dataset(config.dataset, vocab, progress=progress)
        else:
            with open(vocab_file, encoding="utf-8") as handle:
                tokens = [line[:-1] for line in handle]  # every line, repeats too (upstream)
            added = extended_vocab(vocab, [], extend) if extend is not True else []
            vocab = {t: i for i, t in enumerate(tokens + added)}  # read_vocab of those lines
            data = prepare_dataset(config.dataset, None if extend is True else vocab,
                                   progress=progress)
            if extend is True:
                added = extended_vocab(vocab, data.clips)
                vocab = {t: i for i, t in enumerate(tokens + added)}  # read_vocab of those lines
            new_tokens = len(added)
        settings = _settings(config, params, data, mixed_precision, lora)
        # each setting once, under the name it is given by (frames under frame batching)
        applied = attrs.asdict(settings)
        if applied["lora"] is None:  # a full run's recipe as before
            del applied["lora"]
        if settings.batch_size_type == "frame":
            applied["batch_frames"] = applied.pop("batch_size")
        self.claim_run(config, weights=[checkpoint, vocab_file], run_dir=run_dir, recipe={
            "engine": self.engine, "method": config.method, "variant": variant.name,
            "seed": config.seed, "memory": config.memory, **applied,
            "params": {k: v for k, v in config.params.items() if k not in applied
                       and k not in ("batch_frames", "max_samples", "logger")},
            "device": str(device)}, rows=((c.text, c.audio) for c in data.clips))
        if extend is not False:
            vocab_file = prepared_dir / VOCAB_FILE
            write_vocab(vocab_file, tokens + added)
            logger.info("vocabulary extended by %d token(s): %s", new_tokens, " ".join(added))
        write_prepared(data, prepared_dir)
        if data.bad_rows:
            logger.warning("%d of %d dataset rows skipped (see %s)", len(data.bad_rows),
                           len(data.bad_rows) + len(data.clips), prepared_dir / REPORT)
        return F5Run(config, model_dir, checkpoint, variant, vocab, data, settings,
                     vocab_file, new_tokens if finetune else 0, finetune, str(device), params)

    def start(self, run: F5Run, world: ProcessWorld) -> FineTuning:
        """Model (upstream's construction, hence its random draws), base weights and loop."""
        from mizuoto.nn.flow import ConditionalFlowMatching
        from mizuoto_f5tts.checkpoint import TEXT_EMBED_KEY, read_checkpoint

        model = ConditionalFlowMatching(run.variant.build_backbone(len(run.vocab)),
                                        num_channels=run.variant.mel_dim)
        if run.finetune:
            base = read_checkpoint(run.checkpoint)
            if run.new_tokens:
                base[TEXT_EMBED_KEY] = expand_text_embedding(base[TEXT_EMBED_KEY], run.new_tokens)
            load_into(model, base, run.checkpoint)
            del base
        self.add_lora(run, model)
        model.to(run.device).train()
        settings = run.settings  # as prepare applied them (device_and_precision)
        runner = self.runner(run, world, device=run.device,
                             mixed_precision=settings.mixed_precision, quirks=QUIRKS,
                             grad_accumulation=settings.grad_accumulation,
                             max_grad_norm=settings.max_grad_norm)
        dataset, output = MelDataset(run.data.clips), Path(run.config.output_dir)
        loop = FineTuning(model, run.vocab, dataset, run.data.durations, settings,
                          py_random=random.Random(run.config.seed), runner=runner,
                          log=output / LOG_FILE, shard_batches=run.params.shard_batches,
                          keep_ema=run.settings.lora is None, samples=TrainingSamples(
                              run.model_dir, dataset, run.vocab, output / "samples",
                              run.config.seed) if run.params.samples else None,  # upstream: off
                          samples_every=checkpoint_retention(run.config)[1])
        # upstream without a pretrained_ file: a fresh EMA
        if not run.finetune or run.settings.lora is not None:
            return loop
        # a .pt file's EMA dict, or the whole file (a safetensors release)
        raw = load_state_dict_file(run.checkpoint, key=("ema_model_state_dict", ""))
        if "initted" in raw and "step" in raw:
            # upstream loads the base file into its EMA: its update counter carries over
            loop.runner.ema.initted = raw["initted"].clone()
            loop.runner.ema.step = raw["step"].clone()
        return loop

    def lora_base_fingerprint(self, run: F5Run) -> str:
        """`F5Engine.base_fingerprint` of the base model, without loading it."""
        from mizuoto_f5tts.checkpoint import weights_fingerprint

        return weights_fingerprint(run.checkpoint, run.vocab)

    def write_export(self, run: F5Run, folder: Path) -> None:
        """The EMA weights as a model directory (`write_model`)."""
        state = load_state_file(Path(run.config.output_dir) / self.checkpoint)
        write_model(folder, state["ema"], state["position"]["update"], run.model_dir,
                    run.variant, base_model=str(run.config.model), vocab_file=run.vocab_file,
                    finetuned=run.finetune)


def expand_text_embedding(weight: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Upstream's ``expand_model_embeddings`` (finetune_gradio): the new rows are
    ``randn`` drawn right after ``torch.manual_seed(666)``, in float32."""
    rows = torch.randn((new_tokens, weight.shape[1]),
                       generator=torch.Generator().manual_seed(666))
    return torch.cat([weight.float(), rows])
