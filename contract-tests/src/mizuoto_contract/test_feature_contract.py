"""The optional features an engine declares by subclassing (``mizuoto.contracts.features``):
batched rows that do not depend on their batch mates, LoRA adapters that change the audio and
leave nothing behind.

Each check runs on a second engine loaded from the fixture's directory (batching is chosen at
load; an adapter changes the engine), never on the suite's shared one.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import torch

from mizuoto import Capability
from mizuoto.contracts.features import SupportsBatching, SupportsLoRA
from mizuoto.errors import MizuotoError
from mizuoto.registry import get_engine
from mizuoto_contract.compare import assert_same
from mizuoto_contract.models import CONTRACT_OPTIONS, ContractModel
from mizuoto_contract.test_contract import (
    EDITED_TEXT,
    SEED,
    _in_threads,
    _joined,
    _plain_request,
)
from mizuoto_contract.versions import require as _require

requires = pytest.mark.mizuoto_requires
# new with round 5's suite: a plugin written for API 1.0 that misses one gets a deprecation
pytestmark = pytest.mark.since_api("1.1")

#: rows in the suite's batches
BATCH = 3


def _declares(feature: type):
    def declares(fixture) -> bool:
        try:
            return issubclass(get_engine(fixture.engine), feature)
        except Exception:  # an engine that does not import: its plain tests say why
            return False
    return declares


def _fresh(model: ContractModel, engines: dict | None = None):
    """The fixture's model loaded again (``engines``: its ``engines.<name>`` section)."""
    options = CONTRACT_OPTIONS if not engines else attrs.evolve(CONTRACT_OPTIONS,
                                                                 engines=engines)
    return get_engine(model.fixture.engine).load(model.directory, options=options,
                                                 model_id=f"contract/{model.fixture.id}")


# -- batching ---------------------------------------------------------------------------------

def _speak(engine, request):
    """The audio and ``applied`` of ``request``: streamed where the engine streams (a batcher
    steps streams), else synthesized."""
    if Capability.STREAM in engine.capabilities:
        chunks = list(engine.stream(request))
        return _joined(chunks), chunks[-1].applied
    result = engine.synthesize(request)
    return result.audio.samples, result.applied


def _together(engine, requests) -> list:
    """``requests`` sent at once from their own threads (a server's lanes), in order."""
    return _in_threads([lambda r=r: _speak(engine, r) for r in requests],
                       f"{len(requests)} concurrent requests on a batching engine")


@requires(when=_declares(SupportsBatching))
def test_batched_rows_do_not_depend_on_their_batch_mates(contract_model: ContractModel
                                                         ) -> None:
    """Loaded with ``batch_options({}, 3)``, three requests at once: row 0 is the same with
    mates of other seeds, and (where ``batch_exact``, the default) each row equals its request
    alone and row 0 is the same in a batch of two."""
    cls = type(contract_model.engine)
    section = cls.batch_options({}, BATCH)
    engine = _fresh(contract_model, {cls.name: section})
    assert engine.max_batch >= 2, (
        f"batch_options({{}}, {BATCH}) gave {section}, which loads a model with max_batch "
        f"{engine.max_batch}. Likely cause: batch_options does not set what the engine reads "
        f"at load; return the section with the engine's batch size in it")
    row = _plain_request(contract_model, seed=SEED)
    mates = [_plain_request(contract_model, seed=SEED + 1, text=EDITED_TEXT),
             _plain_request(contract_model, seed=SEED + 2)]
    other_mates = [attrs.evolve(request, seed=request.seed + 100) for request in mates]
    batch = _together(engine, [row, *mates])
    again = _together(engine, [row, *other_mates])
    assert_same(again[0][0], batch[0][0],
                "a batched row with mates of seeds 1235, 1236 and with mates of 1335, 1336",
                "the rows of a batch draw from one generator (or one noise tensor for the "
                "batch); give each row its own generator, seeded with its request's seed")
    if not getattr(cls, "batch_exact", True):
        return
    for index, request in enumerate([row, *mates]):
        alone = _speak(engine, request)[0]
        assert_same(batch[index][0], alone, f"row {index} of a batch of {BATCH} and alone",
                    "the row depends on its batch mates (a generator or noise shared by the "
                    "batch, padding that reaches the row's samples); keep every row's draws "
                    "and values its own, or declare batch_exact = False if only the kernels' "
                    "rounding differs")
    pair = _together(engine, [row, mates[0]])
    assert_same(pair[0][0], batch[0][0], f"row 0 in a batch of 2 and of {BATCH}",
                "the row depends on how many rows the batch holds; keep its values its own")


