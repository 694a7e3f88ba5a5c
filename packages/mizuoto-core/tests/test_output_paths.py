"""Outputs: checked before any model loads, written through the path the user gave, with the
permissions the umask gives (issue 22 items 5, 10, 11, 14, 20)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import mizuoto
from mizuoto import Audio, Voice
from mizuoto.cli import cli
from mizuoto.errors import OutputNotWritable
from mizuoto.output_paths import check_output_dir, check_output_file
from mizuoto.runtime.atomic import atomic_path, save_safetensors

ROOT = os.geteuid() == 0


@pytest.fixture
def model(fake_plugin, tmp_path, monkeypatch):
    """The in-test model directory; ``loads`` counts the models loaded."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "fake.json").write_text("{}")
    loads = []
    real_load = mizuoto.load

    def counting_load(*args, **kwargs):
        loads.append(args)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(mizuoto, "load", counting_load)
    return tmp_path / "model", loads


@pytest.fixture
def read_only(tmp_path, monkeypatch):
    """A folder writes are refused in: chmod 0555, and ``os.access`` says so even as root
    (root ignores permissions, though not a read-only file system)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    real_access = os.access

    def access(path, mode, *args, **kwargs):
        if Path(path) == folder and mode & os.W_OK:
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
    yield folder
    folder.chmod(0o755)


def _say(*args):
    return CliRunner().invoke(cli, ["say", *map(str, args)], obj={})


def _unwritable_outputs(tmp_path, read_only):
    (tmp_path / "existing_file.wav").write_bytes(b"x")
    (tmp_path / "a_folder.wav").mkdir()
    return {
        "read-only folder": (["-o", read_only / "x.wav"], "--output", "cannot write in"),
        "read-only .mp3": (["-o", read_only / "x.mp3"], "--output", "cannot write in"),
        "under a file": (["-o", tmp_path / "existing_file.wav" / "x.wav"], "--output",
                         "is a file, not a folder"),
        "deep under a file": (["-o", tmp_path / "existing_file.wav" / "a" / "b" / "x.flac"],
                              "--output", "is a file, not a folder"),
        "a folder": (["-o", tmp_path / "a_folder.wav"], "--output", "is a directory"),  # click
        "bad extension": (["-o", tmp_path / "x.m4a"], "--output", ".aac or .pcm"),
        "no extension": (["-o", tmp_path / "x"], "--output", ".wav, .flac, .mp3"),
        "long-form in read-only": (["-f", tmp_path / "text.txt", "-o", read_only / "x.wav"],
                                   "--output", "cannot write in"),
        "save-voice in read-only": (["-o", tmp_path / "ok.wav", "--ref-audio",
                                     tmp_path / "ref.wav", "--save-voice",
                                     read_only / "v.safetensors"], "--save-voice",
                                    "cannot write in"),
        "save-voice under a file": (["-o", tmp_path / "ok.wav", "--ref-audio",
                                     tmp_path / "ref.wav", "--save-voice",
                                     tmp_path / "existing_file.wav" / "v.safetensors"],
                                    "--save-voice", "is a file"),
    }


def test_unwritable_outputs_are_refused_before_the_model_loads(model, tmp_path, read_only):
    model_dir, loads = model
    (tmp_path / "text.txt").write_text("Some words.", encoding="utf-8")
    Audio(torch.full((800,), 0.1), 8000).save(tmp_path / "ref.wav")
    for case, (args, field, problem) in _unwritable_outputs(tmp_path, read_only).items():
        result = _say("-m", model_dir, *args, "hello")
        assert result.exit_code == 2, (case, result.output)
        assert field in result.output and problem in result.output, (case, result.output)
        assert "Traceback" not in result.output
    assert loads == []
    assert sorted(p.name for p in read_only.iterdir()) == []


def test_edit_and_batch_check_their_outputs_first(model, tmp_path, read_only):
    model_dir, loads = model
    result = CliRunner().invoke(cli, ["edit", "x", "-m", str(model_dir), "-o",
                                      str(tmp_path / "x.ogg.bak"), "--ref-audio", "r.wav",
                                      "--ref-text", "r", "--segment", "0:1"], obj={})
    assert result.exit_code == 2 and "--output" in result.output
    (tmp_path / "in.txt").write_text("hello\n", encoding="utf-8")
    (tmp_path / "a_file").write_text("")
    for out in (read_only / "out", tmp_path / "a_file", tmp_path / "a_file" / "out"):
        result = CliRunner().invoke(cli, ["batch", "-m", str(model_dir), "-o", str(out),
                                          str(tmp_path / "in.txt")], obj={})
        assert result.exit_code == 2 and "--output-dir" in result.output, result.output
    assert loads == []


@pytest.mark.skipif(ROOT, reason="root writes in a chmod 0555 folder; the os.access case "
                    "above covers the check")
def test_a_real_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(OutputNotWritable):
            check_output_file(folder / "x.wav", "--output")
        with pytest.raises(OutputNotWritable):
            check_output_dir(folder / "out", "--output-dir")
    finally:
        folder.chmod(0o755)


def test_a_folder_to_be_created_is_fine(tmp_path):
    assert check_output_file(tmp_path / "a" / "b" / "x.wav", "--output")
    assert check_output_dir(tmp_path / "new" / "out", "--output-dir")
    (tmp_path / "broken").symlink_to(tmp_path / "nowhere" / "at-all")
    assert check_output_file(tmp_path / "broken", "--output")  # written through: target made


# -- the path the user gave: symlinks, FIFOs, devices -----------------------------------------

def test_a_symlink_is_written_through_not_replaced(tmp_path):
    target = tmp_path / "real" / "take.wav"
    target.parent.mkdir()
    target.write_bytes(b"old")
    link = tmp_path / "link.wav"
    link.symlink_to(target)
    Audio(torch.zeros(80), 8000).save(link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes()[:4] == b"RIFF"


def test_a_fifo_is_written_into_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    Audio(torch.zeros(80), 8000).save(fifo)
    reader.join(timeout=30)
    assert received and received[0][:4] == b"RIFF" and len(received[0]) == 44 + 160
    assert stat.S_ISFIFO(fifo.stat().st_mode)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_a_full_device_says_no_space_and_stays_a_device(model, tmp_path):
    model_dir, _ = model
    result = _say("-m", model_dir, "-o", "/dev/full", "hello")
    assert result.exit_code == 1 and "No space left on device" in result.output, result.output
    assert "Traceback" not in result.output
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    result = _say("-m", model_dir, "-o", "/dev/null", "hello")
    assert result.exit_code == 0 and "Wrote /dev/null" in result.output, result.output
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_long_form_refuses_a_fifo_by_name(model, tmp_path):
    model_dir, loads = model
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    (tmp_path / "text.txt").write_text("Some words.", encoding="utf-8")
    result = _say("-m", model_dir, "-f", tmp_path / "text.txt", "-o", fifo)
    assert result.exit_code == 2 and "not a regular file" in result.output, result.output
    assert loads == [] and stat.S_ISFIFO(fifo.stat().st_mode)


# -- permissions: the umask, as any tool ------------------------------------------------------

@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_outputs_voices_and_safetensors_follow_the_umask(tmp_path, umask_027):
    Audio(torch.zeros(80), 8000).save(tmp_path / "a.wav")
    Audio(torch.zeros(80), 8000).save(tmp_path / "a.mp3")
    Voice("fake", "f" * 64, 8000, {"x": torch.zeros(2)}).save(tmp_path / "v.safetensors")
    save_safetensors({"x": torch.zeros(2)}, tmp_path / "w.safetensors")
    with atomic_path(tmp_path / "sub" / "t.txt") as tmp:
        tmp.write_text("x")
    for name in ("a.wav", "a.mp3", "v.safetensors", "w.safetensors", "sub/t.txt"):
        assert _mode(tmp_path / name) == 0o640, name
    assert _mode(tmp_path / "sub") == 0o750


def test_random_model_directories_follow_the_umask(tmp_path, umask_027):
    from mizuoto.registry import random_models

    fixtures = random_models()
    if not fixtures:
        pytest.skip("no engine plugin installed: no fixture to write")
    chosen: dict[str, str] = {}  # the first small fixture of each engine
    for fixture_id in sorted(fixtures):
        if "realsize" not in fixture_id:
            chosen.setdefault(fixture_id.split("/")[0], fixture_id)
    for fixture_id in chosen.values():
        directory = tmp_path / fixture_id.replace("/", "_")
        result = CliRunner().invoke(cli, ["random-model", fixture_id, str(directory)], obj={})
        assert result.exit_code == 0, result.output
        for path in [directory, *directory.rglob("*")]:
            assert _mode(path) == (0o750 if path.is_dir() else 0o640), path


def test_random_model_checks_its_directory_first(fake_plugin, tmp_path, read_only):
    (tmp_path / "a_file").write_text("")
    for directory in (read_only / "model", tmp_path / "a_file", tmp_path / "a_file" / "m"):
        result = CliRunner().invoke(cli, ["random-model", "fake/tiny", str(directory)], obj={})
        assert result.exit_code == 2 and "DIRECTORY" in result.output, result.output
        assert "Traceback" not in result.output
    assert list(read_only.iterdir()) == []


def test_say_reports_no_success_for_a_file_that_is_not_there(model, tmp_path, monkeypatch):
    from mizuoto.contracts.results import SynthesisResult

    model_dir, _ = model
    monkeypatch.setattr(SynthesisResult, "save", lambda self, path: None)  # a writer that lost it
    result = _say("-m", model_dir, "-o", tmp_path / "out.wav", "hello")
    assert result.exit_code == 1 and "was not written" in result.output, result.output
    assert "Wrote" not in result.output


def test_an_output_that_is_an_input_or_another_output_is_refused_first(model, tmp_path):
    """Same file by name, through a symlink, through ``..`` and as a hard link: the
    reference, voice and text file stay as they were."""
    model_dir, loads = model
    ref = tmp_path / "ref.wav"
    Audio(torch.full((800,), 0.1), 8000).save(ref)
    (tmp_path / "link.wav").symlink_to(ref)
    os.link(ref, tmp_path / "hard.wav")
    (tmp_path / "sub").mkdir()
    text = tmp_path / "text.wav"  # a text file with an audio name: its words would be lost
    text.write_text("Some words.", encoding="utf-8")
    Voice("fake", "f" * 64, 8000, {"x": torch.zeros(2)}).save(tmp_path / "v.safetensors")
    voice_bytes = (tmp_path / "v.safetensors").read_bytes()
    ref_bytes = ref.read_bytes()
    cases = {
        "output is the reference": (["-o", ref, "--ref-audio", ref], "--output", "--ref-audio"),
        "through a link": (["-o", tmp_path / "link.wav", "--ref-audio", ref], "--output",
                           "--ref-audio"),
        "through ..": (["-o", f"{tmp_path}/sub/../ref.wav", "--ref-audio", ref], "--output",
                       "--ref-audio"),
        "a hard link": (["-o", tmp_path / "hard.wav", "--ref-audio", ref], "--output",
                        "--ref-audio"),
        "output is the text file": (["-f", text, "-o", text], "--output", "--text-file"),
        "output is the voice": (["-o", tmp_path / "v.wav", "--voice", tmp_path / "v.safetensors",
                                 "--save-voice", tmp_path / "v.safetensors", "--ref-audio", ref],
                                "--save-voice", "--voice"),
        "save-voice is the output": (["-o", tmp_path / "o.wav", "--ref-audio", ref,
                                      "--save-voice", tmp_path / "o.wav"], "--output",
                                     "--save-voice"),
    }
    for case, (args, field, other) in cases.items():
        argv = [*args] if "-f" in args else [*args, "hello"]
        result = _say("-m", model_dir, *argv)
        assert result.exit_code == 2, (case, result.output)
        assert f"{field}: " in result.output and f"is also {other}" in result.output, (
            case, result.output)
        assert "Traceback" not in result.output
    edit = CliRunner().invoke(cli, ["edit", "x", "-m", str(model_dir), "-o", str(ref),
                                    "--ref-audio", str(ref), "--ref-text", "r",
                                    "--segment", "0:1"], obj={})
    assert edit.exit_code == 2 and "is also --ref-audio" in edit.output, edit.output
    assert loads == []
    assert ref.read_bytes() == ref_bytes and text.read_text() == "Some words."
    assert (tmp_path / "v.safetensors").read_bytes() == voice_bytes


@pytest.mark.parametrize("name", ["out.wav/", "new.flac/", "out.wav//"])
def test_an_output_ending_with_a_slash_is_a_folder_not_a_file(model, tmp_path, name):
    model_dir, loads = model
    result = _say("-m", model_dir, "-o", f"{tmp_path}/{name}", "hello")
    assert result.exit_code == 2 and "ends with a slash" in result.output, result.output
    assert loads == [] and not (tmp_path / name.rstrip("/")).exists()


def test_random_model_refuses_a_directory_holding_other_files(fake_plugin, tmp_path,
                                                             monkeypatch):
    """A rerun into the same directory rewrites it; a directory holding anything else (your
    files, another model: two checkpoints in one model directory) is refused, untouched, and
    an empty name is not the current directory."""
    def write(directory):
        return CliRunner().invoke(cli, ["random-model", "fake/tiny", str(directory)], obj={})

    assert write(tmp_path / "m").exit_code == 0
    written = sorted(p.name for p in (tmp_path / "m").iterdir())
    assert write(tmp_path / "m").exit_code == 0  # a rerun
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == written
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    result = write(tmp_path / "mine")
    assert result.exit_code == 2 and "holds files this model does not write (notes.txt)" in \
        result.output, result.output
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]
    monkeypatch.chdir(tmp_path / "mine")
    result = write("")
    assert result.exit_code == 2 and "DIRECTORY: is empty" in result.output, result.output
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".random-model")] == []
