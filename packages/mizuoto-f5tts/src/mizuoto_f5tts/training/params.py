"""`F5TrainingParams`: what a run's ``config.params`` may set for the F5-TTS trainer — the
settings every trainer shares (core's `TrainerParams`: warm-up, accumulation, clipping,
checkpoint cadence, keep-last, logger, samples) and F5's own, each declared and checked once.

Defaults are ``f5-tts_finetune-cli``'s where it has one; None means a value derived from the
run (documented per field).
"""

from __future__ import annotations

from pathlib import Path

import attrs

from mizuoto.contracts.trainer import MAX_STEPS, TrainerParams
from mizuoto.errors import InvalidRequest
from mizuoto.training.lora import LoRAParams
from mizuoto.validation.ranges import boolean, integer_in, one_of
from mizuoto_f5tts.variants import VARIANT_NAMES

BATCH_SIZE_TYPES = ("frame", "sample")
#: torch.Generator.manual_seed's range (upstream's sampler seed may be any of it)
MAX_SHUFFLE_SEED = 2**64 - 1
#: frames per batch / clips per frame batch: generous bounds, a typo refused before any work
MAX_FRAMES = 10**9


def _extend_vocab(instance, attribute, value):
    if isinstance(value, bool):
        return
    if not (isinstance(value, (list, tuple)) and all(isinstance(t, str) for t in value)):
        raise InvalidRequest("params.extend_vocab", "must be true (the data's new tokens) or a "
                             "list of tokens", f"got {value!r}")


def _vocab_file(instance, attribute, value):
    if value is not None and not (isinstance(value, (str, Path)) and Path(value).is_file()):
        raise InvalidRequest("params.vocab_file", f"must be a vocab.txt file, got {value!r}",
                             "one token per line, as upstream's --tokenizer_path")


@attrs.frozen
class F5TrainingParams(TrainerParams, LoRAParams):
    """F5's own params, besides the shared ones.

    - ``epochs``: default enough for ``steps`` updates; the learning-rate schedule spans all of
      them, as upstream's.
    - ``batch_size_type``: ``frame`` (upstream's default: ``batch_frames`` frames per batch, at
      most ``max_samples`` clips) or ``sample`` (``config.batch_size`` clips per batch).
    - ``shuffle_seed``: upstream's ``resumable_with_seed`` (666).
    - ``variant``: ``v1_base``, ``base`` or ``e2_base``; default the model directory's record,
      the weights or upstream's release file name, never the folders' names
      (`mizuoto_f5tts.identification`; an unnamed DiT is refused).
    - ``shard_batches``: under torchrun, each process its share of the batches (default true).
    - ``extend_vocab``: true adds the data's tokens the vocabulary lacks, or a list of tokens;
      the text embedding grows as upstream's ``expand_model_embeddings`` grows it.
    - ``vocab_file``: upstream's ``--tokenizer custom --tokenizer_path`` (this vocabulary
      instead of the model directory's).
    - ``finetune``: false is upstream without ``--finetune``: the model starts from its random
      initialisation.
    - ``lora_r`` (8), ``lora_alpha`` (16), ``lora_dropout`` (0), ``lora_targets`` (the DiT's
      attention and feed-forward projections, `mizuoto_f5tts.lora.LORA_TARGETS`): a
      ``--method lora`` run's adapters (`mizuoto.training.lora.LoRAParams`).

    The shared ones as F5 applies them: ``warmup_updates`` default a tenth of the run, at most
    upstream's 20000, never all of it; ``grad_accumulation`` 1; ``max_grad_norm`` 1.0;
    ``checkpoint_every`` (upstream's ``save_per_updates``; ``save_every`` is its
    ``last_per_updates``) numbered copies ``checkpoints/model_<update>.pt``, the newest
    ``keep_last_n_checkpoints`` kept; ``samples`` (upstream's ``--log_samples``, off) writes
    audio every ``checkpoint_every`` updates (`mizuoto_f5tts.training.samples`).
    """

    epochs: int | None = attrs.field(
        default=None, validator=integer_in("params.epochs", 1, MAX_STEPS, optional=True))
    batch_size_type: str = attrs.field(default="frame",
                                       validator=one_of(BATCH_SIZE_TYPES, prefix="params."))
    batch_frames: int = attrs.field(
        default=3200, validator=integer_in("params.batch_frames", 1, MAX_FRAMES))
    max_samples: int = attrs.field(
        default=64, validator=integer_in("params.max_samples", 0, MAX_FRAMES))
    shuffle_seed: int = attrs.field(
        default=666, validator=integer_in("params.shuffle_seed", 0, MAX_SHUFFLE_SEED))
    variant: str | None = attrs.field(
        default=None, validator=one_of(VARIANT_NAMES, prefix="params.", optional=True))
    shard_batches: bool = attrs.field(default=True, validator=boolean(prefix="params."))
    extend_vocab: bool | list[str] | tuple[str, ...] = attrs.field(
        default=False, validator=_extend_vocab)
    vocab_file: str | Path | None = attrs.field(default=None, validator=_vocab_file)
    finetune: bool = attrs.field(default=True, validator=boolean(prefix="params."))
