"""A full or failing disk is named ("No space left on device: PATH", exit 1), never a traceback,
and leaves nothing partial: issue 33, 3.

The writers hide the errno in their own exception types (libsndfile's "System error.",
safetensors' ``SafetensorError``); the tests make them fail as they do on a full disk."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile
import torch
from click.testing import CliRunner
from test_batch import ToneEngine, _write_jsonl

from mizuoto import Audio
from mizuoto.batch import BatchJob, run_batch
from mizuoto.cli import cli
from mizuoto.errors import DiskFull
from mizuoto.runtime.atomic import atomic_directory, save_safetensors, storage_error

STORAGE = [errno.ENOSPC, errno.EDQUOT, errno.EIO]


def _libsndfile_failure(code: int) -> soundfile.LibsndfileError:
    soundfile._ffi.errno = code  # what the failed write(2) leaves behind
    return soundfile.LibsndfileError(2)  # SFE_SYSTEM: "System error."


def _safetensors_failure(code: int) -> Exception:
    from safetensors import SafetensorError

    return SafetensorError(f"Error while serializing: I/O error: {os.strerror(code)} "
                           f"(os error {code})")


@pytest.fixture
def full_audio_disk(monkeypatch):
    """Every audio write fails as libsndfile fails on a full disk."""
    def write(self, data):
        raise _libsndfile_failure(errno.ENOSPC)

    monkeypatch.setattr(soundfile.SoundFile, "write", write)


@pytest.mark.parametrize("code", STORAGE)
@pytest.mark.parametrize("make", [lambda c: OSError(c, os.strerror(c)), _libsndfile_failure,
                                  _safetensors_failure])
def test_each_writers_failure_of_the_disk_is_named(make, code, tmp_path):
    named = storage_error(make(code), tmp_path / "x.wav")
    assert isinstance(named, DiskFull) and isinstance(named, OSError) and named.errno == code
    reason = "Input/output error" if code == errno.EIO else "No space left on device"
    assert str(named) == f"{reason}: {tmp_path / 'x.wav'}"


def test_other_failures_are_not_taken_for_a_full_disk(tmp_path):
    for exc in (OSError(errno.EACCES, "Permission denied"), ValueError("x"),
                _safetensors_failure(errno.EACCES), soundfile.LibsndfileError(1)):
        assert storage_error(exc, tmp_path / "x") is None
    soundfile._ffi.errno = 0  # libsndfile's "System error." on a disk with room: not ENOSPC
    assert storage_error(soundfile.LibsndfileError(2), tmp_path / "x") is None
    wrapped = RuntimeError("writer failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert isinstance(storage_error(wrapped, tmp_path / "x"), DiskFull)


def test_audio_save_on_a_full_disk_is_named_and_leaves_nothing(full_audio_disk, tmp_path):
    with pytest.raises(DiskFull, match=f"No space left on device: {tmp_path / 'a.wav'}$"):
        Audio(torch.zeros(800), 8000).save(tmp_path / "a.wav")
    assert list(tmp_path.iterdir()) == []


def test_safetensors_on_a_full_disk_is_named_and_leaves_nothing(monkeypatch, tmp_path):
    import safetensors.torch

    def save_file(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise _safetensors_failure(errno.ENOSPC)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    with pytest.raises(DiskFull, match="No space left on device: .*voice.safetensors"):
        save_safetensors({"a": torch.zeros(3)}, tmp_path / "voice.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_an_export_directory_on_a_full_disk_is_named_and_the_old_one_stays(tmp_path):
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "old.txt").write_text("old")
    with pytest.raises(DiskFull, match="No space left on device: .*export"):
        with atomic_directory(tmp_path / "export") as build:
            (build / "model.safetensors").write_bytes(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert [p.name for p in tmp_path.iterdir()] == ["export"]
    assert (tmp_path / "export" / "old.txt").read_text() == "old"


@pytest.mark.parametrize("stream", [False, True])
def test_say_onto_a_full_disk_exits_1_naming_the_file(fake_plugin, full_audio_disk, tmp_path,
                                                      monkeypatch, stream):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "fake.json").write_text("{}")
    out = tmp_path / "out" / "a.wav"
    out.parent.mkdir()
    if stream:  # the fake engine, given a stream of two chunks
        import attrs
        from conftest import FakeEngine

        from mizuoto.contracts import AudioChunk, Capability

        def chunks(self, request, *, progress=None):
            whole = self.synthesize(request)
            yield AudioChunk(whole.audio, 0, is_last=False)
            yield AudioChunk(whole.audio, 1, is_last=True, applied=whole.applied)

        info = FakeEngine.info.fget
        monkeypatch.setattr(FakeEngine, "stream", chunks)
        monkeypatch.setattr(FakeEngine, "info", property(lambda self: attrs.evolve(
            info(self), capabilities=info(self).capabilities | {Capability.STREAM})))
    result = CliRunner().invoke(cli, ["say", "-m", str(tmp_path / "model"), "-o", str(out),
                                      *(["--stream"] if stream else []), "hello"], obj={})
    assert result.exit_code == 1, result.output
    assert f"Error: No space left on device: {out}" in result.output
    assert "Traceback" not in result.output and list(out.parent.iterdir()) == []


def test_a_batch_line_on_a_full_disk_records_the_named_error(full_audio_disk, tmp_path):
    path = _write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "Hello.", "seed": 1}])
    summary = run_batch(BatchJob(path, tmp_path / "out"), engine=ToneEngine())
    assert summary.failed == 1
    record = json.loads((tmp_path / "out" / "manifest.jsonl").read_text().splitlines()[0])
    assert record["error"] == {"type": "DiskFull", "message": "No space left on device: "
                               f"{tmp_path / 'out' / 'a.wav'}"}
    assert not (tmp_path / "out" / "a.wav").exists()
    assert [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".a.")] == []


_ON_TMPFS = """
import sys, torch
from mizuoto import Audio
from mizuoto.errors import DiskFull
from mizuoto.runtime.atomic import save_safetensors
for save in (lambda: Audio(torch.zeros(240000), 24000).save(sys.argv[1] + "/a.wav"),
             lambda: save_safetensors({"a": torch.zeros(100000)}, sys.argv[1] + "/v.safetensors")):
    try:
        save()
    except DiskFull as exc:
        print(exc)