# -- LoRA -------------------------------------------------------------------------------------

def _audio(engine, model: ContractModel) -> torch.Tensor:
    return engine.synthesize(_plain_request(model, seed=SEED)).audio.samples


@requires(when=_declares(SupportsLoRA))
def test_a_lora_changes_the_audio_and_leaves_nothing_behind(contract_model: ContractModel,
                                                            tmp_path: Path) -> None:
    """No LoRA is applied after load; an adapter (``ContractFixture.make_lora``) changes the
    audio, a zero adapter does not; swapping to another adapter gives what that adapter gives
    on a clean model, and removing it (``set_lora(None)``) gives the base audio back; a
    directory without an adapter is refused with a MizuotoError, and the engine speaks as
    before. Without ``make_lora`` only the first and the removal are checked."""
    fixture = contract_model.fixture
    engine = _fresh(contract_model)
    assert engine.lora is None, (
        f"a model loaded from a base directory reports lora={engine.lora!r}. Likely cause: "
        f"lora is not None by default; return None until set_lora applies one")
    base = _audio(engine, contract_model)
    if fixture.make_lora is None:
        engine.set_lora(None)
        assert_same(_audio(engine, contract_model), base, "set_lora(None) without a LoRA and "
                    "the base audio", "set_lora(None) changes the weights")
        return
    adapters = {}
    for name, seed in (("first", 1), ("second", 2), ("zero", None)):
        adapters[name] = tmp_path / f"lora-{name}"
        fixture.make_lora(contract_model.directory, adapters[name], seed)

    engine.set_lora(adapters["second"])
    second_clean = _audio(engine, contract_model)
    engine.set_lora(None)
    assert_same(_audio(engine, contract_model), base, "the audio after set_lora(None) and "
                "before any LoRA", "removing a LoRA leaves part of it applied (merged weights "
                "not restored, a wrapped layer left in place); restore the base weights")
    engine.set_lora(adapters["first"])
    assert engine.lora is not None, "set_lora(path) left engine.lora None: report what is applied"
    first = _audio(engine, contract_model)
    _require(not torch.equal(first, base), (
        f"a LoRA (ContractFixture.make_lora, seed 1) gave the base model's audio (seed "
        f"{SEED}). Likely cause: set_lora records the adapter but never applies its weights "
        f"(or they are applied to layers synthesis does not use); attach them to the layers "
        f"the adapter names"))
    engine.set_lora(adapters["second"])
    assert_same(_audio(engine, contract_model), second_clean,
                "a LoRA swapped in over another and the same LoRA on a clean model",
                "the swap keeps the previous adapter applied (added on top, or its layers left "
                "wrapped); remove the current adapter before applying the next")
    engine.set_lora(adapters["zero"])
    assert_same(_audio(engine, contract_model), base,
                "a zero LoRA (up-projection all zeros) and no LoRA",
                "applying an adapter changes more than its weights (a merge that rounds, a "
                "scale applied to the base layer, another adapter still applied)")
    # an adapter for another base cannot be made from tiny fixtures that share their layer
    # shapes (VoxCPM's do); what every engine can do is refuse a directory with no adapter
    empty = tmp_path / "not-a-lora"
    empty.mkdir()
    try:
        engine.set_lora(empty)
    except MizuotoError:
        pass
    else:
        pytest.fail("set_lora accepted an empty directory. Likely cause: set_lora does not "
                    "read the adapter's files before applying it; refuse a directory without "
                    "them (ModelFilesMissing) or one whose tensors do not fit the model "
                    "(CheckpointMismatch)", pytrace=False)
    assert_same(_audio(engine, contract_model), base,
                "the audio after a refused set_lora (over a zero adapter) and without a LoRA",
                "a refused adapter is left half applied, or the refusal dropped the previous "
                "one badly; check the adapter before changing any layer")
    engine.set_lora(None)
    assert engine.lora is None, "set_lora(None) left engine.lora set: report None"

