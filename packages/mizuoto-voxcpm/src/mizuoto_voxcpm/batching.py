"""Continuous batching: the open streams of one model advance together, patch by patch.

On a CPU one VoxCPM patch is thousands of small matrix products whose cost is reading the
weights; ``b`` sequences read them once. A request joins after its prefill (its own, in its own
cache slot) and takes part in every step from then on: one step samples a patch for each row
that is waiting for one (the DiT's guided Euler steps, the stop head) and feeds the patches of
the rows that go on through the local encoder and both LMs, all as ``b``-row batches. Each row
keeps its own generator (its noise is drawn alone, in its order), buffers, cache slot and
position, so rows join and leave at any patch boundary and a slot is free again as soon as its
row stops or its stream is closed.

A row takes part in a step only when its previous patch has been handed on (and decoded: a VAE
with noise blocks draws from the row's generator between two patches), so the numbers each
row draws are the ones it draws alone. What can differ from the row's audio alone are the bits
of the batched matrix products (see docs/performance.md, "Batched VoxCPM generation"): the
engine turns batching on only when asked (``engines.voxcpm.max_batch``) and every result says
``applied.compute["batched"]``.

Not thread-safe by itself: the engine calls it under its lock (its requests hold their state
in the request, so the lock is held per chunk, and another stream's step can run between two
chunks of this one).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import attrs
import torch

from mizuoto.errors import InvalidRequest
from mizuoto_voxcpm.cache_pool import CacheSlot
from mizuoto_voxcpm.generation import PromptSequence, Sampling
from mizuoto_voxcpm.minicpm4 import CacheFull
from mizuoto_voxcpm.model import VoxCPMModel
from mizuoto_voxcpm.patch_decoder import PatchBuffers


@attrs.define(eq=False)
class _Row:
    """One request in the batch: its state, and the patch sampled for it but not yet taken."""

    slot: CacheSlot
    buffers: PatchBuffers
    generator: torch.Generator
    sampling: Sampling
    sampled: int = 0
    ready: tuple[torch.Tensor, bool] | None = None
    error: BaseException | None = None
    ended: bool = False  # its last patch is sampled: it waits only to be taken

    @property
    def waiting(self) -> bool:
        """Whether the row needs a patch (its previous one was taken)."""
        return self.ready is None and self.error is None and not self.ended

    @property
    def key(self) -> tuple[int, float]:
        # rows batch with rows of the same sampler settings (the DiT's step count and the
        # guidance are one Python value per call, as alone)
        return self.sampling.steps, self.sampling.guidance


@attrs.define
class BatchStats:
    """What the batcher has done: steps, rows stepped, seconds; the last step's size."""

    steps: int = 0
    rows: int = 0
    seconds: float = 0.0
    last_size: int = 0
    last_seconds: float = 0.0

    def record(self, size: int, seconds: float) -> None:
        self.steps += 1
        self.rows += size
        self.seconds += seconds
        self.last_size, self.last_seconds = size, seconds


class PatchBatcher:
    """Up to ``max_batch`` open generations of ``model`` stepped together."""

    def __init__(self, model: VoxCPMModel, max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.model = model
        self.max_batch = max_batch
        self.stats = BatchStats()
        self._rows: list[_Row] = []

    @property
    def active(self) -> int:
        """Requests in the batch now."""
        return len(self._rows)

    @torch.inference_mode()
    def generate(self, sequence: PromptSequence, sampling: Sampling, *,
                 generator: torch.Generator, slot: CacheSlot
                 ) -> Iterator[tuple[torch.Tensor, bool]]:
        """What :func:`~mizuoto_voxcpm.generation.generate_patches` yields for this request,
        each patch sampled in a batched step with the other open requests'."""
        row = self._join(sequence, sampling, generator, slot)
        try:
            while True:
                if row.ready is None and row.error is None:
                    self._step(row)
                if row.error is not None:
                    raise row.error
                patch, last = row.ready
                row.ready = None
                yield patch, last
                if last:
                    return
        finally:
            # leaves at once: the engine frees its slot as this stream ends
            if row in self._rows:
                self._rows.remove(row)

    def _join(self, sequence: PromptSequence, sampling: Sampling,
              generator: torch.Generator, slot: CacheSlot) -> _Row:
        model = self.model
        device = model.device
        feats = sequence.feats.to(device).to(model.dtype)
        try:
            lm_hidden, residual_hidden = model.prefill(
                sequence.tokens.to(device), sequence.text_mask.to(device), feats,
                sequence.feat_mask.to(device), slot)
        except CacheFull as exc:
            raise InvalidRequest("text", str(exc), "shorten the text or the prompt audio") \
                from exc
        buffers = PatchBuffers.allocate(model)
        buffers.start(lm_hidden, residual_hidden, feats[:, -1])
        row = _Row(slot=slot, buffers=buffers, generator=generator, sampling=sampling)
        self._rows.append(row)
        return row

    def _step(self, caller: _Row) -> None:
        """One patch for ``caller`` and for every other row waiting for one (same sampler
        settings, up to ``max_batch``)."""
        rows = [caller] + [row for row in list(self._rows)
                           if row is not caller and row.waiting
                           and row.key == caller.key][:self.max_batch - 1]
        started = time.perf_counter()
        try:
            self._sample(rows)
        except BaseException as exc:
            # the others' generators and caches moved on with this step: none can go on
            for row in rows:
                row.error = exc
            raise
        self.stats.record(len(rows), time.perf_counter() - started)

    def _sample(self, rows: list[_Row]) -> None:
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
        going_on = []
        for index, row in enumerate(rows):
            patch = patches[index:index + 1]
            row.buffers.previous.copy_(patch)
            # the rules of generate_patches: no stop before min_len, the cap, a full cache
            stopped = row.sampled > row.sampling.min_len and stops[index]
            capped = row.sampled == row.sampling.max_patches - 1
            row.sampled += 1
            if not row.slot.has_room and not stopped:
                row.error = InvalidRequest("max_len", str(row.slot.cache_full()),
                                           "lower max_len or shorten the text")
                continue
            row.ready = (patch, stopped or capped)
            row.ended = stopped or capped
            if not (stopped or capped):
                going_on.append((row, patch))
        if not going_on:
            return
        # the patches as the sampler left them, a transposed view (one row's, alone, goes to
        # the encoder as such: a contiguous copy would take another matrix-product path)
        channels_first = patches.transpose(1, 2)
        if len(going_on) < len(rows):
            kept = torch.tensor([rows.index(row) for row, _ in going_on], device=model.device)
            channels_first = channels_first.index_select(0, kept)
        embeds = model.encode_patch_rows(channels_first.transpose(1, 2))
        lm_next, residual_next = model.advance_rows(embeds, [row.slot for row, _ in going_on])
        for index, (row, _) in enumerate(going_on):
            row.buffers.lm_hidden.copy_(lm_next[index:index + 1])
            row.buffers.residual_hidden.copy_(residual_next[index:index + 1])


def round_robin(streams: Iterable[Iterable]) -> list[list]:
    """Take one item of each open stream in turn, in this thread, until all have ended; each
    stream's items in order. How one thread serves several listeners: a batching engine
    steps the streams together (they join one by one as their first chunks are asked for)."""
    iterators = [iter(stream) for stream in streams]
    items: list[list] = [[] for _ in iterators]
    open_ = list(range(len(iterators)))
    while open_:
        for index in list(open_):
            item = next(iterators[index], _END)
            if item is _END:
                open_.remove(index)
            else:
                items[index].append(item)
    return items


_END = object()
