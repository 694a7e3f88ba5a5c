"""Long-form synthesis with VoxCPM2 (tiny random model): one section is the file
``result.save`` writes; a longer text is VoxCPM's own synthesis of each section, cloned from the
same reference, joined end to end (as VoxCPM joins its own chunks)."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile
import torch

from mizuoto import Reference, SynthesisRequest
from mizuoto.longform import iter_sections, section_seed, synthesize_to
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import write_random_model

FAST = {"max_len": 3, "inference_timesteps": 2}
TEXT = " ".join(f"Sentence {i} is short." for i in range(8))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return VoxCPMEngine.load(write_random_model(tmp_path_factory.mktemp("v2") / "v2", "voxcpm2",
                                                dtype="float32"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("audio") / "ref.wav"
    t = torch.arange(int(0.4 * 22050)) / 22050
    soundfile.write(path, (0.3 * torch.sin(2 * torch.pi * 220 * t)).numpy(), 22050)
    return Reference(path, "A reference.")


@pytest.mark.parametrize("suffix", [".wav", ".flac"])
def test_one_section_is_the_file_result_save_writes(engine, reference, tmp_path, suffix):
    request = SynthesisRequest("Hello there.", reference=reference, seed=4, params=FAST)
    engine.synthesize(request).save(tmp_path / f"direct{suffix}")
    synthesize_to(engine, tmp_path / f"long{suffix}", request)
    assert (tmp_path / f"direct{suffix}").read_bytes() == (tmp_path / f"long{suffix}").read_bytes()


def test_sections_are_voxcpm_synthesis_of_each(engine, reference, tmp_path):
    request = SynthesisRequest(TEXT, reference=reference, seed=4, params=FAST)
    done = synthesize_to(engine, tmp_path / "long.wav", request, max_chars=60)
    expected = []
    for index, section in enumerate(iter_sections([TEXT], 60)):
        result = engine.synthesize(SynthesisRequest(section, reference=reference, params=FAST,
                                                    seed=section_seed(4, index)))
        result.save(tmp_path / "one.wav")
        expected.append(soundfile.read(tmp_path / "one.wav", dtype="int16")[0])
    assert done.sections == len(expected) >= 3
    assert np.array_equal(soundfile.read(tmp_path / "long.wav", dtype="int16")[0],
                          np.concatenate(expected))
    assert done.applied.seed == 4 and done.applied.extra["sections"] == done.sections
