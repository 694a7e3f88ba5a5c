"""Validation losses as upstream's ``train_voxcpm_finetune.py`` computes them (``val_manifest``,
``valid_interval``), with the same effect on the steps after it (the pass itself is core's
`mizuoto.training.validation`).

After step ``s`` (0-based) when ``s % valid_interval == 0`` or ``s`` is the last: the model in
eval mode (LoRA dropout off, the FSQ layer rounding outright instead of straight-through),
without gradients, over at most :data:`MAX_BATCHES` batches of a fresh shuffled pass over the
validation rows (its ``DataLoader`` draws a base seed and a sampler seed, then ``randperm``;
``drop_last`` off), each at ``progress`` 0 with the forward's random draws. Logged: the mean of
``lambda_diff · loss/diff + lambda_stop · loss/stop`` and of each loss over the batches.

Then upstream speaks the first :data:`SPOKEN` validation texts into TensorBoard (zero-shot, 10
steps, guidance 2, at most ``6 · tokens + 10`` patches, the audio VAE decoding them). Mizuoto
generates the same patches from the same generator (and decodes, which draws too when the VAE
has noise blocks), so the training steps after a validation draw what upstream's draw, and
writes them as ``samples/step_<s>_<i>.wav`` in the run directory (and TensorBoard audio when
installed) unless ``params.samples`` is false (no mel plots).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mizuoto_voxcpm.generation import Sampling, build_sequence, generate_patches, patch_cap

#: upstream's ``max_val_batches``
MAX_BATCHES = 10
#: validation texts upstream speaks after each validation (``generate_sample_audio``)
SPOKEN = 2
#: what upstream's model-level ``generate`` call uses
SPOKEN_SAMPLING = Sampling(steps=10, guidance=2.0, min_len=2, max_patches=2000)
SPOKEN_RATIO = 6.0
#: the metrics a validation adds to its step's row (upstream's TensorBoard tags)
KEYS = ("val/loss/total", "val/loss/diff", "val/loss/stop")


def speak(model, vae, texts: Sequence[Sequence[int]], generator: torch.Generator
          ) -> list[np.ndarray]:
    """Generate what upstream speaks after a validation (``texts``: the validation rows' token
    ids, as upstream's model tokenizes them), drawing from ``generator`` as upstream draws
    from its global one; the decoded audio when the VAE has its decoder (kept for samples, or
    because its noise blocks draw), else nothing."""
    from mizuoto_voxcpm.audiovae.blocks import noise_drawn_from
    from mizuoto_voxcpm.decoding import patches_to_latents

    config = model.config
    spoken = []
    model.allocate_caches()
    try:
        for ids in texts[:SPOKEN]:
            ids = list(ids)
            cap = patch_cap(len(ids), SPOKEN_RATIO, SPOKEN_SAMPLING.max_patches)
            sampling = Sampling(steps=SPOKEN_SAMPLING.steps, guidance=SPOKEN_SAMPLING.guidance,
                                min_len=SPOKEN_SAMPLING.min_len, max_patches=cap)
            sequence = build_sequence(ids, None, patch_size=config.patch_size,
                                      feat_dim=config.feat_dim)
            patches = [patch for patch, _ in generate_patches(model, sequence, sampling, seed=0,
                                                              generator=generator)]
            if vae.decoder is not None:  # kept for samples, or because its noise blocks draw
                with torch.inference_mode(), noise_drawn_from(vae, generator):
                    audio = vae.decode(patches_to_latents(torch.stack(patches, dim=1)).to(
                        next(vae.parameters()).device))
                spoken.append(audio.detach().float().reshape(-1).cpu().numpy())
    finally:
        model.caches = None
    return spoken

