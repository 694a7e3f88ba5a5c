"""Per-request state and continuous batching on tiny random VoxCPM models, through the core
scheduler (VoxCPM declares the step interface: mizuoto_voxcpm.patch_rows).

Per-request state: requests are rows with their own cache slots, so a stream survives requests
made between its chunks, and the rows' bound is a named error. Unbatched
(``engines.voxcpm.max_batch`` 1) the open rows take turns per patch, each exactly as alone.
Batched: a stream that steps alone is bit-identical to the unbatched stream (a group of one
runs the single-sequence kernels); streams that step together end where they end alone and
stay close to their audio alone, and results say they were batched. Bit-identity in a batch of
several is measured, not asserted (benchmarks/batch_exactness.py; docs/performance.md): on
this CPU some GEMM widths give a row other bits when more rows are present.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch

from mizuoto import ComputeOptions, Options, SynthesisRequest
from mizuoto.contracts.scheduler import scheduler_for
from mizuoto.errors import EngineBusy, InvalidOption, InvalidRequest
from mizuoto_voxcpm.decoding import V1_STREAM_WINDOW
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import write_random_model
from mizuoto_voxcpm.listeners import listen_together, round_robin

FAST = {"inference_timesteps": 2, "retry_badcase": False, "max_len": 6}
TEXTS = ("Hello there.", "The quick brown fox jumps over the lazy dog.", "One, two, three.",
         "Short one.")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"v1": write_random_model(root / "v1", "voxcpm-0.5b"),
            "v2": write_random_model(root / "v2", "voxcpm2", dtype="float32"),
            "v1.5": write_random_model(root / "v15", "voxcpm-1.5"),
            # a VAE with noise blocks draws from the stream's generator between two patches
            "noisy": write_random_model(root / "noisy", "voxcpm-0.5b",
                                        vae_overrides={"use_noise_block": True})}


def _load(path, dtype="float32", **engine_options) -> VoxCPMEngine:
    options = Options(compute=ComputeOptions(device="cpu", cpu_threads=1),
                      engines={"voxcpm": {"dtype": dtype, **engine_options}})
    return VoxCPMEngine.load(path, options=options)


def _requests(count: int) -> list[SynthesisRequest]:
    return [SynthesisRequest(TEXTS[i % len(TEXTS)], seed=10 + i, params=FAST)
            for i in range(count)]


def _alone(engine, request) -> list:
    return list(engine.stream(request))


def _round_robin(engine, requests) -> list[list]:
    """One chunk of each open stream in turn, in one thread: they join and step together."""
    return round_robin([engine.stream(r) for r in requests])


def _joined(chunks) -> torch.Tensor:
    return torch.cat([c.audio.samples for c in chunks])


def _open_rows(engine) -> int:
    return scheduler_for(engine).open_rows


def _snr(reference: torch.Tensor, other: torch.Tensor) -> float:
    noise = (reference.double() - other.double()).pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(
        reference.double().pow(2).sum().item() / noise)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["v1", "v2"])
def test_a_stream_alone_in_the_batcher_is_the_unbatched_stream(model_dirs, name, dtype):
    single = _load(model_dirs[name], dtype)
    batched = _load(model_dirs[name], dtype, max_batch=4)
    for request in _requests(2):
        expected = _alone(single, request)
        got = _alone(batched, request)  # nobody else open: every step has one row
        assert torch.equal(_joined(got), _joined(expected))
        # "batched" says whether the row shared a kernel call: alone, it never did
        assert got[-1].applied.compute["batched"] is False
        assert expected[-1].applied.compute["batched"] is False
    assert batched.batch_stats.steps > 0 and _open_rows(batched) == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["v1", "v2"])
def test_streams_stepped_together_end_where_they_end_alone(model_dirs, name, dtype):
    single = _load(model_dirs[name], dtype)
    batched = _load(model_dirs[name], dtype, max_batch=4)
    requests = _requests(4)
    together = _round_robin(batched, requests)
    stats = batched.batch_stats
    assert stats.rows > stats.steps, "no step had more than one row"
    assert stats.rows == sum(len(chunks) for chunks in together), "a patch nobody takes"
    for request, chunks in zip(requests, together, strict=True):
        alone = _alone(single, request)
        assert len(chunks) == len(alone)
        assert [c.is_last for c in chunks] == [c.is_last for c in alone]
        # close to alone; exact or not is measured elsewhere (docs/performance.md)
        assert _snr(_joined(alone), _joined(chunks)) > 40
        assert chunks[-1].applied.compute["batched"] is True
    assert _open_rows(batched) == 0
    assert batched._pool.in_use == 0  # every slot back as its stream ended


def test_a_stream_closed_before_its_first_chunk_leaves_no_row(model_dirs):
    engine = _load(model_dirs["v1"], cache_slots=1)
    engine.stream(_requests(1)[0]).close()  # its row was opened (planned), never stepped
    assert _open_rows(engine) == 0
    assert list(engine.stream(_requests(1)[0]))[-1].is_last  # the one row is free


def test_a_closed_stream_leaves_the_batch_and_frees_its_slot(model_dirs):
    engine = _load(model_dirs["v1"], max_batch=4, cache_slots=2)
    first, second = (iter(engine.stream(r)) for r in _requests(2))
    next(first)
    next(second)
    assert _open_rows(engine) == 2 and engine._pool.in_use == 2
    first.close()
    assert _open_rows(engine) == 1 and engine._pool.in_use == 1
    rest = list(second)
    assert rest[-1].is_last
    assert engine._pool.in_use == 0


def test_all_slots_held_is_a_named_error(model_dirs):
    engine = _load(model_dirs["v1"], cache_slots=1)
    stream = iter(engine.stream(_requests(1)[0]))
    next(stream)
    with pytest.raises(EngineBusy, match="engines.voxcpm.cache_slots"):
        engine.synthesize(_requests(2)[1])
    with pytest.raises(EngineBusy, match="open"):
        engine.set_lora(None)
    list(stream)
    assert engine.synthesize(_requests(2)[1]).audio.num_samples > 0  # the slot is back


@pytest.mark.parametrize("key", ["cache_slots", "max_batch"])
@pytest.mark.parametrize("value", [0, 257, 2.0, True, "4"])
def test_pool_and_batch_sizes_are_checked(model_dirs, key, value):
    with pytest.raises(InvalidOption, match=f"engines.voxcpm.{key}"):
        _load(model_dirs["v1"], **{key: value})


def _in_threads(engine, requests) -> list[list]:
    """Each request streamed on its own thread, all started together (a server's listeners)."""
    return listen_together([lambda r=r: engine.stream(r) for r in requests], timeout=120)


@pytest.mark.parametrize("name", ["v1", "v2", "v1.5", "noisy"])
def test_listeners_on_threads_step_together_and_end_where_they_end_alone(model_dirs, name):
    single = _load(model_dirs[name])
    batched = _load(model_dirs[name], max_batch=4)
    requests = _requests(4)
    together = _in_threads(batched, requests)
    stats = batched.batch_stats
    assert stats.rows > stats.steps, "no step had more than one row"
    assert stats.batched_rows > 0, "no patch was sampled in a batch"
    assert stats.rows == sum(len(chunks) for chunks in together)
    for request, chunks in zip(requests, together, strict=True):
        alone = _alone(single, request)
        assert [c.is_last for c in chunks] == [c.is_last for c in alone]
        assert [c.audio.num_samples for c in chunks] == [c.audio.num_samples for c in alone]
        assert _snr(_joined(alone), _joined(chunks)) > 40
    assert _open_rows(batched) == 0 and batched._pool.in_use == 0


def test_the_same_prompt_is_prefilled_once_and_exactly(model_dirs):
    """Requests with the same text share one prefill (the memo): exact, so a stream alone in
    the batcher after it is still the unbatched stream, bit for bit."""
    single = _load(model_dirs["v1"])
    batched = _load(model_dirs["v1"], max_batch=4)
    text = TEXTS[1]
    requests = [SynthesisRequest(text, seed=seed, params=FAST) for seed in (1, 2, 3)]
    _round_robin(batched, requests[:2])
    assert batched.batch_stats.prefills == 1
    assert batched.batch_stats.prefills_shared == 1
    got = _alone(batched, requests[2])  # its prefill comes from the memo
    assert batched.batch_stats.prefills == 1
    assert torch.equal(_joined(got), _joined(_alone(single, requests[2])))
    batched.set_lora(None)  # weights may change with a LoRA: the memo is emptied
    _alone(batched, requests[2])
    assert batched.batch_stats.prefills == 2


def test_a_listener_that_hangs_up_mid_stream_frees_its_slot_for_the_next(model_dirs):
    engine = _load(model_dirs["v1"], max_batch=2, cache_slots=2)
    single = _load(model_dirs["v1"])
    first, second, third = _requests(3)
    quitter = iter(engine.stream(first))
    next(quitter)
    stayer_chunks: list = []
    stayer = threading.Thread(target=lambda: stayer_chunks.extend(engine.stream(second)))
    stayer.start()
    quitter.close()  # the slot goes back at once; the other stream goes on
    stayer.join(timeout=120)
    assert stayer_chunks and stayer_chunks[-1].is_last
    late = list(engine.stream(third))  # takes the freed slot
    assert [c.is_last for c in late] == [c.is_last for c in _alone(single, third)]
    assert engine._pool.in_use == 0 and _open_rows(engine) == 0


@pytest.mark.parametrize("name", ["v1", "v1.5"])
def test_decoding_only_the_newest_patch_matches_the_whole_window(model_dirs, name):
    """The batcher decodes the first generation's streaming window (the last three patches)
    for its newest patch's samples only; they match the whole window's decode."""
    engine = _load(model_dirs[name])
    vae = engine.vae
    keep = engine.config.patch_size * vae.hop_length
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for patches in range(1, V1_STREAM_WINDOW + 1):
            for rows in (1, 3):
                latents = torch.randn(rows, vae.latent_dim, patches * engine.config.patch_size,
                                      generator=generator)
                whole = vae.decode(latents)[..., -keep:]
                tail = vae.decode_tail(latents, keep)
                assert tail.shape == whole.shape
                torch.testing.assert_close(tail, whole, rtol=0, atol=1e-6)


def test_distinct_prompts_admitted_together_are_prefilled_in_one_pass(model_dirs):
    single = _load(model_dirs["v2"])
    batched = _load(model_dirs["v2"], max_batch=4)
    requests = _requests(4)  # four texts: four prompts
    together = _round_robin(batched, requests)  # all four admitted at the first step
    stats = batched.batch_stats
    assert stats.prefills == 4 and stats.prefills_shared == 0
    assert stats.steps == max(len(chunks) for chunks in together)  # one step admitted all
    for request, chunks in zip(requests, together, strict=True):
        alone = _alone(single, request)
        assert [c.is_last for c in chunks] == [c.is_last for c in alone]
        assert _snr(_joined(alone), _joined(chunks)) > 40


@pytest.mark.parametrize("name", ["v1", "v2"])
def test_a_packed_prefill_is_each_prompt_prefilled_alone(model_dirs, name):
    """Prompts packed along the positions attend within themselves, from position 0: each
    one's states and keys/values are its own prefill's (up to the products' rounding)."""
    engine = _load(model_dirs[name])
    sequences = [engine._sequence(engine._target_text(text, None, engine.parse_params({})),
                                  None) for text in TEXTS]
    model = engine.model
    with torch.inference_mode():
        alone = [model.prefill_states(s.tokens, s.text_mask, s.feats.to(model.dtype),
                                      s.feat_mask) for s in sequences]
        packed = model.prefill_packed(sequences)
    for one, other, sequence in zip(alone, packed, sequences, strict=True):
        torch.testing.assert_close(other.lm_hidden, one.lm_hidden, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(other.residual_hidden, one.residual_hidden, rtol=1e-4,
                                   atol=1e-5)
        for (k1, v1), (k2, v2) in zip(one.lm_pairs + one.residual_pairs,
                                      other.lm_pairs + other.residual_pairs, strict=True):
            assert k2.size(2) == sequence.tokens.size(1)
            torch.testing.assert_close(k2, k1, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(v2, v1, rtol=1e-4, atol=1e-5)


def test_batching_and_lora_are_declared_through_the_contract(model_dirs):
    from mizuoto.contracts.features import batching_engine, lora_engine

    assert batching_engine(VoxCPMEngine) is VoxCPMEngine
    assert VoxCPMEngine.batch_options({}, 8) == {"max_batch": 8, "cache_slots": 8}
    assert VoxCPMEngine.batch_options({"max_batch": 2}, 8) == {"max_batch": 2, "cache_slots": 4}
    alone = _load(model_dirs["v1"])
    batched = _load(model_dirs["v1"], **VoxCPMEngine.batch_options({}, 3))
    assert alone.max_batch == 1 and alone.batch_stats.steps == 0
    assert batched.max_batch == 3 and batched.max_rows == 4  # rows: the cache slots
    assert lora_engine(alone, "--lora") is alone


def test_unbatched_rows_take_turns_each_exactly_as_alone(model_dirs):
    """engines.voxcpm.max_batch 1: the open rows (streams and a whole utterance) take turns
    per patch, each by the single-sequence kernels from its own generator: bit for bit the
    request alone, whatever else is open."""
    engine = _load(model_dirs["v1"])
    single = _load(model_dirs["v1"])
    requests = _requests(4)
    stream = iter(engine.stream(requests[0]))
    first = next(stream)
    whole = engine.synthesize(requests[1])  # its row steps beside the open stream's
    together = _round_robin(engine, requests[2:])
    rest = list(stream)
    assert torch.equal(whole.audio.samples, single.synthesize(requests[1]).audio.samples)
    assert torch.equal(_joined([first, *rest]), _joined(_alone(single, requests[0])))
    for request, chunks in zip(requests[2:], together, strict=True):
        assert torch.equal(_joined(chunks), _joined(_alone(single, request)))
        assert chunks[-1].applied.compute["batched"] is False
    assert whole.applied.compute["batched"] is False
    assert engine.batch_stats.batched_rows == 0
    assert _open_rows(engine) == 0 and engine._pool.in_use == 0


def test_a_row_cancelled_during_a_step_stops_after_it_and_the_others_go_on(model_dirs):
    """A stream cancelled (as a server cancels it when its client leaves) while a step runs:
    that step is its last, its slot goes back, and the other stream ends as it would alone."""
    engine = _load(model_dirs["v1"])
    single = _load(model_dirs["v1"])
    quitting, staying = _requests(2)
    quitter, stayer = engine.stream(quitting), engine.stream(staying)
    chunks = [next(stayer)]  # both rows admitted and stepped once
    step_rows, sizes = engine.step_rows, []

    def cancelling(rows):
        made = step_rows(rows)
        if not sizes:
            quitter.cancel()  # from "another thread": the step is running
        sizes.append(len(rows))
        return made

    engine.step_rows = cancelling
    chunks += list(stayer)
    assert sizes[0] == 2 and set(sizes[1:]) == {1}, "the cancelled row was stepped again"
    assert quitter.cancelled and list(quitter) == []
    assert _open_rows(engine) == 0 and engine._pool.in_use == 0
    assert torch.equal(_joined(chunks), _joined(_alone(single, staying)))


def test_a_rows_own_failure_ends_it_alone(model_dirs):
    """A row whose context fills (max_len past the cache) ends with its named error; the row
    stepped with it goes on."""
    engine = _load(model_dirs["v1"], max_batch=2)
    single = _load(model_dirs["v1"])
    context = engine.config.max_length
    # no stop before the context's end, and a cap past it
    full = SynthesisRequest(TEXTS[1], seed=1, params={
        **FAST, "max_len": context, "min_len": context, "retry_badcase_ratio_threshold": 100})
    fine = _requests(1)[0]
    failing, going = engine.stream(full), engine.stream(fine)
    with pytest.raises(InvalidRequest, match="max_len"):
        list(failing)  # each step steps both rows (the other's chunks wait for it)
    chunks = list(going)
    assert [c.is_last for c in chunks] == [c.is_last for c in _alone(single, fine)]
    assert _open_rows(engine) == 0 and engine._pool.in_use == 0
