"""Prompt building and the patch-by-patch generation loop, with badcase retry.

Randomness: the flow sampler's starting noise is the only draw, one ``randn`` per patch in the
model dtype, from a fresh ``torch.Generator`` seeded per attempt (attempt ``k`` uses
``seed + k``). Upstream draws from the global generator and never reseeds between attempts; its
parity harness seeds the global generator the same way before each attempt. An audio VAE with
noise blocks draws from the same generator when it decodes (upstream's global one), after the
kept attempt's draws, or between patches when streaming.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import attrs
import torch

from mizuoto.errors import InvalidRequest
from mizuoto_voxcpm.cache_pool import CacheSlot
from mizuoto_voxcpm.kv_cache import CacheFull
from mizuoto_voxcpm.model import VoxCPMModel
from mizuoto_voxcpm.patch_decoder import PatchBuffers, decode_patch, step_language_models
from mizuoto_voxcpm.tokenizer import (
    AUDIO_START_TOKEN_ID,
    REF_AUDIO_END_TOKEN_ID,
    REF_AUDIO_START_TOKEN_ID,
)

log = logging.getLogger(__name__)


@attrs.frozen
class PromptCache:
    """Encoded prompt audio, as upstream's ``build_prompt_cache`` holds it.

    ``prompt_latents`` (continuation: the model speaks on from this recording, whose transcript
    is ``prompt_text``) are left-padded to whole patches; ``reference_latents`` (VoxCPM2's
    isolated reference voice) right-padded. Both ``(patches, patch_size, feat_dim)``, float32.
    """

    prompt_text: str | None = None
    prompt_latents: torch.Tensor | None = None
    reference_latents: torch.Tensor | None = None

    def __attrs_post_init__(self):
        if (self.prompt_text is None) != (self.prompt_latents is None):
            raise ValueError("prompt_text and prompt_latents go together")

    @property
    def mode(self) -> str:
        if self.reference_latents is not None:
            return "ref_continuation" if self.prompt_latents is not None else "reference"
        return "continuation" if self.prompt_latents is not None else "zero_shot"


@attrs.frozen
class PromptSequence:
    """The prefill: token ids, latents and the two masks, each ``(1, n, ...)``."""

    tokens: torch.Tensor
    text_mask: torch.Tensor
    feats: torch.Tensor
    feat_mask: torch.Tensor


def build_sequence(text_ids: list[int], cache: PromptCache | None, *, patch_size: int,
                   feat_dim: int) -> PromptSequence:
    """Lay out ``[ref_start ref… ref_end] text… audio_start [prompt…]`` with its masks.

    ``text_ids`` are the ids of the prompt text followed by the target text (one string).
    """
    cache = cache or PromptCache()
    tokens = [torch.tensor(text_ids + [AUDIO_START_TOKEN_ID], dtype=torch.long)]
    text_length = tokens[0].numel()
    feats = [torch.zeros(text_length, patch_size, feat_dim)]
    text_mask = [torch.ones(text_length, dtype=torch.int32)]
    feat_mask = [torch.zeros(text_length, dtype=torch.int32)]
    if cache.reference_latents is not None:
        ref = cache.reference_latents
        n = ref.size(0)
        blank = torch.zeros(1, patch_size, feat_dim)
        tokens.insert(0, torch.tensor([REF_AUDIO_START_TOKEN_ID] + [0] * n
                                      + [REF_AUDIO_END_TOKEN_ID], dtype=torch.long))
        feats.insert(0, torch.cat([blank, ref.float(), blank]))
        text_mask.insert(0, torch.tensor([1] + [0] * n + [1], dtype=torch.int32))
        feat_mask.insert(0, torch.tensor([0] + [1] * n + [0], dtype=torch.int32))
    if cache.prompt_latents is not None:
        prompt = cache.prompt_latents
        n = prompt.size(0)
        tokens.append(torch.zeros(n, dtype=torch.long))
        feats.append(prompt.float())
        text_mask.append(torch.zeros(n, dtype=torch.int32))
        feat_mask.append(torch.ones(n, dtype=torch.int32))
    return PromptSequence(
        tokens=torch.cat(tokens).unsqueeze(0),
        text_mask=torch.cat(text_mask).unsqueeze(0),
        feats=torch.cat(feats).unsqueeze(0),
        feat_mask=torch.cat(feat_mask).unsqueeze(0),
    )


def context_patches(sequence: PromptSequence, *, v2: bool) -> int:
    """How many trailing prompt patches the decoder gets as context before the new ones.

    VoxCPM2: the last ``min(3, audio patches)`` audio positions when the prefill ends in audio
    (reference patches count when the prompt is shorter: upstream picks by mask, quirk kept).
    First generation: the last ``min(2, audio patches)`` whenever there is prompt audio.
    """
    audio = int(sequence.feat_mask.sum().item())
    if v2:
        return min(3, audio) if int(sequence.feat_mask[0, -1].item()) == 1 else 0
    return min(2, audio)


def context_latents(sequence: PromptSequence, *, v2: bool, device, dtype) -> list[torch.Tensor]:
    """The context patches themselves, each ``(1, 1, patch, feat)`` in the model dtype."""
    count = context_patches(sequence, v2=v2)
    if count == 0:
        return []
    feats = sequence.feats.to(device).to(dtype)
    if v2:
        indices = sequence.feat_mask[0].nonzero(as_tuple=True)[0][-count:]
        return list(feats[:, indices.to(device)].split(1, dim=1))
    return list(feats[:, -count:].split(1, dim=1))


@attrs.frozen
class Sampling:
    steps: int = 10
    guidance: float = 2.0
    min_len: int = 2
    max_patches: int = 4096


def sampling_generator(model: VoxCPMModel, seed: int) -> torch.Generator:
    """The generator one attempt draws from, on the model's device."""
    return torch.Generator(device=model.device).manual_seed(seed)


