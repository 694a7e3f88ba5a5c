"""The VoxCPM plugin: engine, trainer, catalog entries, contract fixtures and the upstream
baseline (voxcpm, for ``mizuoto bench --against-upstream``).

Nothing here imports torch: the engine is registered by location and imported when a model is
loaded, so that ``mizuoto plugins`` and ``mizuoto models`` answer at once.
"""

from __future__ import annotations

from functools import partial

from mizuoto import Capability, ContractFixture, EngineRef, UpstreamBaseline, hookimpl

# few steps and patches: contract requests stay fast on random weights
_FAST = {"inference_timesteps": 2, "max_len": 4, "min_len": 1, "retry_badcase": False}
#: params the tiny fixtures' requests cannot show (the suite varies one at a time): the
#: request's steps win over inference_timesteps; the stop head never fires, so min_len and the
#: bad-case retry (4 patches never exceed its length ratio) do nothing; the suite's texts have
#: nothing to normalise and one sentence to split (chunk_tokens needs split_text); its plain
#: requests have no reference for reference_prefix; tiled decoding is bit-identical by design
_INERT = frozenset({"inference_timesteps", "min_len", "normalize", "retry_badcase",
                    "retry_badcase_max_times", "retry_badcase_ratio_threshold",
                    "reference_prefix", "split_text", "chunk_tokens", "tiled_decode"})


@hookimpl
def register_engines(register):
    # DESIGN: VoxCPM2 only; the other capabilities: every generation.
    register(EngineRef(
        "voxcpm", "mizuoto_voxcpm.engine:VoxCPMEngine",
        capabilities={Capability.ZERO_SHOT, Capability.CLONE, Capability.CONTINUATION,
                      Capability.STREAM, Capability.VOICE_CACHE, Capability.LONG_TEXT,
                      Capability.DESIGN},
        options="mizuoto_voxcpm.settings:VoxCPMOptions",
        description="VoxCPM-0.5B, VoxCPM1.5 and VoxCPM2: zero-shot, cloning, design, streaming"))


@hookimpl
def register_trainers(register):
    # called only when a trainer is needed (`mizuoto train`): importing it here keeps torch out
    from mizuoto_voxcpm.training import VoxCPMTrainer

    register(VoxCPMTrainer)


@hookimpl
def register_models(register):
    from mizuoto_voxcpm.catalog import ENTRIES

    for entry in ENTRIES:
        register(entry)


# the random real-size models never stop (stop="never"): a fixed number of patches, as the
# benchmarks have always measured, and no retry
_REALSIZE = {"max_len": 20, "retry_badcase": False}


# A tiny random model's stop head never fires either: upstream's defaults would run every
# request to its cap (text tokens x 6 + 10 patches) and then retry it twice as a bad case,
# some 20 s of noise for one sentence. Its directory carries a short cap and no retry as its
# own defaults (mizuoto-defaults.json; a request's params win), so that a demo speaks at once.
DEMO_DEFAULTS = {"max_len": 24, "retry_badcase": False}


def _write(directory, generation: str, size: str = "tiny") -> None:
    from mizuoto.contracts.model_defaults import write_model_defaults
    from mizuoto_voxcpm.fixtures import write_random_model

    write_random_model(directory, generation, size=size)
    if size == "tiny":
        write_model_defaults(directory, DEMO_DEFAULTS,
                             "random-init demo model: its stop head never fires, so every "
                             "request would run to upstream's cap and retry twice")


def _write_lora(model_dir, lora_dir, seed) -> None:
    """A LoRA for the contract suite: random from ``seed``, or with every up-projection
    (``lora_B``) zero for ``seed=None`` (an adapter that changes nothing)."""
    from pathlib import Path

    import torch
    from safetensors.torch import load_file

    from mizuoto.runtime.atomic import save_safetensors
    from mizuoto_voxcpm.fixtures import write_random_lora
    from mizuoto_voxcpm.lora import WEIGHTS_FILE

    write_random_lora(lora_dir, model_dir, seed=0 if seed is None else seed)
    if seed is None:
        path = Path(lora_dir) / WEIGHTS_FILE
        tensors = load_file(str(path))
        save_safetensors({name: torch.zeros_like(tensor) if name.endswith("lora_B") else tensor
                          for name, tensor in tensors.items()}, path)


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
            # the stop head never fires: every request runs to the cap, max_len=4 patches
            length_follows_text=False,
            license="Apache-2.0", non_commercial=False,  # VoxCPM's code and weights
            inert_params=_INERT,
            make_lora=_write_lora,
            description=f"random-init {generation} with a few tiny layers (audio is noise); "
                        f"its defaults: {DEMO_DEFAULTS['max_len']} patches, no retry",
        ))
        register(ContractFixture(
            engine="voxcpm",
            name=name.replace("tiny", "realsize"),
            make=partial(_write, generation=generation, size="realsize"),
            request_params=_REALSIZE,
            needs_reference_text=text_needed,
            realsize=True,
            description=f"random-init {generation} at its released sizes, never stops: "
                        f"{_REALSIZE['max_len']} patches",
        ))


@hookimpl
def register_upstream_baselines(register):
    register(UpstreamBaseline(
        engine="voxcpm", distribution="voxcpm",
        driver="mizuoto_voxcpm.benchmarking.upstream:VoxCPMUpstream",
        description="upstream voxcpm through voxcpm.core.VoxCPM (no denoiser, no compile)"))
