"""The step interface, for every engine that declares it
(:class:`~mizuoto.contracts.features.SupportsSteps`): the core's scheduler batches the open
requests of a model, so an engine's step must keep each row to itself.

- rows stepped together equal each request alone (float32: where the arithmetic is the same
  for every row count), and equal the engine's public ``synthesize``;
- a row's generator is its own: its audio does not change with its batch mates' seeds or
  texts;
- a cancelled row's state is released (``close_row``) and the scheduler holds nothing more.

Generated only for fixtures whose engine declares the interface (others are deselected).
"""

from __future__ import annotations

import threading

import attrs
import pytest
import torch

from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.engine import Engine
from mizuoto.contracts.features import SupportsSteps
from mizuoto.contracts.scheduler import Scheduler
from mizuoto.registry import get_engine
from mizuoto_contract.models import CONTRACT_OPTIONS, ContractModel
from mizuoto_contract.test_contract import LONG_TEXT, SEED, TEXT, _plain_request


def _declares_steps(fixture) -> bool:
    try:
        return issubclass(get_engine(fixture.engine), SupportsSteps)
    except Exception:  # an engine that cannot be imported fails the plain tests instead
        return False


steps = pytest.mark.mizuoto_requires(when=_declares_steps)

OTHER_TEXTS = ("A second request, of another length than the first.", "Third.")
#: Steps a request of the suite's texts may take before the test calls it endless.
MAX_STEPS = 100_000


def _open(engine, request):
    """A row for ``request``, as the base class opens it (its plan, its own generator)."""
    plan = engine.plan(request)
    return engine.open_row(plan.request, plan.params, engine.make_generator(plan.seed))


def _stepped_together(engine, requests) -> list[torch.Tensor]:
    """Open a row per request and step the open ones together until each has its last chunk:
    each request's audio."""
    rows = [_open(engine, request) for request in requests]
    pieces: list[list[torch.Tensor]] = [[] for _ in rows]
    open_rows = list(range(len(rows)))
    for _ in range(MAX_STEPS):
        if not open_rows:
            break
        made = engine.step_rows([rows[i] for i in open_rows])
        assert len(made) == len(open_rows), (
            f"step_rows returned {len(made)} results for {len(open_rows)} rows: return one "
            "sequence of chunks per row, in the rows' order")
        still = []
        for i, chunks in zip(open_rows, made, strict=True):
            pieces[i] += [chunk.audio.samples for chunk in chunks]
            if any(chunk.last for chunk in chunks):
                engine.close_row(rows[i])
            else:
                still.append(i)
        open_rows = still
    assert not open_rows, f"rows still open after {MAX_STEPS} steps: mark the last chunk"
    return [torch.cat(piece) for piece in pieces]


def _float32(model: ContractModel) -> Engine:
    """The fixture's engine in float32, where batched rows must equal alone: the loaded one, or
    the same directory loaded again with ``compute.dtype=float32`` (a bfloat16 model's GEMMs
    may differ at other row counts, so equality is asked of float32 only)."""
    if model.engine.info.dtype == "float32":
        return model.engine
    options = attrs.evolve(CONTRACT_OPTIONS, compute=attrs.evolve(CONTRACT_OPTIONS.compute,
                                                                  dtype="float32"))
    engine = get_engine(model.fixture.engine).load(model.directory, options=options,
                                                   model_id=f"contract/{model.fixture.id}")
    if engine.info.dtype != "float32":
        pytest.skip(f"{model.fixture.id} runs in {engine.info.dtype} even with "
                    "compute.dtype=float32: batched rows may differ from alone (GEMMs at other "
                    "row counts); checked in float32")
    return engine


@steps
def test_rows_stepped_together_equal_each_request_alone(contract_model: ContractModel) -> None:
    """Three requests stepped together: each row's audio ``torch.equal`` the request alone
    (where ``batch_exact``); a request alone stepped as the only row equals its ``stream``
    (and its ``synthesize``, unless the engine writes its own)."""
    engine = _float32(contract_model)
    requests = [_plain_request(contract_model, text=text, seed=SEED + i)
                for i, text in enumerate((TEXT, *OTHER_TEXTS))]
    exact = getattr(type(engine), "batch_exact", True)
    together = _stepped_together(engine, requests) if exact else [None] * len(requests)
    for request, audio in zip(requests, together, strict=True):
        alone = _stepped_together(engine, [request])[0]
        if exact:  # (batch_exact = False: only a row alone is compared, below)
            assert torch.equal(audio, alone), (
                f"{contract_model.fixture.id}: a row stepped with others differs from the "
                "request alone: keep each row's arithmetic to itself (no state shared between "
                "rows, no reduction across the batch)")
        if Capability.STREAM in engine.capabilities:
            streamed = torch.cat([chunk.audio.samples for chunk in engine.stream(request)])
            assert torch.equal(alone, streamed), (
                "the rows' audio differs from stream(): the base class runs the request "
                "through the same steps")
        if type(engine)._synthesize is Engine._synthesize:  # else the engine's own path
            assert torch.equal(alone, engine.synthesize(request).audio.samples), (
                "the rows' audio differs from synthesize(): the base class runs the request "
                "through the same steps")


@steps
def test_a_rows_generator_is_its_own(contract_model: ContractModel) -> None:
    """A row's audio does not change when its batch mate's seed and text do: every random draw
    of a row comes from the generator it was opened with."""
    engine = _float32(contract_model)
    mine = _plain_request(contract_model, text=TEXT, seed=SEED)
    first = _stepped_together(engine, [mine, _plain_request(contract_model,
                                                            text=OTHER_TEXTS[0], seed=1)])
    second = _stepped_together(engine, [mine, _plain_request(contract_model,
                                                             text=OTHER_TEXTS[1], seed=2)])
    assert torch.equal(first[0], second[0]), (
        f"{contract_model.fixture.id}: a row's audio changed with its batch mate's seed: draw "
        "only from the row's own generator (the one open_row is given)")


@steps
def test_a_cancelled_row_releases_its_state(contract_model: ContractModel,
                                            monkeypatch) -> None:
    """A long request cancelled after its first chunk: the scheduler closes its row (the
    engine's ``close_row`` gets its state) and holds no row afterwards."""
    engine = contract_model.engine
    closed = []
    close_row = engine.close_row
    monkeypatch.setattr(engine, "close_row", lambda row: (closed.append(row), close_row(row)))
    scheduler = Scheduler(engine, max_rows=2)
    plan = engine.plan(_plain_request(contract_model, text=LONG_TEXT, seed=SEED))
    row = scheduler.submit(plan.request, plan.params, engine.make_generator(plan.seed))
    state = row.state
    next(row)
    row.cancel()
    ended = threading.Event()
    for _ in range(MAX_STEPS):  # the scheduler ends it within a step; no clock involved
        if row.ended:
            ended.set()
            break
        ended.wait(0.01)
    assert row.ended, "the cancelled row was never closed"
    assert closed == [state], "close_row was not given the cancelled row's state"
    assert scheduler.open_rows == 0
