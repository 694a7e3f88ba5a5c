"""The F5-TTS plugin: the engine, its trainer, its catalog entries, its contract fixtures and
its upstream baseline (f5-tts, for ``mizuoto bench --against-upstream``).

Nothing here imports torch: the engine is registered by location and imported when a model is
loaded, so that ``mizuoto plugins`` and ``mizuoto models`` answer at once.
"""

from __future__ import annotations

from functools import partial

from mizuoto import Capability, ContractFixture, EngineRef, UpstreamBaseline, hookimpl

# Few sampling steps keep contract requests fast on tiny models; the duration stays upstream's
# estimate, so outputs are as long as a real request's (a short fix_duration would cut them to
# a frame or two past the reference).
_FAST: dict = {}
_FAST_STEPS = 4


@hookimpl
def register_engines(register):
    register(EngineRef(
        "f5tts", "mizuoto_f5tts.engine:F5Engine",
        capabilities={Capability.ZERO_SHOT, Capability.CLONE, Capability.EDIT,
                      Capability.LONG_TEXT, Capability.VOICE_CACHE, Capability.STREAM},
        options="mizuoto_f5tts.settings:F5Options",
        description="F5-TTS v1 Base, Base and E2: flow matching + Vocos"))


@hookimpl
def register_trainers(register):
    # called only when a trainer is needed (`mizuoto train`): importing it here keeps torch out
    from mizuoto_f5tts.training import F5Trainer

    register(F5Trainer)


@hookimpl
def register_models(register):
    from mizuoto_f5tts.catalog import ENTRIES

    for entry in ENTRIES:
        register(entry)


#: what a random-init directory's model card says: its weights hold no trained data, so the
#: code's MIT license is theirs, not the released weights' CC-BY-NC-4.0
RANDOM_MODEL_CARD = """---
license: mit
tags: [mizuoto-random-init]
---
# Random-init {label} ({size})

Written by `mizuoto random-model`: random weights in F5-TTS's file layout. The audio is noise.
They hold no trained data, so the code's MIT license is theirs (the released F5-TTS weights
are CC-BY-NC-4.0).
"""


def _write_random(variant: str, size: str, directory) -> None:
    from pathlib import Path

    from mizuoto_f5tts.fixtures import write_random_model_dir

    write_random_model_dir(directory, variant, size=size, seed=0)
    (Path(directory) / "README.md").write_text(
        RANDOM_MODEL_CARD.format(label=variant, size=size), encoding="utf-8")


def _write_lora(model_dir, lora_dir, seed) -> None:
    """A random adapter (a zero one for ``seed=None``) on the declared default targets."""
    from mizuoto.adapters import write_fixture_adapter

    write_fixture_adapter("f5tts", model_dir, lora_dir, seed)


@hookimpl
def register_contract_fixtures(register):
    for variant, label in (("v1_base", "F5-TTS v1 Base"), ("base", "F5-TTS Base"),
                           ("e2_base", "E2-TTS Base")):
        register(ContractFixture(
            engine="f5tts", name=f"tiny-{variant.replace('_', '-')}",
            make=partial(_write_random, variant, "tiny"), request_params=_FAST,
            steps=_FAST_STEPS, needs_reference_text=True, stream_matches=True,
            license="MIT", non_commercial=False,
            # one text batch at the suite's lengths: nothing to cross-fade; EPSS has no
            # schedule for the fixture's 4 steps (upstream falls back to uniform steps)
            inert_params={"cross_fade_duration", "use_epss"},
            make_lora=_write_lora,
            description=f"{label} architecture at dim 64, random weights, tiny Vocos"))
        # the released sizes, for benchmarks (`mizuoto bench random:f5tts/realsize-v1-base`)
        register(ContractFixture(
            engine="f5tts", name=f"realsize-{variant.replace('_', '-')}",
            make=partial(_write_random, variant, "real"), needs_reference_text=True,
            realsize=True,
            description=f"{label} at its released size (dim 1024), random weights"))


@hookimpl
def register_upstream_baselines(register):
    register(UpstreamBaseline(
        engine="f5tts", distribution="f5-tts",
        driver="mizuoto_f5tts.benchmarking.upstream:F5Upstream",
        description="upstream f5-tts through load_model and infer_process"))
