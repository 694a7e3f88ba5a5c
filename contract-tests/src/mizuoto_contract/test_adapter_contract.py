"""LoRA checks for an engine that declares its targets (`mizuoto.adapters.AdapterHost` with
``lora_targets``): the suite writes the adapters itself, from the declaration, in the
engine's format (no fixture hook needed), and checks on a second engine loaded from the
fixture's directory that

- an adapter with random ``lora_B`` changes the audio, a zero one (``lora_B`` all zeros) gives
  the base audio exactly;
- an adapter swapped in over another gives what it gives on a clean engine, and removing it
  gives the base audio back;
- an adapter for another base model (its ``base_model_fingerprint``), one of another rank and
  one holding NaN are refused before anything is applied: the audio stays as it was.

An engine with a format of its own (e.g. VoxCPM's) overrides ``read_adapter``; these checks
write peft's format only, so they run where the engine reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mizuoto.adapters import PEFT_FORMAT, AdapterHost, write_random_adapter
from mizuoto.errors import MizuotoError
from mizuoto.registry import get_engine
from mizuoto_contract.compare import assert_same
from mizuoto_contract.models import CONTRACT_OPTIONS, ContractModel
from mizuoto_contract.test_contract import SEED, _plain_request

requires = pytest.mark.mizuoto_requires


def _declares_targets(fixture) -> bool:
    engine = get_engine(fixture.engine)
    return (issubclass(engine, AdapterHost) and getattr(engine, "lora_targets", None) is not None
            and engine.lora_targets.format == PEFT_FORMAT
            and engine.read_adapter is AdapterHost.read_adapter)


def _write(engine: AdapterHost, directory: Path, seed: int | None, *, r: int = 2,
           fingerprint: str | None = None) -> Path:
    return write_random_adapter(engine, directory, seed, r=r, base_fingerprint=fingerprint)


@requires(when=_declares_targets)
def test_declared_lora_targets_load_swap_and_refuse_by_name(contract_model: ContractModel,
                                                            tmp_path: Path) -> None:
    engine = get_engine(contract_model.fixture.engine).load(contract_model.directory,
                                                            options=CONTRACT_OPTIONS)

    def audio() -> torch.Tensor:
        return engine.synthesize(_plain_request(contract_model, seed=SEED)).audio.samples

    assert engine.lora is None, "an engine loaded from a base directory reports an adapter"
    base = audio()
    first = _write(engine, tmp_path / "first", 1)
    second = _write(engine, tmp_path / "second", 2)
    zero = _write(engine, tmp_path / "zero", None)
    engine.set_lora(second)
    second_clean = audio()
    engine.set_lora(zero)
    assert_same(audio(), base, "a zero adapter (lora_B all zeros) and no adapter",
                "applying an adapter changes more than its update (a merge that rounds, a "
                "previous adapter left applied)")
    engine.set_lora(first)
    assert not torch.equal(audio(), base), (
        "an adapter with random weights on the declared default targets gave the base audio. "
        "Likely cause: lora_root() is not the module synthesis runs, or lora_targets.default "
        "names layers synthesis does not use")
    engine.set_lora(second)
    assert_same(audio(), second_clean, "an adapter swapped in over another and the same on a "
                "clean engine", "the swap keeps the previous adapter's layers or weights")
    refused = {"another base model": _write(engine, tmp_path / "other", 1,
                                            fingerprint="0" * 64),
               "another rank": _write(engine, tmp_path / "rank", 1, r=3)}
    config = json.loads((refused["another rank"] / PEFT_FORMAT.config_file).read_text())
    config["r"] = 2  # tensors of rank 3 under a config of rank 2
    (refused["another rank"] / PEFT_FORMAT.config_file).write_text(json.dumps(config))
    nan = _write(engine, tmp_path / "nan", 1)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(nan / PEFT_FORMAT.weights_file))
    key = sorted(tensors)[0]
    tensors[key][0, 0] = float("nan")
    save_file(tensors, str(nan / PEFT_FORMAT.weights_file))
    refused["NaN weights"] = nan
    for what, path in refused.items():
        with pytest.raises(MizuotoError):
            engine.set_lora(path)
        assert_same(audio(), second_clean, f"the audio after an adapter with {what} was "
                    "refused", "a refused adapter was half applied; check it before changing "
                    "any layer")
    engine.set_lora(None)
    assert engine.lora is None
    assert_same(audio(), base, "the audio after set_lora(None) and before any adapter",
                "removing an adapter leaves part of it applied")
