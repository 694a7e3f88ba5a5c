# Long on purpose: PatchBatcher is one scheduler (admission, prefill, stepping, decoding) over
# one set of rows under one condition variable; split, that state would pass between modules.
"""Continuous batching: the open streams of one model advance together, patch by patch.

On a CPU one VoxCPM patch is thousands of small matrix products whose cost is reading the
weights; ``b`` sequences read them once. A request joins the queue (:meth:`PatchBatcher.join`;
:meth:`PatchBatcher.arriving` while it takes its slot and builds its prompt); the next step
waits briefly for the requests arriving together and admits every queued request there is
room for, prefills first (one prefill serves every queued or recent request with the same
prompt, see :class:`PrefillMemo`; the distinct prompts admitted together are prefilled in one
packed pass, :meth:`~mizuoto_voxcpm.model.VoxCPMModel.prefill_packed`). Then it samples a patch
for each row that has room for one: the LM step for the row's previous patch (local encoder
and both LMs, deferred to here as on the CPU alone: a patch is handed on before the LMs step),
the DiT's guided Euler steps and the stop head, all as ``b``-row batches. Each row keeps its
own generator (its noise is drawn alone, in its order), buffers, cache slot, position and
decoder state, so rows join and leave at any patch boundary and a slot is free again as soon
as its row stops or its stream is closed (:meth:`PatchBatcher.leave`).

Two kinds of work, each done by one thread at a time, by whichever listener's thread needs it:
a *step* (above) and a *decode* (each row's sampled patches to audio, first-generation windows
of one length in one VAE call: :func:`~mizuoto_voxcpm.decoding.decode_segments`). They run
at once on two threads, so on a two-core CPU the VAE of one step's patches runs beside the
next step. When one kind has nothing to do (the first step after an admission, the decode of
first patches: the batch's first audio), the other runs on both kinds' intra-op threads
(``WIDE_ROWS``). A row may run ``AHEAD`` patches ahead of its listener. A VAE with noise blocks
draws from the row's generator between two patches: its patches are decoded in the step, row
by row, right after they are sampled, so each row's draws keep the order they have alone.

What can differ from a row's audio alone are the bits of the batched matrix products and VAE
convolutions (see docs/performance.md, "Batched VoxCPM generation"): the engine turns batching
on only when asked (``engines.voxcpm.max_batch``) and every result says
``applied.compute["batched"]``. A stream alone in the batcher runs the single-stream kernels
and is bit-identical to the unbatched stream.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import attrs
import torch

from mizuoto.errors import InvalidRequest
from mizuoto.runtime.threads import thread_intra_op_threads
from mizuoto_voxcpm.audiovae.blocks import NoiseBlock, noise_drawn_from
from mizuoto_voxcpm.cache_pool import CacheSlot
from mizuoto_voxcpm.decoding import StreamDecoder, decode_segments
from mizuoto_voxcpm.generation import PromptSequence, Sampling
from mizuoto_voxcpm.kv_cache import CacheFull
from mizuoto_voxcpm.model import Prefilled, VoxCPMModel
from mizuoto_voxcpm.patch_decoder import PatchBuffers

#: patches a row may have sampled and not yet handed to its listener
AHEAD = 2
#: recent prefills kept for requests with the same prompt
PREFILL_MEMO_SIZE = 8
#: a step that admits requests first waits until none has arrived for this long (seconds), at
#: most ``ARRIVAL_WAIT``: requests sent together (a server's listeners connecting at once)
#: are admitted in one step and get their first patches from one batched step
ARRIVAL_QUIET = 0.02
ARRIVAL_WAIT = 0.1
#: the most prompts packed into one prefill pass
PACKED_PREFILLS = 16
#: a step or a decode of at least this many rows, run while the other kind of work has none
#: to do, runs on twice the intra-op threads (those of both kinds): the first patches of
#: requests admitted together are the batch's critical path, and nothing else runs beside
#: them. A row alone is never widened: it stays bit-identical to the unbatched stream.
WIDE_ROWS = 2


@attrs.define(eq=False)
class _Row:
    """One request: its state, its patches sampled but not decoded, its segments decoded but
    not taken."""

    sequence: PromptSequence
    sampling: Sampling
    generator: torch.Generator
    slot: CacheSlot
    decoder: StreamDecoder
    buffers: PatchBuffers | None = None  # from its prefill on
    sampled: int = 0
    decoded: int = 0
    pending: torch.Tensor | None = None  # its last patch, not yet fed to the LMs
    undecoded: deque = attrs.Factory(deque)  # (patch, last)
    segments: deque = attrs.Factory(deque)  # (samples, last)
    error: BaseException | None = None
    ended: bool = False  # its last patch is sampled
    busy: bool = False  # in a step or a decode running now
    left: bool = False

    @property
    def needs_patch(self) -> bool:
        return (not self.ended and self.error is None and not self.left
                and len(self.undecoded) + len(self.segments) < AHEAD)

    @property
    def key(self) -> tuple[int, float]:
        # rows batch with rows of the same sampler settings (the DiT's step count and the
        # guidance are one Python value per call, as alone)
        return self.sampling.steps, self.sampling.guidance


@attrs.define
class BatchStats:
    """What the batcher has done: steps, rows stepped, seconds; the last step's size; the
    prefills run and those served from another request's (:class:`PrefillMemo`)."""

    steps: int = 0
    rows: int = 0
    seconds: float = 0.0
    last_size: int = 0
    last_seconds: float = 0.0
    prefills: int = 0
    prefills_shared: int = 0
    prefill_seconds: float = 0.0
    decodes: int = 0  # VAE calls
    decoded: int = 0  # patches decoded
    decode_seconds: float = 0.0
    wide_steps: int = 0  # steps run on both kinds' threads (WIDE_ROWS)
    wide_decodes: int = 0
    wide_prefills: int = 0

    def record(self, size: int, seconds: float) -> None:
        self.steps += 1
        self.rows += size
        self.seconds += seconds
        self.last_size, self.last_seconds = size, seconds


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


