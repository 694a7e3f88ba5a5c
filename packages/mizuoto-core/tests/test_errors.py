"""Errors: messages that name the problem and the fix, and exit codes by kind."""

from __future__ import annotations

import pytest

from mizuoto import errors
from mizuoto.runtime.atomic import atomic_path
from mizuoto.runtime.seeds import resolve_seed


def test_invalid_request_names_field_problem_and_fix():
    error = errors.InvalidRequest("steps", "must be positive", "use 8 or more")
    assert str(error) == "steps: must be positive (use 8 or more)"
    assert (error.field, error.problem, error.fix) == ("steps", "must be positive", "use 8 or more")
    assert str(errors.InvalidRequest("text", "is empty")) == "text: is empty"
    assert isinstance(error, ValueError) and isinstance(error, errors.MizuotoError)
    assert issubclass(errors.InvalidAudio, errors.InvalidRequest)


def test_exit_codes_tell_kinds_apart():
    assert errors.MizuotoError.exit_code == 1
    assert errors.InvalidRequest.exit_code == errors.InvalidOption.exit_code == 2
    assert errors.VoiceMismatch.exit_code == 2
    for missing in (errors.EngineNotFound, errors.ModelNotFound, errors.ModelFilesMissing,
                    errors.CheckpointMismatch):
        assert missing.exit_code == 3
    assert errors.UnsupportedCapability.exit_code == 4


def test_model_files_missing_lists_files_and_hint():
    error = errors.ModelFilesMissing("/models/x", ["vocab.txt", "model.pt"], "download them")
    assert str(error) == "/models/x: missing vocab.txt, model.pt. download them"
    assert error.missing == ["vocab.txt", "model.pt"]


def test_checkpoint_mismatch_previews_long_key_lists():
    keys = [f"layers.{i}.weight" for i in range(10)]
    error = errors.CheckpointMismatch("model.pt", missing=keys, shapes=["w: (2,) != (3,)"])
    message = str(error)
    assert message.startswith("model.pt does not match the model configuration: missing keys: ")
    assert "layers.7.weight, … (2 more)" in message and "layers.8.weight" not in message
    assert "shape mismatches: w: (2,) != (3,)" in message
    assert "unexpected" not in message


def test_invalid_option_names_the_key():
    error = errors.InvalidOption("compute.device", "must be one of auto, cpu")
    assert error.key == "compute.device"
    assert str(error) == "option 'compute.device': must be one of auto, cpu"


def test_resolve_seed_keeps_the_callers_or_draws_one():
    assert resolve_seed(7) == (7, False)
    assert resolve_seed(0) == (0, False)
    drawn = {resolve_seed(None) for _ in range(8)}
    assert all(flag for _, flag in drawn)
    assert all(0 <= seed < 2**32 for seed, _ in drawn)
    assert len({seed for seed, _ in drawn}) > 1


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out" / "file.bin"
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"whole")
    assert target.read_bytes() == b"whole"
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("interrupted")
    assert target.read_bytes() == b"whole"
    assert [p.name for p in target.parent.iterdir()] == ["file.bin"]


def test_atomic_path_gives_the_file_ordinary_permissions(tmp_path):
    import os

    mask = os.umask(0o022)
    try:
        with atomic_path(tmp_path / "out.wav") as tmp:
            tmp.write_bytes(b"RIFF")
    finally:
        os.umask(mask)
    assert (tmp_path / "out.wav").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("error", [
    errors.InvalidRequest("params.speed", "must be positive", "use 1.0"),
    errors.InvalidAudio("reference", "is silent"),
    errors.InvalidOption("compute.device", "unknown"),
    errors.UnsupportedCapability("cannot design voices"),
    errors.EngineBusy("every slot is held", "close a stream"),
    errors.ModelFilesMissing("/models/x", ["vocab.txt"], "download them"),
    errors.EngineMismatch("/models/x", "voxcpm", ["f5tts"]),
    errors.NonFiniteAudio("f5tts vocoder", 1, 2, 30),
    errors.VoiceMismatch("built for another model"),
    errors.DiskFull("/out/a.wav"),
], ids=lambda error: type(error).__name__)
def test_errors_cross_processes_as_raised(error):
    """A Ray replica's error reaches the ingress pickled: same class, message and fields
    (unpicklable, Ray put a generic error in its place and the client got a 500)."""
    import pickle

    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert str(again) == str(error) and again.args == error.args
    assert vars(again) == vars(error)
    if isinstance(error, OSError):
        assert (again.errno, again.filename) == (error.errno, error.filename)
