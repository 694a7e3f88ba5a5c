"""The ``mizuoto`` command: listing, synthesis, errors and exit codes (with the in-test plugin)."""

from __future__ import annotations

import pytest
import soundfile as sf
from click.testing import CliRunner

from mizuoto.cli import cli


def _run(*args):
    return CliRunner().invoke(cli, list(args), obj={}, catch_exceptions=False)


def test_plugins_without_any_plugin_says_so(no_plugins):
    result = _run("plugins")
    assert result.exit_code == 0
    assert "No plugins installed" in result.output


def test_plugins_lists_hooks_and_engines(fake_plugin):
    result = _run("plugins")
    assert result.exit_code == 0
    assert "fake_plugin" in result.output
    assert "provides: " in result.output and "engines: fake" in result.output
    assert "register_" not in result.output and "random-init models" in result.output


def test_models_lists_the_catalog_with_download_state(fake_plugin, tmp_path, monkeypatch):
    monkeypatch.setenv("MIZUOTO_HOME", str(tmp_path))
    result = _run("models")
    assert result.exit_code == 0
    assert "fake/base" in result.output and "0/2 files" in result.output


def test_say_writes_audio_and_reports_the_seed(fake_plugin, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "fake.json").write_text("{}")
    out = tmp_path / "out.wav"
    result = _run("say", "-m", str(tmp_path / "model"), "-o", str(out), "--seed", "5", "hello")
    assert result.exit_code == 0, result.output
    assert "seed=5" in result.output
    assert sf.info(str(out)).samplerate == 8000 and sf.info(str(out)).frames == 8000


def test_say_reads_the_text_from_a_file(fake_plugin, tmp_path):
    (tmp_path / "fake.json").write_text("{}")
    (tmp_path / "text.txt").write_text("from a file", encoding="utf-8")
    result = _run("say", "-m", str(tmp_path), "-f", str(tmp_path / "text.txt"),
                  "-o", str(tmp_path / "out.flac"))
    assert result.exit_code == 0, result.output
    assert "(drawn)" in result.output  # no --seed: the drawn one is reported
    assert sf.info(str(tmp_path / "out.flac")).format == "FLAC"


@pytest.mark.parametrize("long_form", [False, True])
def test_a_text_file_that_is_not_utf8_is_named_with_its_byte_offset(fake_plugin, tmp_path,
                                                                     long_form):
    (tmp_path / "fake.json").write_text("{}")
    path = tmp_path / "latin1.txt"
    path.write_bytes("Un café.".encode("latin-1"))
    args = ["say", "-m", str(tmp_path), "-f", str(path), "-o", str(tmp_path / "out.wav")]
    result = _run(*args, *(["--section-chars", "100"] if long_form else []))
    assert result.exit_code == 2, result.output
    assert "--text-file" in result.output and "byte 6 (e9)" in result.output
    assert "Traceback" not in result.output


def test_empty_text_is_a_usage_error_without_traceback(fake_plugin, tmp_path):
    (tmp_path / "fake.json").write_text("{}")
    result = _run("say", "-m", str(tmp_path), "-o", str(tmp_path / "x.wav"), "")
    assert result.exit_code == 2
    assert "TEXT: is empty" in result.output and "Traceback" not in result.output


def test_unknown_param_and_option_are_named(fake_plugin, tmp_path):
    (tmp_path / "fake.json").write_text("{}")
    out = str(tmp_path / "x.wav")
    result = _run("say", "-m", str(tmp_path), "-o", out, "--param", "pitch=2", "hi")
    assert result.exit_code == 2 and "--param pitch: " in result.output
    result = _run("say", "-m", str(tmp_path), "-o", out, "--option", "compute.speed=2", "hi")
    assert result.exit_code == 2 and "compute.speed" in result.output
    result = _run("say", "-m", str(tmp_path), "-o", out, "--option", "engines.fake.level=-1", "hi")
    assert result.exit_code == 2 and "engines.fake" in result.output


def test_a_mistyped_param_or_a_silent_reference_fails_before_the_model_loads(
        fake_plugin, tmp_path, monkeypatch):
    import numpy as np
    import soundfile
    from conftest import FakeEngine

    (tmp_path / "fake.json").write_text("{}")
    monkeypatch.setattr(FakeEngine, "load", classmethod(lambda cls, *a, **k: pytest.fail(
        "the model loaded")))
    out = str(tmp_path / "x.wav")
    result = _run("say", "-m", str(tmp_path), "-o", out, "--param", "sped=2", "hi")
    assert result.exit_code == 2, result.output
    assert "--param sped: is not a known setting (did you mean speed?" in result.output
    silent, quiet = tmp_path / "silent.wav", tmp_path / "quiet.wav"
    soundfile.write(silent, np.full(16000, 3e-5, np.float32), 16000, subtype="FLOAT")  # -90 dB
    result = _run("say", "-m", str(tmp_path), "-o", out, "--ref-audio", str(silent), "hi")
    assert result.exit_code == 2 and "--ref-audio: is silent (peak 3e-05" in result.output
    # quiet is not silent: a -40 dBFS recording passes the check and reaches the load
    soundfile.write(quiet, np.full(16000, 0.01, np.float32), 16000)
    result = _run("edit", "-m", str(tmp_path), "--ref-audio", str(quiet), "--ref-text", "Hi.",
                  "--segment", "0:0.1", "--param", "sped=2", "-o", out, "hi")
    assert result.exit_code == 2, result.output
    assert "--param sped: is not a known setting (did you mean speed?" in result.output
    with pytest.raises(pytest.fail.Exception, match="the model loaded"):
        _run("say", "-m", str(tmp_path), "-o", out, "--ref-audio", str(quiet), "hi")


