"""A toy plugin that declares what the example's toy does not: batching, LoRA adapters, a
choice param and its languages. The suite's self-tests (``test_suite_features.py``) break it
one way at a time and check that the suite names each breakage.

The engine (``toy_features.engine``) is the example's hummer with: ``params.timbre`` (``sine``
or ``soft``, a clipped hum), ``engines.feature-toy.max_batch`` (requests arriving within
``ADMISSION_SECONDS`` of each other form a batch, each row drawing from its own generator),
and LoRA directories holding ``lora.safetensors`` (``level_delta``: one value per vocabulary
entry, added to the model's levels).
"""

from __future__ import annotations

from typing import Literal

import attrs

from mizuoto.plugin import ContractFixture, EngineRef, hookimpl, integer_in, number_in
from mizuoto.validation.ranges import one_of
from mizuoto_example import CAPABILITIES

ENGINE = "feature-toy"
LANGUAGES = ("en", "ru")


@attrs.frozen
class FeatureParams:
    char_seconds: float = attrs.field(
        default=0.06, validator=number_in("params.char_seconds", 0.0, 1.0, low_open=True))
    max_seconds: float = attrs.field(
        default=30.0, validator=number_in("params.max_seconds", 0.0, 600.0, low_open=True))
    timbre: Literal["sine", "soft"] = attrs.field(
        default="sine", validator=one_of(("sine", "soft"), "params.timbre"))


@attrs.frozen
class FeatureOptions:
    breathiness: float = attrs.field(default=0.1, validator=number_in(
        "engines.feature-toy.breathiness", 0.0, 1.0))
    max_batch: int = attrs.field(default=1, validator=integer_in(
        "engines.feature-toy.max_batch", 1, 16))


def _write(directory) -> None:
    from mizuoto_example.engine import write_tiny_model

    write_tiny_model(directory)


def write_lora(model_dir, lora_dir, seed) -> None:
    from toy_features.engine import write_lora as write

    write(model_dir, lora_dir, seed)


@hookimpl
def register_engines(register):
    register(EngineRef(ENGINE, "toy_features.engine:FeatureToy", capabilities=CAPABILITIES,
                       options="toy_features:FeatureOptions",
                       description="hums, in batches, with LoRA adapters"))


@hookimpl
def register_contract_fixtures(register):
    register(ContractFixture(
        engine=ENGINE, name="tiny", make=_write, request_params={"char_seconds": 0.02},
        stream_matches=True, needs_reference_text=False, license="Apache-2.0",
        inert_params={"max_seconds"}, make_lora=write_lora,
        description="the example's tiny toy model, 64 entries, 16 kHz"))
