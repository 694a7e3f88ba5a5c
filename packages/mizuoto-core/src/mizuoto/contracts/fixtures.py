"""Contract fixtures: small random-init model directories an engine can write for tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs


@attrs.frozen
class ContractFixture:
    """A recipe for a small model directory in the engine's real file layout.

    ``make(directory)`` writes the files (random weights: the audio is noise, not speech).
    ``request_params`` are settings that keep contract requests fast (e.g. few steps, a length
    cap). ``stream_matches`` says whether concatenated stream chunks equal the non-streamed audio.
    ``needs_reference_text`` says whether cloning requires the reference transcript.
    ``may_exceed_full_scale`` lets the engine return samples beyond [-1, 1] (where its upstream
    does not normalise); the suite otherwise fails audio that peaks over 1.0 or is clipped.
    ``random_init`` says the weights are random (the audio is noise, not speech); a fixture
    that writes a real, deterministic model (a rule-based engine) sets it to False.
    ``length_follows_text`` says whether a longer text gives longer audio with the fixture's
    request settings (``False`` for a random-init model whose length a learned stop decides,
    capped by ``request_params``: its audio is noise of arbitrary length); the suite then
    cannot check that audio grows with the text for it.
    ``seconds_per_character`` is the range of audio seconds per character of text the model
    gives with the fixture's settings, when the engine knows it (a duration rule); the suite
    then checks the duration, which catches audio made at one rate and labelled another.
    ``license`` and ``non_commercial`` are the fixture's model's license (an SPDX name, as
    ``ModelInfo.license``) and whether it forbids commercial use: the suite checks that the
    engine reports them and that a non-commercial model's results carry the notice.
    ``inert_params`` names request params that do not change the audio of the fixture's
    model (a limit it does not reach, a switch for another model kind): the suite checks that
    every other declared param does.
    ``make_lora(model_dir, lora_dir, seed)``, for an engine that declares ``SupportsLoRA``,
    writes a LoRA directory for the model in ``model_dir`` into ``lora_dir``: random from
    ``seed``, or, for ``seed=None``, a zero adapter (its up-projection all zeros) that leaves
    the audio unchanged. The suite loads adapters with it; without it, it checks only what
    needs no adapter (none applied after load, removal).
    ``realsize`` marks a recipe at the released architecture's sizes, for benchmarks
    (``mizuoto bench random:ID``) and ``mizuoto random-model``: the contract suite leaves it
    out (:func:`mizuoto.registry.contract_fixtures`), its requests take minutes.
    """

    engine: str
    name: str
    make: Callable[[Path], None]
    request_params: Mapping[str, Any] = attrs.field(factory=dict,
                                                    converter=lambda v: MappingProxyType(dict(v)))
    steps: int | None = None
    stream_matches: bool = False
    needs_reference_text: bool = True
    description: str = ""
    may_exceed_full_scale: bool = False
    random_init: bool = True
    length_follows_text: bool = True
    seconds_per_character: tuple[float, float] | None = None
    realsize: bool = False
    license: str | None = None
    non_commercial: bool = False
    inert_params: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    make_lora: Callable[[Path, Path, int | None], None] | None = None

    @property
    def id(self) -> str:
        return f"{self.engine}/{self.name}"


#: The file ``mizuoto random-model`` leaves in a random-init model's directory, so that what
#: serves it (the server's model card, the page's badge) can say its audio is noise.
RANDOM_INIT_FILE = "mizuoto-random-init.json"


def mark_random_init(directory: str | Path, fixture_id: str) -> Path:
    """Leave :data:`RANDOM_INIT_FILE` in ``directory``: its weights are random."""
    import json

    path = Path(directory) / RANDOM_INIT_FILE
    path.write_text(json.dumps({"fixture": fixture_id,
                                "why": "random weights: the audio is noise, not speech"}) + "\n",
                    encoding="utf-8")
    return path


def is_random_init(directory: str | Path) -> bool:
    """Whether ``directory`` (a model directory, or a catalog id: never) is marked random-init."""
    return (Path(directory) / RANDOM_INIT_FILE).is_file()
