"""The manifest's declared lengths (``duration``, ``ref_duration``): what upstream's
``max_batch_tokens`` estimate reads from them; the ``is_prompt`` flag and the sequences it
packs. (Reading and checking those values is core's: mizuoto-core's
test_training_manifest_rows.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from mizuoto.contracts import TrainingConfig
from mizuoto_voxcpm.fixtures import write_random_model
from mizuoto_voxcpm.training import VoxCPMTrainer
from mizuoto_voxcpm.training.data import Sample, batch_token_filter, pack, read_manifest

RATE = 16000


@pytest.fixture
def clips(tmp_path) -> Path:
    for name, seconds in (("a", 0.5), ("b", 0.96)):
        t = np.arange(round(seconds * RATE)) / RATE
        sf.write(tmp_path / f"{name}.wav", (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32),
                 RATE)
    return tmp_path


def _read(folder: Path, rows: list) -> tuple[list[Sample], dict[int, str]]:
    manifest = folder / "m.jsonl"
    manifest.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                                for r in rows), encoding="utf-8")
    samples, rejected = read_manifest(manifest, sample_rate=RATE, tokenize=lambda t: [5] * len(t),
                                      max_length=512, patch_size=2, hop_length=640)
    return samples, {r.line: r.reason for r in rejected}


def _row(**extra) -> dict:
    return {"audio": "a.wav", "text": "hi", **extra}


def test_declared_durations_stand_in_for_the_measured_length(clips):
    """Numbers and numeric strings read with ``float``; absent or null (a column some rows
    lack reads as None upstream): the audio's length."""
    rows = [_row(duration=1), _row(duration=1.25), _row(duration="0.5"), _row(duration=" 2 "),
            _row(duration=0), _row(duration=None), _row()]
    samples, rejected = _read(clips, rows)
    assert not rejected
    assert [s.estimate_seconds for s in samples] == [1.0, 1.25, 0.5, 2.0, 0.0, 0.5, 0.5]


@pytest.mark.parametrize(("refs", "expected"), [
    # no ref_audio column: upstream never reads ref_duration
    ([{"ref_duration": 3.0}, {}], [None, None]),
    # ref_audio without a ref_duration column: the reference's length
    ([{"ref_audio": "b.wav"}, {}], [0.96, None]),
    # with a ref_duration column: each row's value, reference or not, None where it lacks one
    ([{"ref_audio": "b.wav"}, {"ref_duration": 0.7}, {"ref_audio": "b.wav", "ref_duration": 0.3}],
     [None, 0.7, 0.3]),
])
def test_reference_lengths_follow_upstreams_columns(clips, refs, expected):
    samples, rejected = _read(clips, [_row(**extra) for extra in refs])
    assert not rejected
    assert [s.ref_estimate_seconds for s in samples] == expected
    assert [s.ref_audio is not None for s in samples] == ["ref_audio" in r for r in refs]


def test_a_rounded_duration_can_cross_a_patch(clips):
    """0.96 s is 24 frames (12 patches of 2); a manifest's 0.97 is 25 frames (13 patches)."""
    b = {"audio": "b.wav"}
    samples, _ = _read(clips, [_row(**b), _row(**b, duration=0.97),
                               _row(**b, ref_audio="a.wav", ref_duration=0),
                               _row(**b, ref_duration=0.04)])
    kept, dropped = batch_token_filter(samples, frames_per_second=25.0, patch_size=2,
                                       max_batch_tokens=32, batch_size=2)
    assert [s.line for s in kept] == [1, 3]  # 2 + 12 + 2 = 16; a zero reference counts nothing
    # 2 + 13 + 2; a 1-frame reference (no ref_audio on the row) adds its patch and 103/104
    assert [(r.line, r.reason.split(",")[0]) for r in dropped] == [(2, "about 17 tokens"),
                                                                 (4, "about 19 tokens")]


