"""Streaming latency on tiny random models: each chunk is yielded as soon as its patch is sampled
and decoded, and the last one still carries ``applied`` (no upstream needed)."""

from __future__ import annotations

import pytest

from mizuoto import SynthesisRequest
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import write_random_model

FAST = {"inference_timesteps": 2, "retry_badcase": False}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    models = {
        ("voxcpm-0.5b", "never"): write_random_model(root / "v1", "voxcpm-0.5b"),
        ("voxcpm2", "never"): write_random_model(root / "v2", "voxcpm2", dtype="float32"),
        ("voxcpm-0.5b", "always"): write_random_model(root / "v1-stop", "voxcpm-0.5b",
                                                      stop="always"),
        ("voxcpm2", "always"): write_random_model(root / "v2-stop", "voxcpm2", stop="always"),
    }
    return {key: VoxCPMEngine.load(path) for key, path in models.items()}


def _count_samples(monkeypatch, engine: VoxCPMEngine) -> list[int]:
    """Wrap the model's patch sampler; the returned list's length is the patches sampled."""
    calls: list[int] = []
    sample = engine.model.sample

    def counted(*args, **kwargs):
        calls.append(1)
        return sample(*args, **kwargs)

    monkeypatch.setattr(engine.model, "sample", counted)
    return calls


def _stream_counting(monkeypatch, engine, request) -> list[tuple[int, object]]:
    """Each chunk with the number of patches sampled when it was yielded."""
    calls = _count_samples(monkeypatch, engine)
    return [(len(calls), chunk) for chunk in engine.stream(request)]


@pytest.mark.parametrize("stop", ["never", "always"])
@pytest.mark.parametrize("generation", ["voxcpm-0.5b", "voxcpm2"])
def test_each_chunk_is_yielded_after_its_own_patch(monkeypatch, engines, generation, stop):
    engine = engines[generation, stop]
    request = SynthesisRequest("hello world", seed=3, params={**FAST, "max_len": 6})
    seen = _stream_counting(monkeypatch, engine, request)
    # the first chunk after exactly one sampled patch, chunk k after k + 1: nothing held back
    assert [sampled for sampled, _ in seen] == list(range(1, len(seen) + 1))
    chunks = [chunk for _, chunk in seen]
    # "always" stops as soon as min_len (2) allows: after patch index 3, i.e. four patches
    assert len(chunks) == (6 if stop == "never" else 4)
    assert [c.is_last for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert all(c.applied is None for c in chunks[:-1])
    applied = chunks[-1].applied
    assert applied is not None and applied.extra["patches"] == len(chunks)
    assert all(c.audio.num_samples > 0 for c in chunks)  # no empty chunk at the end


def test_split_text_marks_only_the_very_last_chunk(monkeypatch, engines):
    engine = engines["voxcpm2", "always"]
    request = SynthesisRequest("Hello there. How are you today?", seed=3,
                               params={**FAST, "max_len": 6, "split_text": True,
                                       "chunk_tokens": 4})
    seen = _stream_counting(monkeypatch, engine, request)
    chunks = [chunk for _, chunk in seen]
    assert [sampled for sampled, _ in seen] == list(range(1, len(seen) + 1))
    assert chunks[-1].applied.chunks == 2 and len(chunks) == 8  # two texts, four patches each
    assert [c.index for c in chunks] == list(range(8))
    assert [c.is_last for c in chunks] == [False] * 7 + [True]