"""


@pytest.mark.fuzz_only  # a second Python importing torch: ~15 s on CI's two cores
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a private tmpfs needs root and unshare(1)")
def test_a_real_full_tmpfs_is_named_for_audio_and_safetensors(tmp_path):
    """The real writers on a real 64 KiB file system, in a private mount namespace."""
    (tmp_path / "mnt").mkdir()
    mounted = subprocess.run(
        ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$0" && "$1" -c "$2" '
         '"$0" && ls -A "$0"', str(tmp_path / "mnt"), sys.executable, _ON_TMPFS],
        capture_output=True, text=True, timeout=120)
    if "mount" in mounted.stderr and mounted.returncode:
        pytest.skip(f"no private tmpfs here: {mounted.stderr.strip()}")
    assert mounted.stdout.splitlines() == [
        f"No space left on device: {tmp_path / 'mnt' / 'a.wav'}",
        f"No space left on device: {tmp_path / 'mnt' / 'v.safetensors'}"], mounted.stderr


def test_a_writer_threads_full_disk_is_one_line_not_a_traceback(fake_plugin, monkeypatch,
                                                                capsys):
    """As TensorBoard's event writer thread meets a full disk during `mizuoto train`."""
    import threading

    passed_on = []
    monkeypatch.setattr(threading, "excepthook", lambda args: passed_on.append(args.exc_value))
    CliRunner().invoke(cli, ["plugins"], obj={})  # any command installs the hook

    def write_events():
        raise OSError(errno.ENOSPC, "No space left on device", "/runs/a/tensorboard/events")

    for target in (write_events, lambda: (_ for _ in ()).throw(ValueError("not the disk"))):
        thread = threading.Thread(target=target, name="event-writer")
        thread.start()
        thread.join()
    err = capsys.readouterr().err
    assert "Error: No space left on device: /runs/a/tensorboard/events\n" in err
    assert "Traceback" not in err  # any other failure goes to the hook there was before
    assert [str(exc) for exc in passed_on] == ["not the disk"]
