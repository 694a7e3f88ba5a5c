"""VoxCPM's step over the open requests of one model: each row advances one patch.

The core's scheduler (:mod:`mizuoto.contracts.scheduler`) owns admission, turns, back-pressure
and cancellation, and calls :meth:`PatchSteps.step` from one thread at a time (its stepping
thread); nothing here takes a lock or starts a thread, and the cache pool is touched only from
that thread. A row is one request: a stream (each patch decoded to its segment as soon as it is
sampled, as upstream's ``generate_streaming``) or a whole utterance (each text chunk decoded at
once when its last patch is sampled, with upstream's badcase retry, as ``generate``).

A step: the rows that start a text chunk (or a retry) are prefilled (one prefill per prompt:
:class:`PrefillMemo`; distinct prompts packed into one pass when batching), each row's previous
patch is fed to both LMs, then every row samples a patch. Rows with the same sampler settings
run up to ``max_batch`` at a time as one batch of each kernel; a row in a group of one runs
the single-sequence kernels in upstream's order (:func:`~mizuoto_voxcpm.patch_decoder.
decode_patch`, then :func:`~mizuoto_voxcpm.patch_decoder.step_language_models`), so a request
stepped alone (``max_batch`` 1: the rows take turns per patch) is bit-identical to
:func:`~mizuoto_voxcpm.generation.generate_patches` and :func:`~mizuoto_voxcpm.generation.
generate`. Each row draws only from its own generator (seeded per text chunk and attempt).
What can differ in a batch of several are the bits of the batched matrix products and VAE
convolutions (docs/performance.md, "Batched VoxCPM generation"): a row says whether it was
ever stepped with others (``applied.compute["batched"]``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from typing import Any

import attrs
import torch

from mizuoto.contracts.results import check_finite
from mizuoto.errors import InvalidRequest
from mizuoto_voxcpm.audiovae.blocks import NoiseBlock, noise_drawn_from
from mizuoto_voxcpm.cache_pool import CachePool, CacheSlot
from mizuoto_voxcpm.decoding import StreamDecoder, decode_segments, decode_utterance
from mizuoto_voxcpm.generation import (
    PromptSequence,
    Sampling,
    context_latents,
    sampling_generator,
)
from mizuoto_voxcpm.kv_cache import CacheFull
from mizuoto_voxcpm.model import Prefilled, VoxCPMModel
from mizuoto_voxcpm.patch_decoder import PatchBuffers, decode_patch, step_language_models

log = logging.getLogger(__name__)

#: recent prefills kept for requests with the same prompt
PREFILL_MEMO_SIZE = 8
#: the most prompts packed into one prefill pass
PACKED_PREFILLS = 16


@attrs.frozen
class ChunkRun:
    """One text chunk of a request, ready to generate: its token sequence, its number of
    text tokens, its sampler settings (patch cap included) and its seed."""

    sequence: PromptSequence
    tokens: int
    sampling: Sampling
    seed: int


@attrs.frozen
class Retry:
    """Upstream's badcase rule for a whole utterance: an attempt with at least ``ratio``
    patches per text token is generated again with the next seed, at most ``max_times``
    attempts."""

    enabled: bool
    max_times: int
    ratio: float


@attrs.define(eq=False)
class PatchRow:
    """One request's state between steps. ``retry`` set: a whole utterance (``synthesize``);
    None: a stream. ``owner`` is the engine's (its plan of the request)."""

    runs: tuple[ChunkRun, ...]
    retry: Retry | None = None
    tiled: bool = False
    owner: Any = None
    chunk: int = 0  # the text chunk being generated
    attempt: int = 0
    started: bool = False  # prefilled for this chunk and attempt
    generator: torch.Generator | None = None
    slot: CacheSlot | None = None
    buffers: PatchBuffers | None = None
    decoder: StreamDecoder | None = None
    context: list = attrs.Factory(list)  # the prompt's context patches
    sampled: int = 0  # patches of this attempt
    pending: torch.Tensor | None = None  # the last patch, not yet fed to the LMs
    new: list = attrs.Factory(list)  # a whole utterance's patches of this attempt
    pieces: list = attrs.Factory(list)  # a whole utterance's audio, per text chunk
    fallbacks: list = attrs.Factory(list)
    retries: int = 0
    patches: int = 0  # patches kept, all chunks
    batched: bool = False  # ever stepped (or prefilled) in one kernel call with other rows

    @property
    def whole(self) -> bool:
        return self.retry is not None

    @property
    def run(self) -> ChunkRun:
        return self.runs[self.chunk]

    @property
    def key(self) -> tuple[int, float]:
        # rows batch with rows of the same sampler settings (the DiT's step count and the
        # guidance are one Python value per call, as alone)
        return self.run.sampling.steps, self.run.sampling.guidance


