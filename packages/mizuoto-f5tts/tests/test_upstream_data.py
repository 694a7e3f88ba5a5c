"""Upstream's prepared data sets (raw.arrow + duration.json) read by the F5 trainer. The folders
here are written with pyarrow in the layout of datasets' ArrowWriter (an IPC stream);
parity/test_training_parity.py reads folders written by upstream's own prepare_csv_wavs."""

from __future__ import annotations

import json
import sys

import attrs
import pytest
import soundfile

from mizuoto import TrainingConfig
from mizuoto.errors import InvalidRequest
from mizuoto.training.state import load_state_file
from mizuoto.training.synthetic_data import write_synthetic_dataset
from mizuoto.training.trainer import CHECKPOINT
from mizuoto_f5tts.fixtures import write_random_model_dir
from mizuoto_f5tts.text import to_tokens
from mizuoto_f5tts.training import F5Trainer
from mizuoto_f5tts.training.data import prepare_dataset
from mizuoto_f5tts.training.upstream_data import ArrowUnavailable, prepared_folder, read_rows

pa = pytest.importorskip("pyarrow", reason="the arrow extra (mizuoto-f5tts[arrow])")


def _csv_rows(metadata):
    lines = metadata.read_text(encoding="utf-8").splitlines()[1:]
    return [(metadata.parent / audio, text) for audio, text in (line.split("|", 1) for line in lines)]


