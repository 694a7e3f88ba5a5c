"""Fixtures shared by the F5-TTS unit tests: one tiny random-init v1 Base model per module,
loaded on one CPU thread, and a short voiced reference (a 150 Hz tone with a syllable rhythm)."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile

import mizuoto
from mizuoto import Reference
from mizuoto_f5tts.engine import F5Engine
from mizuoto_f5tts.fixtures import write_random_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_random_model_dir(tmp_path_factory.mktemp("f5") / "v1", "v1_base", size="tiny")


@pytest.fixture(scope="module")
def engine(model_dir):
    options = mizuoto.Options.from_mapping({"compute.device": "cpu", "compute.cpu_threads": 1})
    return F5Engine.load(model_dir, options=options)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    t = np.arange(2 * 16000) / 16000
    voice = (0.2 * np.sin(2 * np.pi * 150 * t) * (0.6 - 0.4 * np.cos(2 * np.pi * 3 * t)))
    path = tmp_path_factory.mktemp("ref") / "ref.wav"
    soundfile.write(path, voice.astype(np.float32), 16000, subtype="PCM_16")
    return Reference(path, text="A short reference line.")