def test_unknown_model_and_missing_capability_exit_codes(fake_plugin, tmp_path):
    out = str(tmp_path / "x.wav")
    result = _run("say", "-m", "nope/none", "-o", out, "hi")
    assert result.exit_code == 3 and "known ids: fake/base" in result.output
    (tmp_path / "fake.json").write_text("{}")
    result = _run("say", "-m", str(tmp_path), "-o", out, "--stream", "hi")
    assert result.exit_code == 4 and "does not support stream" in result.output


def test_random_model_writes_the_fixture(fake_plugin, tmp_path):
    result = _run("random-model", "fake/tiny", str(tmp_path / "m"))
    assert result.exit_code == 0
    assert (tmp_path / "m" / "fake.json").is_file()
    assert "noise, not speech" in result.output
    assert _run("random-model", "fake/other", str(tmp_path / "n")).exit_code == 2


def test_random_model_help_lists_the_fixtures(fake_plugin):
    result = _run("random-model", "--help")
    assert result.exit_code == 0
    assert "Random-init models:" in result.output and "fake/tiny" in result.output
    assert "contract fixture" not in result.output


def test_random_model_without_engines_names_the_package(no_plugins, tmp_path):
    result = _run("random-model", "f5tts/tiny-v1-base", str(tmp_path / "m"))
    assert result.exit_code == 2
    assert "no engine is installed" in result.output
    assert "pip install ./packages/mizuoto-f5tts" in result.output


def test_no_noise_warning_for_a_fixture_that_is_not_random(fake_plugin, monkeypatch, tmp_path):
    import functools

    import attrs

    from mizuoto import registry

    fixtures = dict(registry.random_models())
    fixtures["fake/tiny"] = attrs.evolve(fixtures["fake/tiny"], random_init=False)
    monkeypatch.setattr(registry, "random_models", functools.cache(lambda: fixtures))
    result = _run("random-model", "fake/tiny", str(tmp_path / "model"))
    assert result.exit_code == 0 and "random weights" not in result.output


def test_train_without_a_trainer_for_the_engine(fake_plugin, tmp_path):
    result = _run("train", "-e", "voxless", "-m", "x", "--data", str(tmp_path),
                  "--output", str(tmp_path / "run"))
    assert result.exit_code == 3 and "no trainer" in result.output
    result = _run("train", "-e", "fake", "--method", "lora", "-m", "x", "--data", str(tmp_path),
                  "--output", str(tmp_path / "run"))
    assert result.exit_code == 2 and "method" in result.output


def test_train_passes_the_device_and_mixed_precision(no_plugins, tmp_path):
    """``--option compute.*`` and ``--mixed-precision`` reach the trainer's config, and the
    resume line repeats them; bad values exit 2 naming the key."""
    from conftest import FakeTrainer, make_plugin

    from mizuoto import TrainingResult, registry

    seen = []

    class RecordingTrainer(FakeTrainer):
        graceful_stop = True

        def train(self, run, *, progress=None):
            seen.append(run)
            return TrainingResult(run.output_dir, 1, None, interrupted="SIGINT")

    no_plugins.register(make_plugin(trainers=(RecordingTrainer,)), name="fake_plugin")
    registry.clear_cache()
    result = _run("train", "-e", "fake", "-m", "fake/base", "--data", str(tmp_path),
                  "--output", str(tmp_path / "run"), "--option", "compute.device=cpu",
                  "--mixed-precision", "bf16")
    assert result.exit_code == 130
    assert seen[0].compute.device == "cpu" and seen[0].mixed_precision == "bf16"
    assert "--mixed-precision bf16 --option compute.device=cpu" in result.output
    result = _run("train", "-e", "fake", "-m", "fake/base", "--data", str(tmp_path),
                  "--output", str(tmp_path / "run"), "--option", "compute.device=tpu")
    assert result.exit_code == 2 and "compute.device" in result.output
    result = _run("train", "-e", "fake", "-m", "fake/base", "--data", str(tmp_path),
                  "--output", str(tmp_path / "run"), "--mixed-precision", "fp8")
    assert result.exit_code == 2 and "mixed-precision" in result.output


@pytest.mark.parametrize(("signal_name", "status"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_train_stopped_by_a_signal_says_how_to_resume(no_plugins, tmp_path, signal_name,
                                                      status):
    from conftest import FakeTrainer, make_plugin

    from mizuoto import TrainingResult, registry

    exported = []

    class StoppedTrainer(FakeTrainer):
        graceful_stop = True

        def train(self, run, *, progress=None):
            return TrainingResult(run.output_dir, 7, None, interrupted=signal_name)

        def export(self, run, destination):
            exported.append(destination)
            return destination

    no_plugins.register(make_plugin(trainers=(StoppedTrainer,)), name="fake_plugin")
    registry.clear_cache()
    data = tmp_path / "my data"
    data.mkdir()
    result = _run("train", "-e", "fake", "-m", "fake/base", "--data", str(data),
                  "--output", str(tmp_path / "run"), "--steps", "20", "--param", "note=x")
    assert result.exit_code == status and not exported
    assert f"Stopped by {signal_name} after step 7" in result.output
    assert f"saved in {tmp_path / 'run'}" in result.output
    assert (f"mizuoto train -e fake -m fake/base --data '{data}' --output "
            f"{tmp_path / 'run'} --steps 20 --param note=x") in result.output