def write_prepared(folder, rows, durations=None, *, texts_as="tokens"):
    """``rows``: (audio path, text, duration) as prepare_csv_wavs keeps them."""
    folder.mkdir(parents=True, exist_ok=True)
    text = [to_tokens(t) if texts_as == "tokens" else t for _, t, _ in rows]
    table = pa.table({"audio_path": [str(a) for a, _, _ in rows], "text": text,
                      "duration": [d for _, _, d in rows]})
    with pa.OSFile(str(folder / "raw.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=2)  # several record batches
    durations = [d for _, _, d in rows] if durations is None else durations
    (folder / "duration.json").write_text(json.dumps({"duration": durations}))
    return folder


@pytest.fixture(scope="module")
def metadata(tmp_path_factory):
    return write_synthetic_dataset(tmp_path_factory.mktemp("data"), count=6, seed=3)


@pytest.fixture(scope="module")
def upstream_folder(metadata, tmp_path_factory):
    rows = [(a, t, soundfile.info(str(a)).duration) for a, t in _csv_rows(metadata)]
    return write_prepared(tmp_path_factory.mktemp("prepared") / "my_data_pinyin", rows)


def test_the_folder_reads_as_the_csv_it_came_from(metadata, upstream_folder):
    from_csv = prepare_dataset(metadata, None)
    from_arrow = prepare_dataset(upstream_folder, None)
    assert [(c.audio, c.tokens, c.duration) for c in from_arrow.clips] == \
        [(c.audio, c.tokens, c.duration) for c in from_csv.clips]
    # raw.arrow named directly, and a metadata.csv beside it: the arrow rows are read
    assert prepare_dataset(upstream_folder / "raw.arrow", None) == from_arrow
    (upstream_folder / "metadata.csv").write_text("audio_file|text\nnope.wav|other\n")
    try:
        assert prepare_dataset(upstream_folder, None) == from_arrow
    finally:
        (upstream_folder / "metadata.csv").unlink()
    assert prepared_folder(metadata) is None and prepared_folder(metadata.parent) is None


def test_tokens_and_durations_are_upstreams(tmp_path, metadata):
    """The batching duration is duration.json's, the length check the row's; the tokens are
    taken as prepared (a str is split into characters, as upstream's list_str_to_idx does)."""
    rows = [(a, t, 1.0) for a, t in _csv_rows(metadata)[:3]]
    rows[1] = (rows[1][0], "ni3 hao3", 1.0)
    folder = write_prepared(tmp_path / "p", rows, durations=[0.9, 1.1, 1.2])
    data = prepare_dataset(folder, None)
    assert data.durations == [0.9, 1.1, 1.2]
    assert data.clips[0].tokens == tuple(to_tokens(rows[0][1]))
    assert data.clips[1].tokens == tuple(to_tokens("ni3 hao3"))
    strings = write_prepared(tmp_path / "s", rows, texts_as="str")
    assert prepare_dataset(strings, None).clips[1].tokens == tuple("ni3 hao3")


def test_bad_rows_are_reported_and_skipped(tmp_path, metadata):
    good = _csv_rows(metadata)
    rows = [(good[0][0], good[0][1], 1.0),
            (tmp_path / "missing.wav", "Gone.", 1.0),
            (good[1][0], good[1][1], 31.0),  # upstream's CustomDataset skips it too (row duration)
            (good[2][0], "", 1.0),
            ("wavs/clip_003.wav", good[3][1], 1.0)]  # relative: to the folder
    folder = write_prepared(tmp_path / "p", rows)
    (folder / "wavs").mkdir()
    (folder / "wavs" / "clip_003.wav").write_bytes(good[3][0].read_bytes())
    data = prepare_dataset(folder, None)
    assert [c.audio for c in data.clips] == [str(good[0][0]), str(folder / "wavs/clip_003.wav")]
    reasons = {b.row: b.reason for b in data.bad_rows}
    assert "not found" in reasons[2] and "outside [0.3, 30.0] s" in reasons[3]
    assert reasons[4] == "empty text" and set(reasons) == {2, 3, 4}
    vocab = {t: i for i, t in enumerate(" Hel")}
    with pytest.raises(InvalidRequest, match="tokens outside the vocabulary"):
        prepare_dataset(folder, vocab)


@pytest.mark.parametrize("damage", ["no durations", "short durations", "not json", "no column",
                                    "not arrow"])
def test_a_broken_folder_is_refused_by_name(tmp_path, metadata, damage):
    rows = [(a, t, 1.0) for a, t in _csv_rows(metadata)[:2]]
    folder = write_prepared(tmp_path / "p", rows)
    if damage == "no durations":
        (folder / "duration.json").unlink()
    elif damage == "short durations":
        (folder / "duration.json").write_text(json.dumps({"duration": [1.0]}))
    elif damage == "not json":
        (folder / "duration.json").write_text("{")
    elif damage == "no column":
        table = pa.table({"audio_path": ["a.wav"], "duration": [1.0]})
        with pa.OSFile(str(folder / "raw.arrow"), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
    else:
        (folder / "raw.arrow").write_bytes(b"not an arrow stream at all")
    with pytest.raises(InvalidRequest) as caught:
        prepare_dataset(folder, None)
    assert caught.value.field == "dataset"
    assert {"no durations": "no duration.json", "short durations": "one duration",
            "not json": "duration.json", "no column": "text",
            "not arrow": "not an Arrow stream"}[damage] in str(caught.value)


def test_without_pyarrow_the_extra_is_named(tmp_path, metadata, monkeypatch):
    folder = write_prepared(tmp_path / "p", [(a, t, 1.0) for a, t in _csv_rows(metadata)[:1]])
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ArrowUnavailable, match=r"mizuoto-f5tts\[arrow\]") as caught:
        read_rows(folder)
    assert caught.value.exit_code == 3


def test_training_on_the_folder_equals_training_on_the_csv(tmp_path, metadata, upstream_folder):
    model_dir = write_random_model_dir(tmp_path / "model", "v1_base", size="tiny")
    csv_config = TrainingConfig(method="full", model=str(model_dir), dataset=metadata,
                            output_dir=tmp_path / "csv", steps=4, learning_rate=1e-4, seed=5,
                            save_every=10, params={"epochs": 2, "warmup_updates": 1,
                                                   "batch_frames": 300})
    states = []
    for config in (csv_config, attrs.evolve(csv_config, dataset=upstream_folder,
                                            output_dir=tmp_path / "arrow")):
        trainer = F5Trainer()
        trainer.train(trainer.prepare(config))
        states.append(load_state_file(config.output_dir / CHECKPOINT))
    csv_state, arrow_state = states
    assert csv_state["records"] == arrow_state["records"] and len(csv_state["records"]) == 4
    assert csv_state["position"]["order"] == arrow_state["position"]["order"]
    for key, value in csv_state["model"].items():
        assert value.equal(arrow_state["model"][key]), key
