"""FROZEN: a plugin written against the plugin API 1.1 as documented in round 5 (docs/api.md's
``mizuoto.plugin``, docs/plugins.md), as a third party would: not the bundled example, which
moves with the code.

Do not update it: it stands for plugins written against API 1.1, which must keep passing the
contract suite unchanged (``tests/test_frozen_plugin.py``). It imports only ``mizuoto.plugin``.
If the suite or the API changes so that it fails, that is a break of API 1.1 for every such
plugin: fix the change (or deprecate with a warning), not this copy.

The "chime" engine rings one decaying bell tone per character, its pitch from the model's
weights and the character, its brightness (overtones) a request param; a reference recording
moves the pitch towards the reference's. It implements ``_stream`` only (the base class joins
it for ``synthesize``), streams one word at a time, and builds voices. No torch here.
"""

from __future__ import annotations

import attrs

from mizuoto.plugin import (
    Capability,
    ContractFixture,
    EngineRef,
    hookimpl,
    number_in,
)

CAPABILITIES = frozenset({Capability.ZERO_SHOT, Capability.CLONE, Capability.STREAM,
                          Capability.VOICE_CACHE})


@attrs.frozen
class ChimeParams:
    """``params``: seconds per character in (0, 1], overtone level in [0, 1], the longest
    output in (0, 600] seconds."""

    char_seconds: float = attrs.field(
        default=0.05, validator=number_in("params.char_seconds", 0.0, 1.0, low_open=True))
    brightness: float = attrs.field(
        default=0.3, validator=number_in("params.brightness", 0.0, 1.0))
    max_seconds: float = attrs.field(
        default=60.0, validator=number_in("params.max_seconds", 0.0, 600.0, low_open=True))


def _write_tiny(directory) -> None:
    from toy_api_1_1.engine import write_tiny_model

    write_tiny_model(directory)


@hookimpl
def register_engines(register):
    register(EngineRef("chime", "toy_api_1_1.engine:ChimeEngine", capabilities=CAPABILITIES,
                       description="rings one bell tone per character"))


@hookimpl
def register_contract_fixtures(register):
    register(ContractFixture(
        engine="chime",
        name="tiny",
        make=_write_tiny,
        # room for the suite's longest text at 0.01 s a character
        request_params={"char_seconds": 0.01, "max_seconds": 120.0},
        stream_matches=True,
        needs_reference_text=False,
        seconds_per_character=(0.0099, 0.0101),
        description="random pitches, 32 entries, 8 kHz",
        license="MIT",
        inert_params={"max_seconds"},
    ))
