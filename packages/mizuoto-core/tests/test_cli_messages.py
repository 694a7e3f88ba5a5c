"""What the command line says: CLI spellings (not API ones), what a rerun actually trained,
progress rates of resumed stages, and one log line per chunk streamed or batch line done."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from mizuoto import SynthesisRequest, TrainingResult
from mizuoto.cli import cli
from mizuoto.commands.toolkit import STREAMED, ProgressBars, ProgressLog
from mizuoto.commands.train import _trained
from mizuoto.contracts.progress import Progress


def _run(*args):
    return CliRunner().invoke(cli, list(args), obj={}, catch_exceptions=False)


@pytest.mark.parametrize("resumed_from, steps_done, said", [
    (None, 20, "Trained 20 steps"),
    (0, 20, "Trained 20 steps"),
    (12, 20, "Trained steps 13 to 20 (resumed after step 12)"),
    (20, 20, "Nothing to train: the run in runs/x already finished its 20 steps"),
])
def test_the_training_summary_says_what_this_run_trained(resumed_from, steps_done, said):
    result = TrainingResult(Path("runs/x"), steps_done, resumed_from)
    assert _trained(result) == said


def test_a_resumed_stage_counts_its_rate_from_where_it_resumed():
    bars = ProgressBars(io.StringIO())
    bars(Progress("section", 40, 50))
    bar = bars._bars["section"]
    # tqdm's rate is (n - initial) / elapsed: 40 sections done before this run are not
    # counted as made in the first instant ("91180.52it/s")
    assert bar.initial == 40 and bar.n == 40
    assert bar.format_dict["rate"] is None or bar.format_dict["rate"] < 1000
    bars(Progress("section", 41, 50))
    assert bar.n == 41 and bar.initial == 40
    bars.close()


def test_a_log_gets_one_info_line_per_streamed_chunk_and_batch_line(caplog):
    log = ProgressLog()
    with caplog.at_level(logging.INFO, logger="mizuoto"):
        log(Progress(STREAMED, 1, None, "0.16 s of audio written"))
        log(Progress(STREAMED, 2, None, "0.32 s of audio written"))
        log(Progress("lines", 1, 3, "a: 1.0 s of audio in 0.2 s"))
        log(Progress("sampling", 3, 10))  # inner stages stay out of an INFO log
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert messages == ["streamed chunk 1 (0.16 s of audio written)",
                        "streamed chunk 2 (0.32 s of audio written)",
                        "lines 1/3 done (a: 1.0 s of audio in 0.2 s)"]


@pytest.fixture
def toy_model(tmp_path):
    pytest.importorskip("mizuoto_example", reason="the example plugin (docs/examples) streams")
    assert _run("--quiet", "random-model", "toy/tiny", str(tmp_path / "toy")).exit_code == 0
    return tmp_path / "toy"


@pytest.mark.parametrize("suffix", [".wav", ".flac"])
def test_streaming_to_a_file_logs_each_chunk_written(toy_model, tmp_path, caplog, suffix):
    out = tmp_path / f"stream{suffix}"
    with caplog.at_level(logging.INFO, logger="mizuoto"):
        result = _run("say", "-m", str(toy_model), "--stream", "--seed", "1", "-o", str(out),
                      "Streaming to a file. In two sentences.")
    assert result.exit_code == 0, result.output
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("streamed")]
    assert lines and lines[0].startswith("streamed chunk 1 (")
    assert [int(line.split()[2]) for line in lines] == list(range(1, len(lines) + 1))
    assert all("s of audio written" in line for line in lines)


def test_a_batch_logs_each_line_it_writes(toy_model, tmp_path, caplog):
    lines = tmp_path / "lines.txt"
    lines.write_text("First line.\nSecond line.\n", encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="mizuoto"):
        result = _run("batch", str(lines), "-m", str(toy_model), "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    done = [r.getMessage() for r in caplog.records if r.getMessage().startswith("lines ")]
    assert len(done) == 2 and done[0].startswith("lines 1/2 done (")
    assert all("s of audio in" in line for line in done)
    with caplog.at_level(logging.INFO, logger="mizuoto"):
        caplog.clear()
        _run("batch", str(lines), "-m", str(toy_model), "-o", str(tmp_path / "out"))
    rerun = [r.getMessage() for r in caplog.records if r.getMessage().startswith("lines ")]
    assert len(rerun) == 2 and all("already done" in line for line in rerun)


def test_an_interrupted_long_form_run_names_the_cli_flag(fake_plugin, tmp_path):
    from mizuoto import load
    from mizuoto.longform import synthesize_to

    (tmp_path / "fake.json").write_text("{}")
    text = tmp_path / "story.txt"
    text.write_text("One sentence here. " * 20, encoding="utf-8")
    out = tmp_path / "story.wav"
    engine = load(tmp_path, engine="fake")
    partial = synthesize_to(engine, out, SynthesisRequest("x", seed=1), text_file=text,
                            max_chars=60, stop_after=1)
    assert not partial.complete
    result = _run("say", "-m", str(tmp_path), "-f", str(text), "-o", str(out), "--seed", "1",
                  "--section-chars", "60")
    assert result.exit_code == 2
    assert "pass --resume to continue it" in result.output
    assert "resume=True" not in result.output
    # the Python API names its own spelling
    with pytest.raises(Exception, match=r"pass resume=True to continue it"):
        synthesize_to(engine, out, SynthesisRequest("x", seed=1), text_file=text, max_chars=60)


@pytest.mark.parametrize("asked, model", [("voxcpm", "f5"), ("f5tts", "vox")])
def test_an_engine_named_for_another_engines_model_is_refused_naming_both(tmp_path, asked,
                                                                         model):
    """``-e voxcpm -m <an F5 model>`` used to fail on the file VoxCPM expects (exit 3 after a
    file-not-found): it names both engines, before any weights load."""
    pytest.importorskip("mizuoto_f5tts")
    pytest.importorskip("mizuoto_voxcpm")
    from mizuoto.errors import EngineMismatch
    from mizuoto.loading import resolve_engine
    from mizuoto_f5tts.fixtures import write_random_model_dir

    if model == "f5":
        write_random_model_dir(tmp_path / model, "v1_base", size="tiny")
    else:  # what VoxCPM recognizes a directory by (its config and VAE), without weights
        from mizuoto_voxcpm.engine import VAE_FILES

        (tmp_path / model).mkdir()
        (tmp_path / model / "config.json").write_text('{"lm_config": {}}')
        (tmp_path / model / VAE_FILES[0]).write_text("")
    owner = {"f5": "f5tts", "vox": "voxcpm"}[model]
    with pytest.raises(EngineMismatch, match=f"is a {owner} model, not a {asked} one"):
        resolve_engine(tmp_path / model, engine=asked)
    result = CliRunner().invoke(cli, ["say", "hi", "-m", str(tmp_path / model), "-e", asked,
                                      "-o", str(tmp_path / "x.wav")], obj={})
    assert result.exit_code == 3 and f"pass -e {owner}" in result.output, result.output
    assert "Traceback" not in result.output
