"""A toy Mizuoto engine: the smallest complete plugin, written from ``docs/plugins.md``.

The toy "speaks" by humming: each character of the text becomes a short tone whose pitch and
loudness come from the model's weights, mixed with seeded noise. A reference recording shifts
the pitch and the loudness towards the reference's. It is a template, not a voice.

A model directory holds ``config.json`` (sample rate, vocabulary size) and
``model.safetensors`` (a ``pitch`` and a ``level`` per vocabulary entry).

This module is the plugin (the ``mizuoto`` entry point): its hooks, and the params and options
classes. It imports no torch, so listing plugins stays fast; the engine lives in
``mizuoto_example.engine`` and is imported when a toy model is loaded.
"""

from __future__ import annotations

import attrs

from mizuoto.plugin import (
    Capability,
    CatalogEntry,
    ContractFixture,
    EngineRef,
    HubFile,
    hookimpl,
    number_in,
)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CAPABILITIES = frozenset({Capability.ZERO_SHOT, Capability.CLONE, Capability.STREAM,
                          Capability.VOICE_CACHE})


@attrs.frozen
class ToyParams:
    """Per-request settings, passed as ``SynthesisRequest(params={...})``: seconds per
    character in (0, 1], the longest output in (0, 600] seconds. ``number_in`` refuses NaN,
    infinities and values out of range with an InvalidRequest naming the param."""

    char_seconds: float = attrs.field(
        default=0.06, validator=number_in("params.char_seconds", 0.0, 1.0, low_open=True))
    max_seconds: float = attrs.field(
        default=30.0, validator=number_in("params.max_seconds", 0.0, 600.0, low_open=True))


@attrs.frozen
class ToyOptions:
    """``engines.toy.*`` options: ``--option engines.toy.breathiness=0.3``."""

    breathiness: float = attrs.field(default=0.1, validator=attrs.validators.and_(
        attrs.validators.ge(0.0), attrs.validators.le(1.0)))


def __getattr__(name: str):
    # ``from mizuoto_example import ToyEngine`` works, importing the engine (and torch) then.
    if name in ("ToyEngine", "write_tiny_model"):
        from mizuoto_example import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _write_tiny_model(directory) -> None:
    from mizuoto_example.engine import write_tiny_model

    write_tiny_model(directory)


@hookimpl
def register_engines(register):
    register(EngineRef("toy", "mizuoto_example.engine:ToyEngine", capabilities=CAPABILITIES,
                       options="mizuoto_example:ToyOptions",
                       description="hums one tone per character (a template, not a voice)"))


@hookimpl
def register_models(register):
    register(CatalogEntry(
        id="toy/tiny",
        engine="toy",
        files={CONFIG_FILE: HubFile("mizuoto-example/toy-tiny", CONFIG_FILE),
               WEIGHTS_FILE: HubFile("mizuoto-example/toy-tiny", WEIGHTS_FILE)},
        license="Apache-2.0",
        description="A toy model that hums (example plugin; not published on a hub)",
        variant="tiny",
    ))


@hookimpl
def register_trainers(register):
    # imported only when a trainer is needed (mizuoto train): listing plugins stays torch-free
    from mizuoto_example.training import ToyTrainer

    register(ToyTrainer)


def _write_lora(model_dir, lora_dir, seed) -> None:
    from mizuoto.plugin import write_fixture_adapter

    write_fixture_adapter("toy", model_dir, lora_dir, seed)


@hookimpl
def register_contract_fixtures(register):
    register(ContractFixture(
        engine="toy",
        name="tiny",
        make=_write_tiny_model,
        # max_seconds: room for the suite's 2045-character text (41 s at 0.02 s a character)
        request_params={"char_seconds": 0.02, "max_seconds": 60.0},
        stream_matches=True,
        needs_reference_text=False,
        # char_seconds is exact (rounded to whole samples at 16 kHz)
        seconds_per_character=(0.0199, 0.0201),
        description="random pitches and levels, 64 entries, 16 kHz",
        license="Apache-2.0",
        # a limit: it changes the audio only by refusing a text that needs more
        inert_params={"max_seconds"},
        make_lora=_write_lora,  # the suite's LoRA checks, on adapters from the declaration
    ))


__all__ = ["ToyEngine", "ToyOptions", "ToyParams", "write_tiny_model"]
