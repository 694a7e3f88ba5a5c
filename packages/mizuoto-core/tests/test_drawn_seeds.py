"""A request's seed, left unset, is drawn in one place on every path (``say``, ``say
--stream``, a batch line, long-form, HTTP): the engine's plan, through the speech service. It
is reported as drawn (``seed=N (drawn)``, ``applied.seed_drawn``), and sent back it gives the
same audio, reported as given."""

from __future__ import annotations

import json
import re
import secrets

import pytest
import soundfile as sf
from click.testing import CliRunner

from mizuoto.cli import cli

pytest.importorskip("mizuoto_example", reason="the example plugin's toy engine speaks")

TEXT = "Hum this sentence. " * 12


def _run(*args):
    return CliRunner().invoke(cli, list(args), obj={}, catch_exceptions=False)


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("toy") / "toy"
    assert _run("--quiet", "random-model", "toy/tiny", str(directory)).exit_code == 0
    return directory


@pytest.fixture
def draws(monkeypatch):
    """Every seed drawn, as the one place that draws them draws it."""
    drawn = []
    draw = secrets.randbelow

    def counted(limit):
        drawn.append(draw(limit))
        return drawn[-1]

    monkeypatch.setattr(secrets, "randbelow", counted)
    return drawn


def _reported_seed(output: str) -> tuple[int, bool]:
    match = re.search(r"seed=(\d+)( \(drawn\))?", output)
    assert match, output
    return int(match.group(1)), match.group(2) is not None


@pytest.mark.parametrize("how", [[], ["--stream"], ["--section-chars", "60", "-f"]],
                         ids=["whole", "stream", "long-form"])
def test_say_draws_the_seed_once_and_the_drawn_seed_gives_the_same_file(
        toy_model, tmp_path, draws, how):
    words = [TEXT]
    if "-f" in how:
        (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
        words = [str(tmp_path / "text.txt")]
    said = _run("say", "-m", str(toy_model), "-o", str(tmp_path / "drawn.wav"), *how, *words)
    assert said.exit_code == 0, said.output
    seed, drawn = _reported_seed(said.output)
    assert drawn and draws == [seed]  # one draw, also for a text of several sections
    if "-f" in how:
        assert re.search(r"^([3-9]|\d\d+) sections", said.output, re.M), said.output
    again = _run("say", "-m", str(toy_model), "-o", str(tmp_path / "given.wav"),
                 "--seed", str(seed), *how, *words)
    assert again.exit_code == 0, again.output
    assert _reported_seed(again.output) == (seed, False) and draws == [seed]
    given, drawn_audio = sf.read(tmp_path / "given.wav")[0], sf.read(tmp_path / "drawn.wav")[0]
    assert (given == drawn_audio).all()
    other = _run("say", "-m", str(toy_model), "-o", str(tmp_path / "other.wav"),
                 "--seed", str((seed + 1) % 2**32), *how, *words)
    assert other.exit_code == 0, other.output
    other_audio = sf.read(tmp_path / "other.wav")[0]
    assert other_audio.shape != given.shape or (other_audio != given).any()  # seeds matter


def test_a_batch_line_reports_its_drawn_seed_and_gives_the_same_audio_with_it(
        toy_model, tmp_path, draws):
    lines = tmp_path / "lines.jsonl"
    lines.write_text(json.dumps({"id": "a", "text": TEXT}) + "\n", encoding="utf-8")
    assert _run("batch", str(lines), "-m", str(toy_model), "-o", str(tmp_path / "drawn")
                ).exit_code == 0
    [record] = map(json.loads, (tmp_path / "drawn" / "manifest.jsonl").read_text().splitlines())
    seed = record["applied"]["seed"]
    assert record["applied"]["seed_drawn"] and draws == [seed]
    lines.write_text(json.dumps({"id": "a", "text": TEXT, "seed": seed}) + "\n",
                     encoding="utf-8")
    assert _run("batch", str(lines), "-m", str(toy_model), "-o", str(tmp_path / "given")
                ).exit_code == 0
    [again] = map(json.loads, (tmp_path / "given" / "manifest.jsonl").read_text().splitlines())
    assert (again["applied"]["seed"], again["applied"]["seed_drawn"]) == (seed, False)
    assert again["sha256"] == record["sha256"] and draws == [seed]


def test_long_form_in_python_reports_the_drawn_seed_and_gives_the_same_file_with_it(
        toy_model, tmp_path, draws):
    import mizuoto
    from mizuoto.longform import synthesize_to

    engine = mizuoto.load(toy_model)
    drawn = synthesize_to(engine, tmp_path / "drawn.wav", mizuoto.SynthesisRequest(TEXT),
                          max_chars=60)
    assert drawn.sections >= 3 and drawn.applied.seed_drawn
    assert draws == [drawn.applied.seed]
    given = synthesize_to(engine, tmp_path / "given.wav",
                          mizuoto.SynthesisRequest(TEXT, seed=drawn.applied.seed), max_chars=60)
    assert not given.applied.seed_drawn and given.applied.seed == drawn.applied.seed
    assert (tmp_path / "drawn.wav").read_bytes() == (tmp_path / "given.wav").read_bytes()


def test_http_reports_the_drawn_seed_and_gives_the_same_audio_with_it(toy_model, draws):
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from mizuoto.serve import ServeConfig, serve_in_thread

    with serve_in_thread(ServeConfig(models={"toy": str(toy_model)})) as url:
        def speech(extension):
            body = {"model": "toy", "input": TEXT, "voice": "default",
                    "response_format": "wav", "mizuoto": {"stream": False, **extension}}
            response = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=60)
            assert response.status_code == 200, response.text
            return response

        drawn = speech({})
        seed = int(drawn.headers["x-mizuoto-seed"])
        assert draws == [seed]
        given = speech({"seed": seed})
        assert given.headers["x-mizuoto-seed"] == str(seed) and draws == [seed]
        assert given.content == drawn.content
