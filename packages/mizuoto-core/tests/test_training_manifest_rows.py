"""The one row reader every trainer calls (`read_manifest_rows`): rows and rejections in line
order, upstream F5-TTS's CSV dialect, the typed extras, the audio files refused before any is
decoded, and the decoded-audio checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mizuoto.errors import InvalidRequest
from mizuoto.training.manifest import (
    ManifestRow,
    RejectedRow,
    read_audio_like_datasets,
    read_manifest_rows,
    refused_samples,
)

RATE = 16000


@pytest.fixture
def clips(tmp_path) -> Path:
    """a.wav (0.5 s) and b.wav (0.96 s), a quiet tone's constant level at 16 kHz."""
    for name, frames in (("a", 8000), ("b", 15360)):
        sf.write(tmp_path / f"{name}.wav", np.full(frames, 0.3, np.float32), RATE)
    return tmp_path


def _read(folder: Path, rows: list, **options):
    manifest = folder / "m.jsonl"
    manifest.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                                for r in rows), encoding="utf-8")
    read = read_manifest_rows(manifest, **options)
    return read, {r.line: r.reason for r in read.rejected}


def _row(**extra) -> dict:
    return {"audio": "a.wav", "text": "hi", **extra}


def test_rows_and_rejections_come_in_line_order_with_the_keys_any_row_holds(clips):
    read, rejected = _read(clips, [_row(), "[1, 2]", {"text": "no audio"}, _row(text=" "),
                                   _row(audio="gone.wav"), _row(speaker="x"),
                                   {"audio_file": "b.wav", "text": "alias"}])
    assert [type(e) for e in read.entries] == [ManifestRow] + [RejectedRow] * 4 + [ManifestRow,
                                                                                RejectedRow]
    assert [e.line for e in read.entries] == [1, 2, 3, 4, 5, 6, 7]
    assert [r.line for r in read.rows] == [1, 6] and read.rows[1].extra == {"speaker": "x"}
    assert rejected[2] == "the line holds an array where an object belongs"
    assert rejected[3] == rejected[7] == "no audio path" and rejected[4] == "empty text"
    assert rejected[5] == f"no audio file {clips / 'gone.wav'} (not found)"
    assert read.columns == {"audio", "text", "speaker", "audio_file"}
    # upstream F5's JSONL also names the audio "audio_file"
    alias, _ = _read(clips, [{"audio_file": "b.wav", "text": "alias"}],
                     audio_keys=("audio", "audio_file"))
    assert alias.rows[0].audio == clips / "b.wav" and alias.rows[0].extra == {}


def test_a_line_separator_inside_a_text_is_part_of_it(clips):
    manifest = clips / "m.jsonl"
    manifest.write_text(json.dumps(_row(text="one\u2028two\x85three"), ensure_ascii=False)
                        + "\n", encoding="utf-8")
    assert [r.text for r in read_manifest_rows(manifest).rows] == ["one\u2028two\x85three"]


def test_upstreams_csv_dialect_honours_quotes_and_names_the_rows_it_cannot_take(clips):
    path = clips / "metadata.csv"
    path.write_text(f"audio_file|text\na.wav|\"Hello | there\"\nb.wav|{'x' * 140_000}\n"
                    'a.wav|"open quote\nb.wav|swallowed"\nb.wav|Fine | cut\n', encoding="utf-8")
    upstream = read_manifest_rows(path, csv_dialect="csv_module")
    assert [(r.line, r.text) for r in upstream.rows] == [(2, "Hello | there"), (6, "Fine")]
    reasons = {r.line: r.reason for r in upstream.rejected}
    assert "field larger than field limit" in reasons[3] and "lines 4-5" in reasons[4]
    # the contract's dialect: split at the first "|", the header optional
    first_pipe = read_manifest_rows(path)
    assert [r.text for r in first_pipe.rows][:1] == ['"Hello | there"']
    path.write_text("a.wav|no header\n", encoding="utf-8")
    assert [r.text for r in read_manifest_rows(path).rows] == ["no header"]
    with pytest.raises(InvalidRequest, match="header must be audio_file|text") as caught:
        read_manifest_rows(path, csv_dialect="csv_module", field="--data")
    assert caught.value.field == "--data"


def test_unusable_declared_lengths_are_rejected_with_the_field_named(clips):
    rows = [_row(duration=1.0), _row(duration="abc"), _row(duration=-0.5), _row(duration=True),
            _row(duration=[1.0]), _row(ref_duration=-1), _row(duration="nan"),
            '{"audio": "a.wav", "text": "hi", "duration": Infinity}', _row(duration="1e999"),
            _row(ref_duration={"s": 1}), _row(duration="-0"), _row(duration=" 2 ")]
    read, rejected = _read(clips, rows, typed_extras=True)
    assert [(r.line, r.duration) for r in read.rows] == [(1, 1.0), (11, 0.0), (12, 2.0)]
    assert sorted(rejected) == list(range(2, 11))
    for line, reason in rejected.items():
        field = "ref_duration" if line in (6, 10) else "duration"
        assert reason.startswith(f'"{field}" must be a non-negative number of seconds'), reason
    assert rejected[2].endswith('not "abc"') and rejected[3].endswith("not -0.5")
    # without typed extras the values are the row's other keys, unread
    plain, rejected = _read(clips, rows[:2])
    assert not rejected and plain.rows[1].duration is None
    assert plain.rows[1].extra == {"duration": "abc"}