def test_prepare_reports_bad_durations_and_filters_by_declared_ones(clips):
    model = write_random_model(clips / "model", "voxcpm-0.5b", seed=6)
    rows = [_row(duration=0.5), _row(duration=0.6), _row(duration="long"), _row(duration=9.0)]
    (clips / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = TrainingConfig(method="full", model=str(model), dataset=clips / "d.jsonl",
                            output_dir=clips / "run", steps=1, learning_rate=1e-4, batch_size=2,
                            seed=42, params={"max_batch_tokens": 2 * 60})
    run = VoxCPMTrainer().prepare(config)
    assert [s.line for s in run.samples] == [1, 2]
    assert run.counted_samples == 3  # before max_batch_tokens, as upstream's epoch counts
    reasons = dict(run.rejected)
    assert reasons[3].startswith('"duration" must be') and "max_batch_tokens" in reasons[4]


def test_a_prompt_row_is_framed_by_103_104_without_loss(clips):
    """``[text, 103, audio, 104]`` with every loss mask 0 (the stop label stays on the last
    patch, masked out); a prompt row with a reference packs as a reference row (upstream
    ignores the flag there)."""
    samples, _ = _read(clips, [_row(is_prompt=True), _row(),
                               _row(is_prompt=True, ref_audio="b.wav")])
    feats = [torch.ones(3, 2, 4), torch.ones(3, 2, 4), torch.ones(3, 2, 4)]
    batch = pack(samples[:2], feats[:2], 512)
    assert batch.text_tokens[0].tolist() == [5, 5, 103, 0, 0, 0, 104]
    assert batch.text_tokens[1].tolist() == [5, 5, 101, 0, 0, 0, 102]
    assert batch.loss_mask[0].tolist() == [0] * 7
    assert batch.loss_mask[1].tolist() == batch.audio_mask[1].tolist() == [0, 0, 0, 1, 1, 1, 0]
    assert batch.audio_mask[0].tolist() == batch.audio_mask[1].tolist()
    assert batch.labels[0].tolist() == batch.labels[1].tolist() == [0, 0, 0, 0, 0, 1, 0]
    ref = pack(samples[2:], feats[2:], 512, [torch.ones(2, 2, 4)])
    assert ref.text_tokens[0].tolist() == [103, 0, 0, 104, 5, 5, 101, 0, 0, 0, 102]
    assert ref.loss_mask[0].tolist() == [0] * 7 + [1, 1, 1, 0]


def test_hostile_json_lines_are_rejected_by_name_and_the_rest_kept(clips):
    samples, rejected = _read(clips, [
        {"audio": "a.wav", "text": "kept"},
        '{"audio": "a.wav", "text": ' + "[" * 6_543 + "]" * 6_543 + "}",
        '{"audio": "a.wav", "text": "x", "duration": ' + "9" * 2_222 + "}",
        '{"audio": "a.wav", "text": "one", "audio": "b.wav"}',
    ])
    assert [s.text for s in samples] == ["kept"]
    assert "nests deeper than" in rejected[2]
    assert "2,222 digits" in rejected[3]
    assert "'audio' is given twice" in rejected[4]


def test_audio_too_long_for_the_context_is_refused_by_its_header_without_decoding(
        clips, monkeypatch):
    import soundfile

    long_clip = clips / "long.wav"  # 7 minutes at 11,025 Hz stereo: far past 512 positions
    sf.write(long_clip, np.full((11_025 * 420, 2), 0.25, np.float32), 11_025)
    decoded, read = [], soundfile.read

    def counted_read(file, *args, **kwargs):
        decoded.append(Path(file).name)
        return read(file, *args, **kwargs)

    monkeypatch.setattr(soundfile, "read", counted_read)
    samples, rejected = _read(clips, [
        {"audio": "long.wav", "text": "too long"},
        {"audio": "a.wav", "text": "kept", "ref_audio": "long.wav"},
        {"audio": "/dev/zero", "text": "a device"},
        {"audio": "/proc/self/status", "text": "a kernel file"},
        {"audio": ".", "text": "a folder"},
        {"audio": "b.wav", "text": "kept too"},
    ])
    assert [s.text for s in samples] == ["kept too"]
    assert "by the audio's header" in rejected[1] and "by the audio's header" in rejected[2]
    assert all("not a regular file" in rejected[line] for line in (3, 4, 5))
    assert "long.wav" not in decoded and decoded == ["b.wav"]