@attrs.define
class PatchStats:
    """What the steps have done: steps, rows stepped, seconds; the last step's size; prefills
    run and those served from another request's (:class:`PrefillMemo`); VAE calls of streams."""

    steps: int = 0
    rows: int = 0
    seconds: float = 0.0
    last_size: int = 0
    last_seconds: float = 0.0
    batched_rows: int = 0  # rows sampled in a batch of several
    prefills: int = 0
    prefills_shared: int = 0
    prefill_seconds: float = 0.0
    decodes: int = 0
    decoded: int = 0
    decode_seconds: float = 0.0


class PrefillMemo:
    """The last ``size`` prefills, by prompt: requests with the same prompt (text, prompt
    audio, reference) share one. Exact: a prefill depends only on its prompt and the weights,
    so its keys and values are the ones the request would compute; :meth:`clear` when the
    weights change (a LoRA)."""

    def __init__(self, size: int = PREFILL_MEMO_SIZE) -> None:
        self.size = size
        self._entries: OrderedDict[bytes, Prefilled] = OrderedDict()

    @staticmethod
    def key(sequence: PromptSequence) -> bytes:
        digest = hashlib.sha256()
        for tensor in (sequence.tokens, sequence.text_mask, sequence.feat_mask, sequence.feats):
            tensor = tensor.detach().cpu().contiguous()
            digest.update(repr((tensor.dtype, tuple(tensor.shape))).encode())
            digest.update(tensor.view(torch.uint8).numpy().tobytes())
        return digest.digest()

    def get(self, key: bytes) -> Prefilled | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: bytes, prefilled: Prefilled) -> None:
        self._entries[key] = prefilled
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()