def test_is_prompt_accepts_flags_and_rejects_other_values_with_the_field_named(clips):
    """Booleans and 0/1 (upstream's ``bool()`` of a bool or int column); absent or null: not a
    prompt. Strings (``bool("false")`` is True upstream), other numbers, lists and objects are
    refused."""
    rows = [_row(is_prompt=True), _row(is_prompt=False), _row(), _row(is_prompt=None),
            _row(is_prompt=1), _row(is_prompt=0), _row(is_prompt="false"), _row(is_prompt=2),
            _row(is_prompt=1.0), _row(is_prompt=[True]), _row(is_prompt={"a": 1}),
            _row(is_prompt="yes", duration="bad")]
    read, rejected = _read(clips, rows, typed_extras=True)
    assert [(r.line, r.is_prompt) for r in read.rows] == [
        (1, True), (2, False), (3, False), (4, False), (5, True), (6, False)]
    assert sorted(rejected) == list(range(7, 13))
    for line in range(7, 12):
        assert rejected[line].startswith('"is_prompt" must be true or false, not '), rejected
    assert rejected[7].endswith('not "false"') and rejected[8].endswith("not 2")
    assert rejected[12].startswith('"duration"')


def test_a_reference_is_a_path_to_a_regular_file(clips):
    read, rejected = _read(clips, [_row(ref_audio="b.wav"), _row(ref_audio=3),
                                   _row(ref_audio="gone.wav"), _row(ref_audio=".")],
                           typed_extras=True, headers=True)
    assert read.rows[0].ref_audio == clips / "b.wav"
    assert read.rows[0].ref_header.frames == round(0.96 * RATE)
    assert rejected[2] == '"ref_audio" must be a path'
    assert rejected[3].startswith("ref_audio: no audio file") and "not found" in rejected[3]
    assert rejected[4].startswith("ref_audio: ") and "not a regular file" in rejected[4]


def test_audio_files_are_refused_by_kind_and_header_without_decoding(clips, monkeypatch):
    decoded = []

    def read(file, *args, **kwargs):  # a decode here is what the test refuses
        decoded.append(file)
        raise OSError("decoded")

    monkeypatch.setattr(sf, "read", read)
    (clips / "broken.wav").write_bytes(b"RIFF, but not really")
    read_rows, rejected = _read(clips, [
        _row(audio="/dev/zero"), _row(audio="/proc/self/status"), _row(audio="."),
        _row(audio="broken.wav"), _row(audio="wavs/a\0b.wav"), _row(audio="b.wav")],
        headers=True)
    assert all("not a regular file" in rejected[line] for line in (1, 2, 3)), rejected
    assert "unreadable audio" in rejected[4] and str(clips / "broken.wav") in rejected[4]
    assert "unusable audio path" in rejected[5]
    assert [r.header.rate for r in read_rows.rows] == [RATE] and decoded == []


def test_decoded_audio_is_refused_by_name():
    assert refused_samples(np.zeros((0, 1), np.float32)) == "no samples"
    assert refused_samples(np.array([0.1, np.nan])) == "NaN or infinite samples"
    assert refused_samples(np.full(100, 1e-4)) == "silent"
    assert refused_samples(np.full(100, 0.1)) == ""


@pytest.mark.parametrize(("rate", "channels"), [(16000, 1), (44100, 2), (22050, 1)])
def test_read_audio_like_datasets_decodes_as_datasets_audio_does(tmp_path, rate, channels):
    """Upstream's ``datasets.Audio``: soundfile float64, ``librosa.to_mono``, ``librosa.resample``
    (soxr HQ); Mizuoto does the same without librosa installed."""
    librosa = pytest.importorskip("librosa")

    path = tmp_path / "clip.wav"
    noise = np.random.default_rng(rate).uniform(-0.5, 0.5, (rate // 3, channels))
    sf.write(path, noise, rate, subtype="PCM_16")
    array, file_rate = sf.read(str(path))
    expected = librosa.to_mono(array.T)
    if file_rate != 16000:
        expected = librosa.resample(expected, orig_sr=file_rate, target_sr=16000)
    got = read_audio_like_datasets(path, 16000)
    assert got.dtype == expected.dtype == np.float64
    assert np.array_equal(got, expected)


def test_a_folder_can_prefer_its_metadata_csv_as_upstream_f5_reads_one(clips):
    from mizuoto.training.manifest import find_manifest

    (clips / "metadata.csv").write_text("audio_file|text\na.wav|hi\n", encoding="utf-8")
    (clips / "m.jsonl").write_text(json.dumps(_row()) + "\n", encoding="utf-8")
    assert find_manifest(clips, metadata_csv_first=True) == clips / "metadata.csv"
    with pytest.raises(InvalidRequest, match="exactly one"):
        find_manifest(clips)
