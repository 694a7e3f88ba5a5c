"""`mizuoto say` refuses what F5-TTS would refuse before the model loads, naming the CLI flag."""

from __future__ import annotations

import numpy as np
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
