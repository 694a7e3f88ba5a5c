"""Audio samples while training: upstream's ``--log_samples``.

At every numbered-checkpoint update (upstream's ``save_per_updates``) the model being trained
(not its EMA, as upstream) speaks a clip's text twice, continuing from the clip itself: the
clip's mel as the reference, its tokens, a space and its tokens again as the text, twice the
clip's frames; 32 steps, guidance 2, sway -1 (upstream's ``utils_infer`` defaults). The
generated part and the reference are vocoded and written as ``samples/update_<N>_gen.wav`` and
``update_<N>_ref.wav`` (24 kHz), and as TensorBoard audio when it is installed.

Upstream takes the first clip of the batch at hand and draws the sampler's noise from the
training's own random generator, so turning samples on changes its training from then on.
Here the clip is the data set's first and the noise has its own generator (seeded with the run's
seed and the update), and torch's generator is restored after: the training bytes are the same
with and without samples.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import attrs
import torch

from mizuoto.training import MetricsLog
from mizuoto.training.audio_samples import sampling, write_audio_samples
from mizuoto_f5tts.checkpoint import VOCOS_DIR, load_vocos
from mizuoto_f5tts.training.batching import MelDataset
from mizuoto_f5tts.training.loop import text_ids

logger = logging.getLogger(__name__)

SAMPLE_RATE = 24000
STEPS, GUIDANCE, SWAY = 32, 2.0, -1.0  # upstream's nfe_step, cfg_strength, sway_sampling_coef


@attrs.define
class TrainingSamples:
    model_dir: Path
    dataset: MelDataset
    vocab: Mapping[str, int]
    directory: Path
    seed: int
    # loaded at the first sample, inside its forked RNG: building Vocos draws its initial
    # weights from torch's generator
    vocoder: object = attrs.field(default=None, init=False)

    def __call__(self, model: torch.nn.Module, update: int,
                 metrics: MetricsLog | None = None) -> tuple[Path, Path]:
        with sampling(model) as device:
            if self.vocoder is None:
                self.vocoder = load_vocos(self.model_dir / VOCOS_DIR)
            mel, tokens = self.dataset[0]
            frames = mel.shape[-1]
            cond = mel.T[None].to(device)
            text = text_ids([list(tokens) + [" "] + list(tokens)], self.vocab)
            generator = torch.Generator(cond.device).manual_seed(self.seed + update)
            generated, _ = model.sample(cond, text, frames * 2, steps=STEPS,
                                        cfg_strength=GUIDANCE, sway_sampling_coef=SWAY,
                                        generator=generator)
            gen_mel = generated.to(torch.float32)[:, frames:, :].permute(0, 2, 1).cpu()
            gen = self.vocoder.decode(gen_mel).squeeze().numpy()
            ref = self.vocoder.decode(mel[None].float().cpu()).squeeze().numpy()
        paths = write_audio_samples(self.directory, [
            (f"update_{update}_{kind}", audio, f"samples/{kind}")
            for kind, audio in (("gen", gen), ("ref", ref))], SAMPLE_RATE, step=update,
            metrics=metrics)
        logger.info("samples of update %d written to %s", update, self.directory)
        return paths[0], paths[1]
