"""The patch decoder: one wait for the device per patch, the speculative LM step rewound, the
cache's device position kept with its host length, and what CUDA graphs refuse."""

from __future__ import annotations

import pytest
import torch

from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import write_random_model
from mizuoto_voxcpm.generation import Sampling, build_sequence, generate_patches
from mizuoto_voxcpm.kv_cache import KVCache
from mizuoto_voxcpm.patch_graphs import PatchGraphs


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        "v1": VoxCPMEngine.load(write_random_model(root / "v1", "voxcpm-0.5b")),
        "v2": VoxCPMEngine.load(write_random_model(root / "v2", "voxcpm2", dtype="float32")),
        "v1-stop": VoxCPMEngine.load(write_random_model(root / "v1s", "voxcpm-0.5b",
                                                        stop="always")),
        "v2-stop": VoxCPMEngine.load(write_random_model(root / "v2s", "voxcpm2",
                                                        stop="always")),
    }


def _sequence(engine, text="hello world"):
    config = engine.config
    return build_sequence(engine.tokenizer.encode(text), None, patch_size=config.patch_size,
                          feat_dim=config.feat_dim)


class _CountingItem:
    """Counts ``Tensor.item`` calls: each is the host waiting for the device."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = torch.Tensor.item

        def item(tensor):
            self.calls += 1
            return original(tensor)

        monkeypatch.setattr(torch.Tensor, "item", item)


@pytest.mark.parametrize("speculate", [True, False])
@pytest.mark.parametrize("name", ["v1", "v2"])
def test_one_wait_per_patch(engines, monkeypatch, name, speculate):
    engine = engines[name]
    counter = _CountingItem(monkeypatch)
    sequence = _sequence(engine)
    sampling = Sampling(steps=2, guidance=2.0, min_len=2, max_patches=7)
    patches = list(generate_patches(engine.model, sequence, sampling, seed=3,
                                    speculate=speculate))
    assert len(patches) == 7
    # patches 0..min_len cannot stop: their flag is not read at all; each later one once
    assert counter.calls == len(patches) - (sampling.min_len + 1)


@pytest.mark.parametrize("speculate", [True, False])
@pytest.mark.parametrize("name", ["v1", "v2"])
def test_no_step_is_left_after_the_last_patch(engines, name, speculate):
    engine = engines[f"{name}-stop"]  # a stop head that fires at every state
    model = engine.model
    sequence = _sequence(engine)
    sampling = Sampling(steps=2, guidance=2.0, min_len=1, max_patches=50)
    patches = list(generate_patches(model, sequence, sampling, seed=3, speculate=speculate))
    # the stop head fires at the first patch past min_len; the LMs stepped after every patch
    # but the last, as upstream steps them
    assert len(patches) == sampling.min_len + 2
    assert [last for _, last in patches] == [False] * (len(patches) - 1) + [True]
    prefill = sequence.tokens.size(1)
    for cache in (model.caches.lm, model.caches.residual):
        assert cache.length == prefill + len(patches) - 1
        assert int(cache.position) == cache.length


@pytest.mark.parametrize("name", ["v1", "v2", "v1-stop", "v2-stop"])
def test_speculating_gives_the_same_patches(engines, name):
    """The CPU steps the LMs after yielding a patch, other devices before reading its stop
    flag (then rewinding): the same samples, the same ends."""
    engine = engines[name]
    sequence = _sequence(engine)
    sampling = Sampling(steps=3, guidance=2.0, min_len=1, max_patches=6)
    runs = [list(generate_patches(engine.model, sequence, sampling, seed=11, speculate=flag))
            for flag in (False, True)]
    assert [last for _, last in runs[0]] == [last for _, last in runs[1]]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(*runs, strict=True))


def test_cache_position_follows_the_host_length(engines):
    cache = engines["v1"].model.caches.lm
    config = engines["v1"].model.base_lm.config
    scratch = KVCache(config, 8)
    assert int(scratch.position) == scratch.length == 0
    scratch.fill([(torch.zeros(1, config.num_key_value_heads, 3, config.head_dim),) * 2]
                 * config.num_hidden_layers)
    assert int(scratch.position) == scratch.length == 3
    scratch.next_position()
    scratch.position.add_(1)  # what a step does on the device
    scratch.rewind()
    assert int(scratch.position) == scratch.length == 3
    assert cache.attention == "exact"


def test_fast_attention_spans_the_filled_part_only(engines):
    config = engines["v1"].model.base_lm.config
    exact, fast = KVCache(config, 600), KVCache(config, 600, attention="fast")
    assert [exact.attend_span(p) for p in (0, 300, 599)] == [256, 512, 600]
    assert [fast.attend_span(p) for p in (0, 300, 599)] == [1, 301, 600]
    with pytest.raises(ValueError, match="attention"):
        KVCache(config, 8, attention="flash")


def test_graphs_need_a_cuda_model(engines):
    with pytest.raises(ValueError, match="CUDA"):
        PatchGraphs(engines["v1"].model)


@pytest.mark.parametrize(("settings", "key", "says"), [
    ({"attention": "fast"}, "compute.attention", "CUDA only"),
    ({"cuda_graphs": True}, "compute.cuda_graphs", "CUDA device"),
])
def test_gpu_options_are_refused_on_the_cpu(tmp_path, settings, key, says):
    import mizuoto
    from mizuoto.errors import InvalidOption

    directory = write_random_model(tmp_path / "m", "voxcpm-0.5b")
    options = mizuoto.Options.from_mapping({"compute": {"device": "cpu", **settings}})
    with pytest.raises(InvalidOption, match=says) as caught:
        VoxCPMEngine.load(directory, options=options)
    assert caught.value.key == key


def test_cpu_results_report_exact_attention_and_no_graphs(engines):
    from mizuoto import SynthesisRequest

    result = engines["v1"].synthesize(SynthesisRequest(
        "hi", seed=0, params={"inference_timesteps": 2, "max_len": 4}))
    assert result.applied.compute["attention"] == "exact"
    assert result.applied.compute["cuda_graphs"] is False


@pytest.mark.parametrize(("settings", "says"), [
    ({"cuda_graphs": True, "compile": True}, "compile"),
    ({"cuda_graphs": True, "attention": "fast"}, "attention=exact"),
])
def test_cuda_graphs_refuse_what_they_cannot_replay(settings, says):
    from mizuoto.errors import InvalidOption
    from mizuoto.options import ComputeOptions
    from mizuoto_voxcpm.engine import _check_gpu_options

    with pytest.raises(InvalidOption, match=says):
        _check_gpu_options(ComputeOptions(**settings), torch.device("cuda"))
    _check_gpu_options(ComputeOptions(cuda_graphs=True), torch.device("cuda"))  # alone: fine