class PatchBatcher:
    """Up to ``max_batch`` open generations of ``model`` stepped together; ``vae`` decodes
    their patches."""

    def __init__(self, model: VoxCPMModel, vae, max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.model = model
        self.vae = vae
        self.max_batch = max_batch
        self.stats = BatchStats()
        self.memo = PrefillMemo()
        # a VAE with noise blocks draws from the row's generator: decoded in the step, in order
        self._decode_in_step = any(isinstance(m, NoiseBlock) for m in vae.modules())
        self._state = threading.Condition()
        self._rows: list[_Row] = []  # admitted
        self._queue: list[_Row] = []  # waiting to be admitted
        self._stepping = False
        self._decoding = False
        self._last_arrival = 0.0
        self._arriving = 0  # requests on their way to join (see arriving)
        self._decoding_first = False  # a decode of some row's first patch is running
        self._cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)  # the most intra-op threads widened work takes (WIDE_ROWS)

    @property
    def active(self) -> int:
        """Requests in the batch now (admitted, not yet ended and taken)."""
        return len(self._rows)

    @contextmanager
    def arriving(self) -> Iterator[None]:
        """A request on its way to :meth:`join` (taking its cache slot, building its prompt):
        a step that admits requests waits for it too, at most ``ARRIVAL_WAIT``."""
        with self._state:
            self._arriving += 1
            self._last_arrival = time.monotonic()
        try:
            yield
        finally:
            with self._state:
                self._arriving -= 1
                self._state.notify_all()

    def join(self, sequence: PromptSequence, sampling: Sampling, *,
             generator: torch.Generator, slot: CacheSlot, decoder: StreamDecoder) -> _Row:
        """Queue a request to be admitted; :meth:`segments` gives its audio, :meth:`leave`
        takes it out (always call it: it is what frees the row before its slot goes back)."""
        row = _Row(sequence=sequence, sampling=sampling, generator=generator, slot=slot,
                   decoder=decoder)
        with self._state:
            self._queue.append(row)
            self._last_arrival = time.monotonic()
            self._state.notify_all()
        return row

    def segments(self, row: _Row) -> Iterator[tuple[torch.Tensor, bool]]:
        """Each new patch's audio segment of ``row`` (its decoder's output), with whether it is
        the last: what :func:`~mizuoto_voxcpm.generation.generate_patches` and the decoder
        give alone, each patch sampled in a batched step with the other open requests'."""
        while True:
            segment, last = self._next(row)
            yield segment, last
            if last:
                return

    def leave(self, row: _Row) -> None:
        """Take ``row`` out as soon as no step or decode is using it (its slot can go back to
        the pool after this)."""
        with self._state:
            row.left = True
            while row.busy:
                self._state.wait()
            if row in self._queue:
                self._queue.remove(row)
            if row in self._rows:
                self._rows.remove(row)
            self._state.notify_all()

    # -- who does what --------------------------------------------------------------------

    def _next(self, row: _Row) -> tuple[torch.Tensor, bool]:
        """``row``'s next segment; meanwhile this thread steps or decodes for every row when
        that work is not being done by another thread."""
        while True:
            with self._state:
                if row.segments:
                    item = row.segments.popleft()
                    self._state.notify_all()  # the row has room for another patch
                    return item
                if row.error is not None:
                    raise row.error
                job = self._claim(own_patches=bool(row.undecoded))
                if job is None:
                    self._state.wait()
                    continue
            job()

    def _claim(self, *, own_patches: bool) -> Callable[[], None] | None:
        """The work this thread should do now (under ``_state``), marked as taken."""
        decodable = own_patches or any(r.undecoded for r in self._rows)
        if own_patches and not self._decoding:
            return self._run_decode()
        if not self._stepping and self._step_work():
            return self._run_step()
        if decodable and not self._decoding:
            return self._run_decode()
        return None

    def _step_work(self) -> bool:
        if self._decoding_first:
            # first audio before anything else: a step beside that decode would halve its
            # speed (two threads on a two-core CPU)
            return False
        admissible = self._queue and len(self._rows) < self.max_batch
        return bool(admissible) or any(r.needs_patch for r in self._rows)

    def _run_step(self) -> Callable[[], None]:
        self._stepping = True

        def job() -> None:
            rows: list[_Row] = []
            admitted: list[_Row] = []
            try:
                with self._state:
                    if self._queue:
                        self._await_arrivals()
                    admitted = self._queue[:self.max_batch - len(self._rows)]
                    del self._queue[:len(admitted)]
                    for row in admitted:
                        row.busy = True
                    # (as for the step below)
                    wide = not self._decoding and not any(r.undecoded for r in self._rows)
                self._admit(admitted, wide=wide)
                with self._state:
                    self._rows.extend(r for r in admitted if r.error is None and not r.left)
                    rows = [r for r in self._rows if r.needs_patch]
                    for r in rows:
                        r.busy = True
                    # no decode running or to run: none can start before this step's patches
                    wide = not self._decoding and not any(r.undecoded for r in self._rows)
                if rows:
                    self._step(rows, wide=wide)
            finally:
                with self._state:
                    for r in admitted + rows:
                        r.busy = False
                    self._stepping = False
                    self._state.notify_all()

        return job

    def _await_arrivals(self) -> None:
        """(Under ``_state``.) Wait for the requests arriving now to be queued too: until none
        is on its way and none has arrived for ``ARRIVAL_QUIET``, at most ``ARRIVAL_WAIT``."""
        deadline = time.monotonic() + ARRIVAL_WAIT
        while True:
            now = time.monotonic()
            quiet_at = self._last_arrival + ARRIVAL_QUIET
            if (now >= quiet_at and not self._arriving) or now >= deadline:
                return
            self._state.wait(min(quiet_at if not self._arriving else deadline, deadline) - now)

    def _run_decode(self) -> Callable[[], None]:
        self._decoding = True
        rows = [r for r in self._rows if r.undecoded]
        work = [(r, r.undecoded.popleft()) for r in rows]
        self._decoding_first = any(r.decoded == 0 for r in rows)
        # no step running or able to start before it ends (a first patch's decode holds
        # steps back)
        wide = self._decoding_first and not self._stepping
        for r in rows:
            r.busy = True

        def job() -> None:
            started = time.perf_counter()
            try:
                with self._widened(wide and len(work) >= WIDE_ROWS) as widened:
                    segments = decode_segments([r.decoder for r, _ in work],
                                               [patch for _, (patch, _) in work])
                self.stats.decodes += 1
                self.stats.wide_decodes += widened
                self.stats.decoded += len(work)
                self.stats.decode_seconds += time.perf_counter() - started
            except BaseException as exc:
                with self._state:
                    for r, _ in work:
                        r.error = exc
                segments = None
            with self._state:
                if segments is not None:
                    for (r, (_, last)), segment in zip(work, segments, strict=True):
                        r.segments.append((segment, last))
                        r.decoded += 1
                for r in rows:
                    r.busy = False
                self._decoding = self._decoding_first = False
                self._state.notify_all()

        return job

    @contextmanager
    def _widened(self, wide: bool) -> Iterator[bool]:
        """When ``wide``, this thread's work on twice its intra-op threads (those of the step
        or decode that is not running beside it); yields whether it was widened."""
        if not wide:
            yield False
            return
        threads = torch.get_num_threads()
        with thread_intra_op_threads(min(2 * threads, max(self._cores, threads))) as count:
            yield count > threads

    # -- the work -------------------------------------------------------------------------

    @torch.inference_mode()
    def _admit(self, rows: list[_Row], *, wide: bool = False) -> None:
        """Prefill ``rows`` into their slots: one prefill per distinct prompt (the memo's when
        it has it); the prompts not in the memo, when several, packed into one pass; when
        ``wide`` and several rows are admitted, on twice the intra-op threads (then not kept
        in the memo, whose prefills are each prompt's alone, exactly)."""
        model = self.model
        by_prompt: dict[bytes, list[_Row]] = {}
        for row in rows:
            by_prompt.setdefault(self.memo.key(row.sequence), []).append(row)
        prefills: dict[bytes, Prefilled] = {}
        missing = []
        for key, group in by_prompt.items():
            found = self.memo.get(key)
            if found is not None:
                prefills[key] = found
                self.stats.prefills_shared += len(group)
            elif group[0].sequence.tokens.size(1) > model.config.max_length:
                for row in group:  # refused by its slot below, kept out of the pass
                    self._start(row, None)
            else:
                missing.append(key)
                self.stats.prefills_shared += len(group) - 1
        started = time.perf_counter()
        try:
            with self._widened(wide and len(rows) >= WIDE_ROWS) as widened:
                if len(missing) == 1:
                    # alone: the single-prompt prefill, exactly; kept for later requests
                    sequence = by_prompt[missing[0]][0].sequence
                    prefills[missing[0]] = prefilled = model.prefill_states(
                        *_on_device(model, sequence))
                    if not widened:
                        self.memo.put(missing[0], prefilled)
                elif missing:
                    # not kept: a packed prefill's bits may differ from the prompt's alone
                    for start in range(0, len(missing), PACKED_PREFILLS):
                        keys = missing[start:start + PACKED_PREFILLS]
                        packed = model.prefill_packed(
                            [by_prompt[key][0].sequence for key in keys])
                        prefills.update(zip(keys, packed, strict=True))
            self.stats.wide_prefills += widened and bool(missing)
        except BaseException as exc:
            for key in missing:
                for row in by_prompt[key]:
                    row.error = exc
            return
        self.stats.prefills += len(missing)
        self.stats.prefill_seconds += time.perf_counter() - started
        for key, prefilled in prefills.items():
            for row in by_prompt[key]:
                self._start(row, prefilled)

    def _start(self, row: _Row, prefilled: Prefilled | None) -> None:
        """Fill ``row``'s slot from ``prefilled`` (None: the prompt is too long for it)."""
        try:
            if prefilled is None:
                raise CacheFull(f"the prompt is {row.sequence.tokens.size(1)} positions long "
                                f"but the model's context (max_length) holds "
                                f"{self.model.config.max_length}")
            prefilled.fill(row.slot)
        except CacheFull as exc:
            row.error = InvalidRequest("text", str(exc), "shorten the text or the prompt audio")
            return
        row.buffers = PatchBuffers.allocate(self.model)
        feats = row.sequence.feats.to(self.model.device).to(self.model.dtype)
        row.buffers.start(prefilled.lm_hidden, prefilled.residual_hidden, feats[:, -1])

    def _step(self, rows: list[_Row], *, wide: bool = False) -> None:
        """One patch for each of ``rows``, in one batch per sampler setting (``wide``: on
        twice the intra-op threads, see ``WIDE_ROWS``)."""
        started = time.perf_counter()
        groups: dict[tuple[int, float], list[_Row]] = {}
        for row in rows:
            groups.setdefault(row.key, []).append(row)
        for group in groups.values():
            with self._widened(wide and len(group) >= WIDE_ROWS) as widened:
                self._step_group(group)
            self.stats.wide_steps += widened
        self.stats.record(len(rows), time.perf_counter() - started)

    @torch.inference_mode()
    def _step_group(self, rows: list[_Row]) -> None:
        try:
            self._advance([r for r in rows if r.pending is not None])
            self._sample(rows)
        except BaseException as exc:
            # the rows' generators and caches moved on together: none can go on
            with self._state:
                for row in rows:
                    row.error = exc

    def _advance(self, rows: list[_Row]) -> None:
        """Feed each row's previous patch to both LMs (the LM step alone runs after the patch
        is handed on)."""
        if not rows:
            return
        model = self.model
        # the patches as the sampler leaves them, a transposed view (one row's, alone, goes to
        # the encoder as such: a contiguous copy would take another matrix-product path)
        channels_first = torch.cat([row.pending.transpose(1, 2) for row in rows])
        embeds = model.encode_patch_rows(channels_first.transpose(1, 2))
        lm_next, residual_next = model.advance_rows(embeds, [row.slot for row in rows])
        for index, row in enumerate(rows):
            row.buffers.lm_hidden.copy_(lm_next[index:index + 1])
            row.buffers.residual_hidden.copy_(residual_next[index:index + 1])
            row.pending = None

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
        for index, row in enumerate(rows):
            patch = patches[index:index + 1]
            row.buffers.previous.copy_(patch)
            # the rules of generate_patches: no stop before min_len, the cap, and room in the
            # cache for the LM step after this patch
            stopped = row.sampled > row.sampling.min_len and stops[index]
            capped = row.sampled == row.sampling.max_patches - 1
            row.sampled += 1
            last = stopped or capped
            if not row.slot.has_room and not stopped:
                with self._state:
                    row.error = InvalidRequest("max_len", str(row.slot.cache_full()),
                                               "lower max_len or shorten the text")
                continue
            row.pending = None if last else patch
            if self._decode_in_step:
                with noise_drawn_from(self.vae, row.generator):
                    segment = row.decoder.decode(patch)
                with self._state:
                    row.segments.append((segment, last))
                    row.ended = last
            else:
                with self._state:
                    row.undecoded.append((patch, last))
                    row.ended = last


