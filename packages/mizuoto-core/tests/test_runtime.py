"""Runtime helpers: devices, threads, weight-norm folding, checkpoints (compile: test_compile.py)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from torch.nn.utils import parametrize

from mizuoto.errors import CheckpointMismatch, InvalidOption, ModelFilesMissing
from mizuoto.options import ComputeOptions
from mizuoto.runtime.checkpoint import (
    check_state_dict,
    find_weights_file,
    load_into,
    load_state_dict_file,
    load_weights_into,
)
from mizuoto.runtime.device import describe, half_precision_or_float32, select_device, select_dtype
from mizuoto.runtime.seeds import keyed_generator
from mizuoto.runtime.threads import apply_cpu_threads, thread_intra_op_threads
from mizuoto.runtime.weight_norm import fold_weight_norm

# --- device and dtype ---------------------------------------------------------------------


def test_select_device():
    assert select_device(ComputeOptions(device="cpu")) == torch.device("cpu")
    auto = select_device(ComputeOptions())
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available() and torch.backends.mps.is_available():
        expected = "mps"
    assert auto.type == expected
    if not torch.cuda.is_available():
        with pytest.raises(InvalidOption, match="compute.device.*CUDA is not available"):
            select_device("cuda:0")


def test_select_dtype_uses_engine_policy():
    cpu = torch.device("cpu")
    assert select_dtype(ComputeOptions(), cpu) == torch.float32
    assert select_dtype("auto", cpu, auto=torch.bfloat16) == torch.bfloat16
    assert select_dtype("auto", cpu, auto=half_precision_or_float32) == torch.float32
    assert half_precision_or_float32(torch.device("cuda")) == torch.float16
    assert select_dtype(ComputeOptions(dtype="bfloat16"), cpu) == torch.bfloat16
    with pytest.raises(InvalidOption, match="float16 is not supported"):
        select_dtype("float16", cpu, supported=(torch.float32, torch.bfloat16))


def test_describe():
    assert describe("cpu") == f"cpu ({torch.get_num_threads()} threads)"
    assert describe(torch.device("mps")) == "mps"


# --- threads (the allocator and pinning: test_cpu_startup.py) ----------------------------


def test_apply_cpu_threads_sets_and_reports():
    before = torch.get_num_threads()
    try:
        assert apply_cpu_threads(ComputeOptions(cpu_threads=1)) == 1
        assert torch.get_num_threads() == 1
        assert apply_cpu_threads(ComputeOptions()) == 1  # None leaves it alone
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif("OpenMP" not in torch.__config__.parallel_info(),
                    reason="torch's intra-op threads are not OpenMP's in this build")
def test_thread_intra_op_threads_widens_this_thread_only():
    import threading

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    seen = {}

    def other(started: threading.Event, done: threading.Event) -> None:
        started.set()
        done.wait(10)
        seen["other"] = torch.get_num_threads()

    try:
        started, done = threading.Event(), threading.Event()
        thread = threading.Thread(target=other, args=(started, done))
        thread.start()
        started.wait(10)
        with thread_intra_op_threads(3) as count:
            seen["inside"] = (count, torch.get_num_threads())
            done.set()
            thread.join(10)
            # the arithmetic torch parallelises runs (and gives the same result here)
            x = torch.arange(1 << 16, dtype=torch.float32)
            assert torch.equal(x * 2, x + x)
        assert seen == {"inside": (3, 3), "other": 1}
        assert torch.get_num_threads() == 1  # put back
        with thread_intra_op_threads(1) as count:  # already so: nothing to do
            assert count == 1
    finally:
        torch.set_num_threads(before)


# --- weight norm --------------------------------------------------------------------------


def _randomise(module: nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))


@pytest.mark.parametrize(
    ("make", "dim"),
    [
        (lambda: nn.Conv1d(6, 8, 7), 0),
        (lambda: nn.ConvTranspose1d(8, 4, 16, stride=8), 0),
        (lambda: nn.Conv1d(6, 8, 3), 1),
        (lambda: nn.Linear(5, 9), 0),
        (lambda: nn.Conv1d(3, 4, 5), None),
    ],
)
def test_fold_equals_removing_weight_norm(make, dim):
    old = make()
    torch.nn.utils.weight_norm(old, dim=dim)
    _randomise(old, seed=1)
    new = make()
    torch.nn.utils.parametrizations.weight_norm(new, dim=dim)
    _randomise(new, seed=2)
    old_folded = fold_weight_norm(old.state_dict())
    new_folded = fold_weight_norm(new.state_dict())
    torch.nn.utils.remove_weight_norm(old)
    parametrize.remove_parametrizations(new, "weight", leave_parametrized=True)
    for module, folded in ((old, old_folded), (new, new_folded)):
        assert set(folded) == set(module.state_dict())
        for key, value in module.state_dict().items():
            assert torch.equal(folded[key], value), key


def test_fold_in_a_nested_model_keeps_other_keys():
    model = nn.Sequential(nn.Conv1d(2, 4, 3), nn.Sequential(nn.Linear(4, 4)), nn.LayerNorm(4))
    torch.nn.utils.parametrizations.weight_norm(model[0])
    torch.nn.utils.weight_norm(model[1][0])
    state = dict(model.state_dict())
    state["gate_g"] = torch.ones(3)  # ends in _g without a _v partner: kept
    folded = fold_weight_norm(state, device="cpu", dim=lambda key: 0)
    assert set(folded) == {"0.bias", "0.weight", "1.0.bias", "1.0.weight", "2.weight",
                           "2.bias", "gate_g"}
    assert folded["2.weight"] is state["2.weight"]
    del state["0.parametrizations.weight.original1"]
    with pytest.raises(KeyError, match="0.weight"):
        fold_weight_norm(state)


# --- checkpoints --------------------------------------------------------------------------


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))


def test_load_safetensors_and_pickles(tmp_path):
    state = {k: v.clone() for k, v in _model().state_dict().items()}
    save_file(state, tmp_path / "m.safetensors")
    torch.save(state, tmp_path / "m.pt")
    torch.save({"ema_model_state_dict": state, "step": 3}, tmp_path / "ema.pth")
    torch.save({"model": {"ema": state}}, tmp_path / "deep.bin")
    for name, key in (("m.safetensors", None), ("m.pt", None),
                      ("ema.pth", ("model_state_dict", "ema_model_state_dict")),
                      ("deep.bin", "model.ema")):
        loaded = load_state_dict_file(tmp_path / name, key)
        assert set(loaded) == set(state)
        assert all(torch.equal(loaded[k], state[k]) for k in state)
    with pytest.raises(CheckpointMismatch, match="select one with key="):
        load_state_dict_file(tmp_path / "ema.pth")
    with pytest.raises(CheckpointMismatch, match="has no 'state_dict'"):
        load_state_dict_file(tmp_path / "ema.pth", "state_dict")


def test_load_state_dict_file_errors(tmp_path):
    with pytest.raises(ModelFilesMissing, match="nope.safetensors"):
        load_state_dict_file(tmp_path / "nope.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(CheckpointMismatch, match="cannot read"):
        load_state_dict_file(tmp_path / "bad.safetensors")
    (tmp_path / "m.npz").write_bytes(b"x")
    with pytest.raises(CheckpointMismatch, match="unknown checkpoint type"):
        load_state_dict_file(tmp_path / "m.npz")


def test_pickles_are_loaded_weights_only(tmp_path):
    torch.save({"weight": torch.zeros(1), "f": _model}, tmp_path / "code.pt")
    with pytest.raises(CheckpointMismatch, match="refused for safety") as refused:
        load_state_dict_file(tmp_path / "code.pt")
    # never torch's own advice, the one thing not to do with a downloaded file
    assert "weights_only" not in str(refused.value)


def test_load_into_names_every_problem():
    model = _model()
    state = dict(_model().state_dict())
    loaded = load_into(model, state, "ok.safetensors")
    assert loaded is model
    assert torch.equal(model[0].weight, state["0.weight"])

    bad = dict(state)
    del bad["1.running_var"]
    bad["extra.weight"] = torch.zeros(2)
    bad["0.weight"] = torch.zeros(5, 3)
    before = model[0].bias.clone()
    bad["0.bias"] = torch.full((4,), 7.0)
    with pytest.raises(CheckpointMismatch) as error:
        load_into(model, bad, "model.safetensors")
    assert error.value.missing == ["1.running_var"]
    assert error.value.unexpected == ["extra.weight"]
    assert error.value.shapes == ["0.weight: checkpoint (5, 3), model (4, 3)"]
    assert "model.safetensors" in str(error.value)
    assert torch.equal(model[0].bias, before)  # nothing was loaded


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_load_weights_into_equals_load_into(tmp_path, suffix, dtype):
    torch.manual_seed(0)
    state = {k: torch.randn(v.shape) if v.is_floating_point() else v + 5
             for k, v in _model().state_dict().items()}
    path = tmp_path / f"m{suffix}"
    stored = {**state, "vae.weight": torch.zeros(9)}
    save_file(stored, path) if suffix == ".safetensors" else torch.save({"state_dict": stored}, path)
    whole, streamed = _model().to(dtype), _model().to(dtype)
    load_into(whole, state, path)
    assert load_weights_into(streamed, path, key=("state_dict", ""),
                             skip_prefixes=("vae.",)) is streamed
    for (name, a), b in zip(whole.state_dict().items(), streamed.state_dict().values(),
                            strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def test_load_weights_into_checks_before_copying(tmp_path):
    bad = dict(_model().state_dict())
    del bad["1.running_var"]
    bad["0.weight"] = torch.zeros(5, 3)
    bad["0.bias"] = torch.full((4,), 7.0)
    save_file(bad, tmp_path / "bad.safetensors")
    model = _model()
    before = model[0].bias.clone()
    with pytest.raises(CheckpointMismatch) as error:
        load_weights_into(model, tmp_path / "bad.safetensors")
    assert error.value.missing == ["1.running_var"]
    assert error.value.shapes == ["0.weight: checkpoint (5, 3), model (4, 3)"]
    assert torch.equal(model[0].bias, before)  # nothing was loaded
    (tmp_path / "damaged.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(CheckpointMismatch, match="cannot read"):
        load_weights_into(model, tmp_path / "damaged.safetensors")
    truncated = tmp_path / "truncated.safetensors"
    save_file(dict(_model().state_dict()), truncated)
    truncated.write_bytes(truncated.read_bytes()[:-8])
    with pytest.raises(CheckpointMismatch, match="do not fit"):
        load_weights_into(model, truncated)
    assert torch.equal(model[0].bias, before)
    with pytest.raises(ModelFilesMissing, match="nope.safetensors"):
        load_weights_into(model, tmp_path / "nope.safetensors")
    extra = {**_model().state_dict(), "extra.weight": torch.zeros(2)}
    save_file(extra, tmp_path / "extra.safetensors")
    with pytest.raises(CheckpointMismatch, match="extra.weight"):
        load_weights_into(model, tmp_path / "extra.safetensors")
    load_weights_into(model, tmp_path / "extra.safetensors", tolerate_unexpected=True)


def test_tolerated_unexpected_keys_are_dropped_with_a_warning(caplog):
    model = _model()
    state = dict(_model().state_dict()) | {"discriminator.weight": torch.zeros(2)}
    with caplog.at_level("WARNING"):
        load_into(model, state, "released.safetensors", tolerate_unexpected=True)
    assert "discriminator.weight" in caplog.text
    # tolerance is for extra tensors only: a missing key is still refused
    del state["0.bias"]
    with pytest.raises(CheckpointMismatch) as error:
        load_into(model, state, "released.safetensors", tolerate_unexpected=True)
    assert error.value.missing == ["0.bias"] and error.value.unexpected == []


def test_check_state_dict_optional_keys_and_detail():
    layout = {"a": (2,), "b": (3,)}
    assert check_state_dict(layout, {"a": torch.zeros(2)}, "f", optional=["b"]) == []
    with pytest.raises(CheckpointMismatch, match="built from tiny") as error:
        check_state_dict(layout, {"a": torch.zeros(3)}, "f", optional=["b"],
                         detail="built from tiny")
    assert error.value.shapes == ["a: checkpoint (3,), model (2,)"]


def test_nested_state_dict_or_the_file(tmp_path):
    torch.save({"state_dict": {"w": torch.ones(1)}}, tmp_path / "nested.bin")
    torch.save({"w": torch.zeros(1)}, tmp_path / "flat.bin")
    assert torch.equal(load_state_dict_file(tmp_path / "nested.bin", key=("state_dict", ""))["w"],
                       torch.ones(1))
    assert torch.equal(load_state_dict_file(tmp_path / "flat.bin", key=("state_dict", ""))["w"],
                       torch.zeros(1))


def test_find_weights_file_prefers_the_first_name(tmp_path):
    with pytest.raises(ModelFilesMissing, match="a.safetensors or b.bin"):
        find_weights_file(tmp_path, ("a.safetensors", "b.bin"))
    (tmp_path / "b.bin").write_bytes(b"")
    assert find_weights_file(tmp_path, ("a.safetensors", "b.bin")).name == "b.bin"
    (tmp_path / "a.safetensors").write_bytes(b"")
    assert find_weights_file(tmp_path, ("a.safetensors", "b.bin")).name == "a.safetensors"


def test_keyed_generator_depends_on_seed_and_key_only():
    def draw(seed, key):
        return torch.randn(4, generator=keyed_generator(seed, key))

    assert torch.equal(draw(1, "x.weight"), draw(1, "x.weight"))
    assert not torch.equal(draw(1, "x.weight"), draw(2, "x.weight"))
    assert not torch.equal(draw(1, "x.weight"), draw(1, "y.weight"))


def test_select_device_takes_the_engines_auto_rule():
    from mizuoto.runtime.device import preferred_device

    assert select_device("auto", auto=lambda: torch.device("cpu")).type == "cpu"
    assert preferred_device("cpu") == torch.device("cpu")
    # a config that names a device missing here falls back to the common rule
    if not torch.cuda.is_available():
        assert preferred_device("cuda") == select_device("auto")
    with pytest.raises(InvalidOption, match="compute.device"):
        select_device("tpu")


def test_weights_fingerprint_sees_files_and_context(tmp_path):
    from mizuoto.runtime.checkpoint import weights_fingerprint

    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"x" * 3_000_000)
    b.write_bytes(b"x" * 2_999_999 + b"y")  # differs only in the last MiB
    assert weights_fingerprint([a]) == weights_fingerprint([a])
    assert weights_fingerprint([a]) != weights_fingerprint([b])
    assert weights_fingerprint([a], context={"vocab": ["a"]}) != weights_fingerprint([a])


def test_materialize_empty_allocates_what_meta_described():
    import torch
    from torch import nn

    from mizuoto.runtime.checkpoint import materialize_empty

    with torch.device("meta"):
        module = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Embedding(5, 2))
    module[0].bias.requires_grad_(False)
    materialize_empty(module, "cpu", torch.bfloat16)
    state = module.state_dict()
    assert all(t.device.type == "cpu" for t in state.values())
    assert state["0.weight"].dtype == torch.bfloat16 and state["0.weight"].shape == (4, 3)
    assert state["1.num_batches_tracked"].dtype == torch.long  # integers keep their dtype
    assert module[0].weight.requires_grad and not module[0].bias.requires_grad
    assert isinstance(module[2].weight, nn.Parameter)
