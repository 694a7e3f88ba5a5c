"""The VoxCPM plugin: engine, catalog entries and contract fixtures."""

from __future__ import annotations

from functools import partial

from mizuoto import ContractFixture, hookimpl

# few steps and patches: contract requests stay fast on random weights
_FAST = {"inference_timesteps": 2, "max_len": 4, "min_len": 1, "retry_badcase": False}


@hookimpl
def register_engines(register):
    from mizuoto_voxcpm.engine import VoxCPMEngine

    register(VoxCPMEngine)


@hookimpl
def register_models(register):
    from mizuoto_voxcpm.catalog import ENTRIES

    for entry in ENTRIES:
        register(entry)


def _write(directory, generation: str) -> None:
    from mizuoto_voxcpm.fixtures import write_random_model

    write_random_model(directory, generation)


@hookimpl
def register_contract_fixtures(register):
    for name, generation, text_needed in (("tiny-0.5b", "voxcpm-0.5b", True),
                                          ("tiny-1.5", "voxcpm-1.5", True),
                                          ("tiny-2", "voxcpm2", False)):
        register(ContractFixture(
            engine="voxcpm",
            name=name,
            make=partial(_write, generation=generation),
            request_params=dict(_FAST),
            steps=2,
            stream_matches=False,
            needs_reference_text=text_needed,
            description=f"random-init {generation} with a few tiny layers (audio is noise)",
        ))