def _on_device(model: VoxCPMModel, sequence: PromptSequence) -> tuple[torch.Tensor, ...]:
    """``prefill_states``' arguments: the sequence's tensors on the model's device."""
    device = model.device
    return (sequence.tokens.to(device), sequence.text_mask.to(device),
            sequence.feats.to(device).to(model.dtype), sequence.feat_mask.to(device))


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


def listen_together(streams: Iterable[Callable[[], Iterable]], *,
                    timeout: float | None = None) -> list[list]:
    """Consume each stream (``streams``: callables that open one) on its own thread, all
    started together, as a server's listeners connecting at once: a batching engine admits
    them in one step. Each stream's items in order; the first error of any is raised, and
    ``TimeoutError`` when a listener is still going after ``timeout`` seconds."""
    opens = list(streams)
    results: list = [None] * len(opens)
    errors: list[BaseException] = []
    start = threading.Barrier(len(opens))

    def listen(index: int) -> None:
        try:
            start.wait()
            results[index] = list(opens[index]())
        except BaseException as exc:  # raised in the caller's thread below
            errors.append(exc)

    threads = [threading.Thread(target=listen, args=(i,), daemon=True)
               for i in range(len(opens))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    if any(thread.is_alive() for thread in threads):
        raise TimeoutError(f"a listener was still streaming after {timeout} s")
    if errors:
        raise errors[0]
    return results


_END = object()
