"""`mizuoto say` refuses what VoxCPM would refuse before the model loads, naming the CLI flag."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from mizuoto.cli import cli
from mizuoto_voxcpm.engine import VoxCPMEngine


@pytest.mark.parametrize(("architecture", "refused"), [("voxcpm", True), ("voxcpm2", False)])
def test_a_reference_without_transcript_is_checked_before_the_load(tmp_path, monkeypatch,
                                                                   architecture, refused):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architecture": architecture,
                                                   "lm_config": {}}))
    (model / "audiovae.pth").write_bytes(b"")
    loads = []

    def load(cls, *args, **kwargs):
        loads.append(args)
        raise SystemExit(99)  # past the checks: nothing here would load

    monkeypatch.setattr(VoxCPMEngine, "load", classmethod(load))
    ref = tmp_path / "ref.wav"
    # a quiet tone, not zeros: digital silence is refused as a reference before the load too
    tone = 0.1 * np.sin(2 * np.pi * 220 * np.arange(1600) / 16000)
    sf.write(ref, tone.astype(np.float32), 16000)
    result = CliRunner().invoke(cli, ["say", "-m", str(model), "-o", str(tmp_path / "out.wav"),
                                      "--ref-audio", str(ref), "hello"], obj={})
    if refused:
        assert result.exit_code == 2, result.output
        assert "--ref-text: is required by VoxCPM-0.5B and VoxCPM1.5" in result.output
        assert loads == []
    else:
        assert result.exit_code == 99 and len(loads) == 1
