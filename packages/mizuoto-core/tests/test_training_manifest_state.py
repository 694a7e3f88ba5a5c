"""The training toolkit's data set reader (JSONL and metadata.csv) and resumable state file."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from mizuoto.errors import InvalidRequest
from mizuoto.training import load_training_state, read_manifest, save_training_state


def _clips(folder, *names):
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"RIFF")


def test_a_jsonl_manifest_gives_its_usable_rows_and_names_the_skipped_lines(tmp_path, caplog):
    _clips(tmp_path / "wavs", "a.wav", "b.wav")
    lines = [{"audio": "wavs/a.wav", "text": "one", "duration": 1.5},
             {"audio": "wavs/missing.wav", "text": "two"},
             {"audio": "wavs/b.wav", "text": "  "}, "not json",
             {"audio": str(tmp_path / "wavs" / "b.wav"), "text": "four"}]
    manifest = tmp_path / "train.jsonl"
    manifest.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines))
    with caplog.at_level(logging.WARNING):
        rows = read_manifest(tmp_path)  # the folder holding it
    assert [(r.audio.name, r.text, r.line) for r in rows] == [("a.wav", "one", 1),
                                                              ("b.wav", "four", 5)]
    assert rows[0].extra == {"duration": 1.5}
    skipped = [m for m in caplog.messages if "skipped" in m]
    assert [m.split(" line ")[1].split(" ")[0] for m in skipped] == ["2", "3", "4"]


def test_a_metadata_csv_is_read_with_its_header(tmp_path, caplog):
    _clips(tmp_path / "wavs", "a.wav")
    (tmp_path / "metadata.csv").write_text(
        "audio_file|text\nwavs/a.wav|Hello | there\nwavs/gone.wav|x\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        rows = read_manifest(tmp_path / "metadata.csv")
    assert [(r.audio.name, r.text, r.line) for r in rows] == [("a.wav", "Hello | there", 2)]
    assert any("line 3 skipped: no audio file" in m for m in caplog.messages)


def test_no_usable_row_or_no_single_manifest_is_refused_naming_the_field(tmp_path):
    with pytest.raises(InvalidRequest) as caught:
        read_manifest(tmp_path, field="--data")
    assert caught.value.field == "--data" and "found: none" in str(caught.value)
    (tmp_path / "train.jsonl").write_text('{"audio": "x.wav", "text": "y"}\n')
    with pytest.raises(InvalidRequest, match="no usable rows"):
        read_manifest(tmp_path)


@pytest.mark.parametrize("trainable_only", [False, True])
def test_a_resumed_state_continues_to_the_same_bits(tmp_path, trainable_only):
    def model_and_optimizer():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
        model[0].weight.requires_grad_(not trainable_only)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                      lr=1e-2)
        return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)

    def step(model, optimizer, scheduler, generator):
        x = torch.randn(5, 3, generator=generator) + torch.rand(1)  # both generators drawn
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()

    model, optimizer, scheduler = model_and_optimizer()
    generator = torch.Generator().manual_seed(1)
    step(model, optimizer, scheduler, generator)
    save_training_state(tmp_path / "state.pt", 1, model=model, optimizer=optimizer,
                        scheduler=scheduler, generator=generator,
                        trainable_only=trainable_only, extra={"epoch": 0})
    step(model, optimizer, scheduler, generator)
    expected = [p.detach().clone() for p in model.parameters()]

    model, optimizer, scheduler = model_and_optimizer()
    generator = torch.Generator()
    done, extra = load_training_state(tmp_path / "state.pt", model=model, optimizer=optimizer,
                                      scheduler=scheduler, generator=generator)
    assert (done, extra) == (1, {"epoch": 0})
    step(model, optimizer, scheduler, generator)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), expected, strict=True))
