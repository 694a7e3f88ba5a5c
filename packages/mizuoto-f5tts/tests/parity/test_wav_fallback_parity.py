"""The GPU check's WAV reading (benchmarks/gpu/wav_shim) gives upstream exactly what
torchaudio.load and ffprobe give it here, where FFmpeg is installed: the GPU machine has no
FFmpeg, so there the check's upstream side reads through the stand-ins, and this is what
makes its comparisons mean what they mean here.

The files are the ones upstream reads in the check: the default voice (the reference of every
F5 bench run), the same voice after pydub's export (``preprocess_ref_audio_text`` writes that
and ``infer_process`` loads it) and the training parity tests' synthetic clips."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mizuoto.training.synthetic_data import write_synthetic_dataset
from mizuoto_f5tts.reference import default_voice

pytestmark = pytest.mark.parity

SHIM = Path(__file__).resolve().parents[4] / "benchmarks" / "gpu" / "wav_shim"


def _shim_load():
    spec = importlib.util.spec_from_file_location("gpu_check_wav_shim",
                                                  SHIM / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    meta_path = list(sys.meta_path)
    spec.loader.exec_module(module)
    sys.meta_path[:] = meta_path  # not this process's torchaudio: only the function
    return module.soundfile_load


@pytest.fixture(scope="module")
def wavs(tmp_path_factory):
    from pydub import AudioSegment

    root = tmp_path_factory.mktemp("wavs")
    voice = Path(default_voice().audio)
    exported = root / "exported.wav"
    AudioSegment.from_file(str(voice)).export(str(exported), format="wav")
    clips = sorted(write_synthetic_dataset(root / "data", count=3, seed=3).parent.glob(
        "**/*.wav"))
    assert clips
    return [voice, exported, *clips]


def test_the_shim_reads_what_torchaudio_reads(wavs):
    torchaudio = pytest.importorskip("torchaudio")
    load = _shim_load()
    for path in wavs:
        expected, expected_rate = torchaudio.load(str(path))
        for args in ({}, {"frame_offset": 100, "num_frames": 1000}):
            got, rate = load(str(path), **args)
            want = torchaudio.load(str(path), **args)[0] if args else expected
            assert rate == expected_rate
            assert got.dtype == want.dtype and torch.equal(got, want), (path, args)


def test_the_ffprobe_stand_in_prints_what_ffprobe_prints(wavs):
    ffprobe = shutil.which("ffprobe")
    assert ffprobe, "FFmpeg's ffprobe is required here (the parity session installs FFmpeg)"
    for path in wavs:
        # the exact call of upstream's prepare_csv_wavs.get_audio_duration
        args = ["-v", "error", "-show_entries", "format=duration", "-of",
                "default=noprint_wrappers=1:nokey=1", str(path)]
        real = subprocess.run([ffprobe, *args], capture_output=True, text=True, check=True)
        stand_in = subprocess.run([sys.executable, str(SHIM / "bin" / "ffprobe"), *args],
                                  capture_output=True, text=True, check=True)
        assert stand_in.stdout == real.stdout, path