@torch.inference_mode()
def generate_patches(model: VoxCPMModel, sequence: PromptSequence, sampling: Sampling, *,
                     seed: int, generator: torch.Generator | None = None,
                     speculate: bool | None = None, slot: CacheSlot | None = None
                     ) -> Iterator[tuple[torch.Tensor, bool]]:
    """Yield each new patch ``(1, patch_size, feat_dim)`` (model dtype) of one attempt, with
    whether it is the attempt's last.

    The stop head reads the LM state the patch was sampled from, so whether a patch is the last
    is known as soon as it is sampled: a stream marks its last chunk without holding one back.
    ``speculate`` (default: off the CPU, and always with CUDA graphs): each patch
    (:func:`~mizuoto_voxcpm.patch_decoder.decode_patch`, or its graph) steps the LMs before its
    stop flag is read, the one wait for the device per patch, and a step after the last patch
    is discarded. Otherwise the LMs step after the patch is yielded, as upstream orders it.
    The samples are the same either way. ``generator`` (default: a new one seeded with
    ``seed``) is the one the patches draw from. ``slot`` (default: the model's own) holds the
    LM caches; everything else a patch reads or writes is this call's own.
    """
    device, dtype = model.device, model.dtype
    slot = slot if slot is not None else model.caches
    feats = sequence.feats.to(device).to(dtype)
    try:
        lm_hidden, residual_hidden = model.prefill(sequence.tokens.to(device),
                                                   sequence.text_mask.to(device), feats,
                                                   sequence.feat_mask.to(device), slot)
    except CacheFull as exc:
        raise InvalidRequest("text", str(exc), "shorten the text or the prompt audio") from exc
    if generator is None:
        generator = sampling_generator(model, seed)
    # CUDA graphs replay over the model's own slot only
    graphs = model.patch_graphs if slot is model.caches else None
    if speculate is None:
        speculate = graphs is not None or device.type != "cpu"
    buffers = graphs.buffers if graphs is not None else PatchBuffers.allocate(model)
    buffers.start(lm_hidden, residual_hidden, feats[:, -1])
    for index in range(sampling.max_patches):
        room = slot.has_room
        if graphs is not None and room:
            patch = graphs.decode_patch(steps=sampling.steps, guidance=sampling.guidance,
                                        generator=generator)
        else:
            patch = decode_patch(model, buffers, slot, steps=sampling.steps,
                                 guidance=sampling.guidance, generator=generator,
                                 step_lms=speculate and room)
        # before min_len the stop head cannot end speech: no need to wait for its flag
        stopped = index > sampling.min_len and bool(buffers.stop.item())
        capped = index == sampling.max_patches - 1
        if not room and not stopped:
            # upstream's LM step after this patch would find the cache full (also on the
            # last patch of the cap: upstream still steps there)
            raise InvalidRequest("max_len", str(slot.cache_full()),
                                 "lower max_len or shorten the text")
        if stopped and speculate and room:
            slot.rewind()
        yield patch, stopped or capped
        if stopped or capped:
            return
        if not speculate:
            step_language_models(model, buffers, patch, slot)


@attrs.frozen
class Generated:
    """The latents of the kept attempt: context patches first, then the new ones."""

    patches: torch.Tensor  # (1, patches, patch_size, feat_dim), model dtype
    context: int
    attempts: int
    seed: int  # the seed of the kept attempt
    generator: torch.Generator  # the kept attempt's, after its draws: the decoder's noise


def patch_cap(target_tokens: int, ratio: float, max_len: int) -> int:
    """Upstream's length cap: ``min(int(tokens × ratio + 10), max_len)`` patches."""
    return min(int(target_tokens * ratio + 10), max_len)


def generate(model: VoxCPMModel, sequence: PromptSequence, sampling: Sampling, *, seed: int,
             target_tokens: int, retry_badcase: bool, retry_max_times: int, retry_ratio: float,
             on_patch: Callable[[int], None] | None = None,
             slot: CacheSlot | None = None) -> Generated:
    """Generate until the stop head fires or the cap; regenerate badcases with ``seed + k``.

    A badcase has at least ``retry_ratio`` new patches per target text token (the first
    generation counts the prompt's context patches too: upstream quirk, kept). At most
    ``retry_max_times`` attempts; the last one is kept whatever its length.
    """
    v2 = model.config.is_v2
    context = context_latents(sequence, v2=v2, device=model.device, dtype=model.dtype)
    attempt = 0
    while True:
        new = []
        generator = sampling_generator(model, seed + attempt)
        for patch, _ in generate_patches(model, sequence, sampling, seed=seed + attempt,
                                         generator=generator, slot=slot):
            new.append(patch.unsqueeze(1))
            if on_patch is not None:
                on_patch(len(new))
        counted = len(new) + (0 if v2 else len(context))
        badcase = counted >= target_tokens * retry_ratio
        if retry_badcase and badcase and attempt + 1 < retry_max_times:
            log.info("badcase: %d patches for %d text tokens, retrying with seed %d",
                     counted, target_tokens, seed + attempt + 1)
            attempt += 1
            continue
        return Generated(torch.cat(context + new, dim=1), len(context), attempt + 1,
                         seed + attempt, generator)
