"""`mizuoto say` refuses what F5-TTS would refuse before the model loads, naming the CLI flag."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from mizuoto.cli import cli
from mizuoto_f5tts.engine import F5Engine


def _model_folder(path):
    """A folder F5-TTS recognizes (its files empty): a load of it would fail, or take long."""
    (path / "vocos").mkdir(parents=True)
    for name in ("vocos/config.yaml", "vocos/pytorch_model.bin", "model_1250000.safetensors"):
        (path / name).write_bytes(b"")
    return path


def test_a_reference_without_transcript_is_refused_before_the_load(tmp_path, monkeypatch):
    loads = []
    monkeypatch.setattr(F5Engine, "load", classmethod(lambda cls, *a, **k: loads.append(a)))
    ref = tmp_path / "ref.wav"
    sf.write(ref, np.zeros(2400, dtype=np.float32), 24000)
    result = CliRunner().invoke(cli, ["say", "-m", str(_model_folder(tmp_path / "model")),
                                      "-o", str(tmp_path / "out.wav"), "--ref-audio", str(ref),
                                      "hello"], obj={})
    assert result.exit_code == 2, result.output
    assert "--ref-text: is required by F5-TTS" in result.output
    assert "reference.text" not in result.output
    assert loads == []


@pytest.mark.parametrize(("amplitude", "refused"), [(0.003, True), (0.03, False)])
def test_a_reference_upstream_would_trim_away_is_refused_before_the_load(
        tmp_path, monkeypatch, amplitude, refused):
    """Below F5's -42 dBFS edge trimming throughout (a 0.003 tone: -53 dBFS) upstream keeps
    nothing of it; a quiet recording above it (0.03: -33 dBFS) is taken."""
    loads = []
    monkeypatch.setattr(F5Engine, "load", classmethod(lambda cls, *a, **k: loads.append(a)))
    ref = tmp_path / "ref.wav"
    t = np.arange(24000) / 24000
    sf.write(ref, (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 24000)
    result = CliRunner().invoke(cli, ["say", "-m", str(_model_folder(tmp_path / "model")),
                                      "-o", str(tmp_path / "out.wav"), "--ref-audio", str(ref),
                                      "--ref-text", "Hello.", "hello"], obj={})
    if refused:
        assert result.exit_code == 2, result.output
        assert "--ref-audio: is silent to F5-TTS: quieter than its -42 dBFS" in result.output
        assert "its loudest 10 ms are at -53 dBFS" in result.output and "loudnorm" in result.output
        assert loads == []
    else:
        assert loads, result.output  # reached the load (stubbed: nothing is spoken)