class _RowFailed(Exception):
    """A row's own failure inside a step (its context full): it ends that row only."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class PatchSteps:
    """The step over ``model``'s rows: up to ``max_batch`` rows per batched kernel call;
    ``vae`` decodes, ``pool`` holds the rows' cache slots; ``tail_decode`` (a fast
    profile's): a stream's window decodes only its newest patch's samples."""

    def __init__(self, model: VoxCPMModel, vae, pool: CachePool, *, max_batch: int,
                 oom_fallback: bool = True, tail_decode: bool = False) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.model = model
        self.vae = vae
        self.pool = pool
        self.max_batch = max_batch
        self.oom_fallback = oom_fallback
        self.tail_decode = tail_decode
        self.stats = PatchStats()
        self.memo = PrefillMemo()
        # a VAE with noise blocks draws from the row's generator between two patches: its
        # streams are decoded row by row, right after each patch is sampled, as alone
        self._noisy_vae = any(isinstance(m, NoiseBlock) for m in vae.modules())

    @torch.inference_mode()
    def step(self, rows: list[PatchRow]) -> list[list[tuple[torch.Tensor, bool]] | BaseException]:
        """One patch for each of ``rows``; for each row, in order, the audio made now, each
        piece with whether it is the request's last (a stream: a segment per patch; a whole
        utterance: its audio once, at the end), or the row's own error."""
        started = time.perf_counter()
        made: dict[int, list] = {id(row): [] for row in rows}
        failed: dict[int, BaseException] = {}
        self._start([row for row in rows if not row.started], failed)
        live = [row for row in rows if id(row) not in failed]
        self._advance([row for row in live if row.pending is not None])
        groups: dict[tuple[int, float], list[PatchRow]] = {}
        for row in live:
            groups.setdefault(row.key, []).append(row)
        decode: list[tuple[PatchRow, torch.Tensor, bool]] = []
        for group in groups.values():
            for first in range(0, len(group), self.max_batch):
                batch = group[first:first + self.max_batch]
                sampled = self._sample_alone(batch[0]) if len(batch) == 1 else \
                    self._sample_batch(batch)
                for row, (patch, stop, stepped) in zip(batch, sampled, strict=True):
                    try:
                        self._after_patch(row, patch, stop, stepped, made[id(row)], decode)
                    except _RowFailed as exc:
                        failed[id(row)] = exc.error
        self._decode(decode, made)
        self.stats.steps += 1
        self.stats.rows += len(rows)
        self.stats.last_size = len(rows)
        self.stats.last_seconds = time.perf_counter() - started
        self.stats.seconds += self.stats.last_seconds
        return [failed.get(id(row), made[id(row)]) for row in rows]

    def close(self, row: PatchRow) -> None:
        """Release ``row``'s cache slot and decoder (the scheduler's stepping thread, or no
        step running)."""
        if row.decoder is not None:
            row.decoder.close()
            row.decoder = None
        if row.slot is not None:
            slot, row.slot = row.slot, None
            self.pool.release(slot)

    # -- a chunk's start: its prefill ------------------------------------------------------

    def _start(self, rows: list[PatchRow], failed: dict[int, BaseException]) -> None:
        """Prefill ``rows`` (each at the start of a text chunk or an attempt) into their
        slots: one prefill per distinct prompt (the memo's when it has it); the prompts not in
        the memo, when several and batching, packed into one pass (not kept in the memo: a
        packed prefill's bits may differ from the prompt's alone)."""
        model = self.model
        by_prompt: dict[bytes, list[PatchRow]] = {}
        for row in rows:
            self._begin(row)
            by_prompt.setdefault(self.memo.key(row.run.sequence), []).append(row)
        prefills: dict[bytes, Prefilled] = {}
        missing = []
        for key, group in by_prompt.items():
            found = self.memo.get(key)
            if found is not None:
                prefills[key] = found
                self.stats.prefills_shared += len(group)
            elif group[0].run.sequence.tokens.size(1) > model.config.max_length:
                prefills[key] = None  # refused by its slot below, kept out of the pass
            else:
                missing.append(key)
                self.stats.prefills_shared += len(group) - 1
        started = time.perf_counter()
        packs = [missing[i:i + min(self.max_batch, PACKED_PREFILLS)]
                 for i in range(0, len(missing), min(self.max_batch, PACKED_PREFILLS))]
        for keys in packs:
            sequences = [by_prompt[key][0].run.sequence for key in keys]
            if len(keys) == 1:  # alone: the single-prompt prefill, exactly; kept
                prefills[keys[0]] = prefilled = model.prefill_states(*_on_device(model,
                                                                                 sequences[0]))
                self.memo.put(keys[0], prefilled)
            else:
                prefills.update(zip(keys, model.prefill_packed(sequences), strict=True))
                for key in keys:
                    for row in by_prompt[key]:
                        row.batched = True
        self.stats.prefills += len(missing)
        self.stats.prefill_seconds += time.perf_counter() - started
        for key, group in by_prompt.items():
            for row in group:
                try:
                    self._fill(row, prefills[key])
                except _RowFailed as exc:
                    failed[id(row)] = exc.error

    def _begin(self, row: PatchRow) -> None:
        """A row's state for its text chunk and attempt: its slot (kept across chunks), a
        generator seeded with the chunk's seed plus the attempt, its context, a decoder."""
        model = self.model
        if row.slot is None:
            row.slot = self.pool.acquire()
        if row.buffers is None:
            graphs = self._graphs(row)
            row.buffers = graphs.buffers if graphs is not None else \
                PatchBuffers.allocate(model)
        row.generator = sampling_generator(model, row.run.seed + row.attempt)
        v2 = model.config.is_v2
        row.context = context_latents(row.run.sequence, v2=v2, device=model.device,
                                      dtype=model.dtype)
        row.sampled, row.new, row.pending = 0, [], None
        if not row.whole:
            if row.decoder is not None:
                row.decoder.close()
            row.decoder = StreamDecoder(self.vae, context=row.context, v2=v2,
                                        patch_size=model.config.patch_size,
                                        tail=self.tail_decode)
        row.started = True

    def _fill(self, row: PatchRow, prefilled: Prefilled | None) -> None:
        sequence = row.run.sequence
        try:
            if prefilled is None:
                raise CacheFull(f"the prompt is {sequence.tokens.size(1)} positions long "
                                f"but the model's context (max_length) holds "
                                f"{self.model.config.max_length}")
            prefilled.fill(row.slot)
        except CacheFull as exc:
            raise _RowFailed(InvalidRequest("text", str(exc),
                                            "shorten the text or the prompt audio")) from exc
        feats = sequence.feats.to(self.model.device).to(self.model.dtype)
        row.buffers.start(prefilled.lm_hidden, prefilled.residual_hidden, feats[:, -1])

    # -- a patch -----------------------------------------------------------------------------

    def _graphs(self, row: PatchRow):
        """The model's captured patch (CUDA graphs) when ``row`` holds the model's own slot,
        the one they replay over."""
        graphs = self.model.patch_graphs
        return graphs if graphs is not None and row.slot is self.model.caches else None

    def _advance(self, rows: list[PatchRow]) -> None:
        """Feed each row's previous patch to both LMs, ``max_batch`` rows at a time."""
        model = self.model
        for first in range(0, len(rows), self.max_batch):
            batch = rows[first:first + self.max_batch]
            if len(batch) == 1:
                row = batch[0]
                step_language_models(model, row.buffers, row.pending, row.slot)
                row.pending = None
                continue
            # the patches as the sampler leaves them, a transposed view (one row's, alone,
            # goes to the encoder as such: a contiguous copy would take another
            # matrix-product path)
            channels_first = torch.cat([row.pending.transpose(1, 2) for row in batch])
            embeds = model.encode_patch_rows(channels_first.transpose(1, 2))
            lm_next, residual_next = model.advance_rows(embeds, [row.slot for row in batch])
            for index, row in enumerate(batch):
                row.buffers.lm_hidden.copy_(lm_next[index:index + 1])
                row.buffers.residual_hidden.copy_(residual_next[index:index + 1])
                row.pending = None
                row.batched = True

    def _sample_alone(self, row: PatchRow) -> list[tuple[torch.Tensor, bool, bool]]:
        """One patch of ``row`` by the single-sequence kernels, as
        :func:`~mizuoto_voxcpm.generation.generate_patches` samples it: the captured patch
        (which steps the LMs too) where the row holds the graphs' slot with room."""
        sampling = row.run.sampling
        graphs = self._graphs(row)
        if graphs is not None and row.slot.has_room:
            patch = graphs.decode_patch(steps=sampling.steps, guidance=sampling.guidance,
                                        generator=row.generator)
            return [(patch, bool(row.buffers.stop.item()), True)]
        patch = decode_patch(self.model, row.buffers, row.slot, steps=sampling.steps,
                             guidance=sampling.guidance, generator=row.generator,
                             step_lms=False)
        return [(patch, bool(row.buffers.stop.item()), False)]

    def _sample_batch(self, rows: list[PatchRow]) -> list[tuple[torch.Tensor, bool, bool]]:
        model = self.model
        steps, guidance = rows[0].key
        shape = (1, model.feat_dim, model.patch_size)
        # each row's one draw, from its own generator, as alone
        noise = torch.cat([torch.randn(shape, generator=row.generator, device=model.device,
                                       dtype=model.dtype) for row in rows])
        lm_hidden = torch.cat([row.buffers.lm_hidden for row in rows])
        residual_hidden = torch.cat([row.buffers.residual_hidden for row in rows])
        previous = torch.cat([row.buffers.previous for row in rows])
        patches = model.sample(lm_hidden, residual_hidden, previous, noise, steps=steps,
                               guidance=guidance, rowwise=True)
        stops = model.stop_flag(lm_hidden).tolist()
        self.stats.batched_rows += len(rows)
        sampled = []
        for index, row in enumerate(rows):
            patch = patches[index:index + 1]
            row.buffers.previous.copy_(patch)
            row.batched = True
            sampled.append((patch, stops[index], False))
        return sampled

    def _after_patch(self, row: PatchRow, patch: torch.Tensor, stop: bool, lms_stepped: bool,
                     made: list, decode: list) -> None:
        """The rules of :func:`~mizuoto_voxcpm.generation.generate_patches` for the patch just
        sampled (no stop before ``min_len``, the cap, room in the cache for the LM step after
        it), then the patch's way on: a stream's to its decoder, a whole utterance's kept."""
        sampling = row.run.sampling
        room = row.slot.has_room or lms_stepped
        stopped = row.sampled > sampling.min_len and stop
        capped = row.sampled == sampling.max_patches - 1
        row.sampled += 1
        if not room and not stopped:
            # upstream's LM step after this patch would find the cache full
            raise _RowFailed(InvalidRequest("max_len", str(row.slot.cache_full()),
                                            "lower max_len or shorten the text"))
        if stopped and lms_stepped:
            row.slot.rewind()  # the step taken with the patch feeds nothing
        end = stopped or capped
        row.pending = None if end or lms_stepped else patch
        if row.whole:
            row.new.append(patch.unsqueeze(1))
            if end:
                self._end_attempt(row, made)
            return
        row.patches += 1
        final = end and row.chunk == len(row.runs) - 1
        if self._noisy_vae:
            # the decoder's noise draws between the patches' draws, as upstream's
            with noise_drawn_from(self.vae, row.generator):
                made.append((row.decoder.decode(patch), final))
        else:
            decode.append((row, patch, final))
        if end and not final:
            row.chunk += 1
            row.started = False

    def _decode(self, work: list[tuple[PatchRow, torch.Tensor, bool]], made: dict) -> None:
        """Each stream row's patch to its segment, up to ``max_batch`` rows at a time in one
        VAE call per window length (a row alone: its own decode, exactly)."""
        for first in range(0, len(work), self.max_batch):
            batch = work[first:first + self.max_batch]
            started = time.perf_counter()
            segments = decode_segments([row.decoder for row, _, _ in batch],
                                       [patch for _, patch, _ in batch])
            for (row, _, final), segment in zip(batch, segments, strict=True):
                made[id(row)].append((segment, final))
                row.batched |= len(batch) > 1
            self.stats.decodes += 1
            self.stats.decoded += len(batch)
            self.stats.decode_seconds += time.perf_counter() - started

    def _end_attempt(self, row: PatchRow, made: list) -> None:
        """A whole utterance's text chunk sampled: retried with the next seed when a badcase
        (:class:`Retry`), else decoded; its audio handed on after the last chunk."""
        model, run, retry = self.model, row.run, row.retry
        v2 = model.config.is_v2
        # the first generation counts the prompt's context patches too: upstream quirk, kept
        counted = len(row.new) + (0 if v2 else len(row.context))
        if (retry.enabled and counted >= run.tokens * retry.ratio
                and row.attempt + 1 < retry.max_times):
            log.info("badcase: %d patches for %d text tokens, retrying with seed %d",
                     counted, run.tokens, run.seed + row.attempt + 1)
            row.attempt += 1
            row.started = False
            return
        row.retries += row.attempt
        row.patches += len(row.new)
        part = f" (chunk {row.chunk + 1} of {len(row.runs)})" if len(row.runs) > 1 else ""
        patches = torch.cat(row.context + row.new, dim=1)
        check_finite(patches, f"voxcpm language model and local DiT{part}")
        with noise_drawn_from(self.vae, row.generator):
            audio = decode_utterance(self.vae, patches, context=len(row.context), v2=v2,
                                     patch_size=model.config.patch_size,
                                     fallbacks=row.fallbacks, oom_fallback=self.oom_fallback,
                                     tiled=row.tiled)
        check_finite(audio, f"voxcpm audio VAE{part}")
        row.pieces.append(audio)
        row.new = []
        if row.chunk == len(row.runs) - 1:
            made.append((torch.cat(row.pieces), True))
        else:
            row.chunk, row.attempt, row.started = row.chunk + 1, 0, False


def _on_device(model: VoxCPMModel, sequence: PromptSequence) -> tuple[torch.Tensor, ...]:
    """``prefill_states``' arguments: the sequence's tensors on the model's device."""
    device = model.device
    return (sequence.tokens.to(device), sequence.text_mask.to(device),
            sequence.feats.to(device).to(model.dtype), sequence.feat_mask.to(device))
