"""Batch synthesis: reading JSONL/CSV/TSV/text inputs, per-line errors, manifest, resume, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import mizuoto
from mizuoto import Applied, Audio, Capability, Engine, ModelInfo, SynthesisResult
from mizuoto.batch import BatchJob, build_request, read_lines, run_batch
from mizuoto.cli import cli
from mizuoto.errors import InvalidRequest


class ToneEngine(Engine):
    """Seeded noise as long as the text; ``params.gain`` (a float) is its only setting."""

    name = "tone"

    def __init__(self) -> None:
        self.calls = 0
        self._info = ModelInfo("tone", "tone-model", "v0", 8000, "float32", "cpu",
                               frozenset({Capability.ZERO_SHOT}), fingerprint="f" * 64)

    @classmethod
    def load(cls, model_dir, *, options=None, model_id=None, progress=None):
        return cls()

    @property
    def info(self):
        return self._info

    def synthesize(self, request, *, progress=None):
        self.calls += 1
        params = dict(request.params)
        if set(params) - {"gain"}:
            raise InvalidRequest(f"params.{sorted(set(params) - {'gain'})[0]}",
                                 "is not a known setting")
        if request.reference is not None:
            from mizuoto.nn.dsp.audio_io import read_audio

            read_audio(request.reference.audio, field="reference.audio")
        seed = 0 if request.seed is None else request.seed
        noise = torch.randn(20 * len(request.text), generator=torch.Generator().manual_seed(seed))
        samples = params.get("gain", 0.2) * noise
        applied = Applied("tone", "tone-model", seed, request.seed is None, "float32", "cpu")
        return SynthesisResult(Audio(samples, 8000), applied)


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


GOOD = [{"id": "a", "text": "First line.", "seed": 1},
        {"id": "b", "text": "Second line.", "seed": 2, "params": {"gain": 0.1}}]
BAD = [{"id": "no-audio", "text": "Hi.", "reference": "missing.wav", "seed": 3},
       {"id": "empty", "text": "  ", "seed": 4},
       {"id": "no-voice", "text": "Hi.", "voice": "nowhere.safetensors"},
       {"id": "bad-param", "text": "Hi.", "params": {"loudness": 3}},
       {"id": "bad seed", "text": "Hi."}]


def _manifest(out):
    return {r["id"]: r for r in map(json.loads, (out / "manifest.jsonl").read_text().splitlines())}


# -- reading inputs ---------------------------------------------------------------------------

def test_jsonl_csv_tsv_and_text_inputs_give_the_same_requests(tmp_path):
    _write_jsonl(tmp_path / "in.jsonl", GOOD)
    (tmp_path / "in.csv").write_text('id,text,seed,params\na,First line.,1,\n'
                                     'b,Second line.,2,"{""gain"": 0.1}"\n', encoding="utf-8")
    (tmp_path / "in.tsv").write_text('id\ttext\tseed\tparams\na\tFirst line.\t1\t\n'
                                     'b\tSecond line.\t2\t{"gain": 0.1}\n', encoding="utf-8")
    requests = {suffix: [build_request(line, base=tmp_path)
                         for line in read_lines(tmp_path / f"in.{suffix}")]
                for suffix in ("jsonl", "csv", "tsv")}
    assert requests["jsonl"] == requests["csv"] == requests["tsv"]
    assert requests["csv"][1].params == {"gain": 0.1} and requests["csv"][1].seed == 2
    (tmp_path / "in.txt").write_text("First line.\n\nSecond line.\n", encoding="utf-8")
    lines = list(read_lines(tmp_path / "in.txt"))
    assert [(line.number, line.id) for line in lines] == [(1, "000001"), (3, "000003")]


def test_unreadable_lines_and_bad_ids_are_errors_not_exceptions(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": "a", "text": "x"}\nnot json\n[1]\n{"id": "a", "text": "y"}\n'
                    '{"id": "../up", "text": "z"}\n', encoding="utf-8")
    lines = list(read_lines(path))
    assert [line.error is None for line in lines] == [True, False, False, False, False]
    assert "line 1" in str(lines[3].error) and lines[4].error.field == "id"


def test_defaults_apply_where_a_line_is_silent(tmp_path):
    line = next(read_lines(_write_jsonl(tmp_path / "in.jsonl", [
        {"text": "x", "params": {"gain": 0.5}}])))
    request = build_request(line, base=tmp_path, defaults={"steps": 3, "params": {"gain": 0.1,
                                                                                  "other": 1}})
    assert request.steps == 3 and request.params == {"gain": 0.5, "other": 1}
    with pytest.raises(InvalidRequest, match="speed"):
        build_request(next(read_lines(_write_jsonl(tmp_path / "x.jsonl", [
            {"text": "x", "speed": 2}]))), base=tmp_path)


# -- running ----------------------------------------------------------------------------------

def test_good_lines_are_written_and_bad_ones_recorded(tmp_path):
    engine = ToneEngine()
    job = BatchJob(_write_jsonl(tmp_path / "in.jsonl", GOOD + BAD), tmp_path / "out")
    summary = run_batch(job, engine=engine)
    assert (summary.ok, summary.skipped, summary.failed) == (2, 0, 5)
    records = _manifest(tmp_path / "out")
    assert list(records) == [row["id"] for row in GOOD + BAD]  # input order, one each
    assert {r["path"] for r in records.values() if r["status"] == "ok"} == {"a.wav", "b.wav"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.wav", "b.wav",
                                                                     "manifest.jsonl"]
    fields = {key: records[key]["error"]["field"] for key in records if key not in "ab"}
    assert fields == {"no-audio": "reference.audio", "empty": "text", "no-voice": "voice",
                      "bad-param": "params.loudness", "bad seed": "id"}
    assert records["a"]["applied"]["seed"] == 1 and records["a"]["hash"]


def test_a_rerun_skips_written_lines_and_redoes_changed_ones(tmp_path):
    engine = ToneEngine()
    rows = [dict(row) for row in GOOD]
    job = BatchJob(_write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out")
    run_batch(job, engine=engine)
    first = (tmp_path / "out" / "a.wav").read_bytes()
    rows[1]["seed"] = 22
    _write_jsonl(tmp_path / "in.jsonl", rows)
    calls = engine.calls
    summary = run_batch(job, engine=engine)
    assert (summary.ok, summary.skipped) == (1, 1) and engine.calls == calls + 1
    assert (tmp_path / "out" / "a.wav").read_bytes() == first
    records = _manifest(tmp_path / "out")
    assert records["a"]["resumed"] and records["b"]["applied"]["seed"] == 22


def test_a_repeated_id_is_an_error_on_its_later_line_only(tmp_path):
    job = BatchJob(_write_jsonl(tmp_path / "in.jsonl", [*GOOD, {"id": "a", "text": "Again."}]),
                   tmp_path / "out")
    summary = run_batch(job, engine=ToneEngine())
    assert (summary.ok, summary.failed) == (2, 1)
    records = [json.loads(raw) for raw in (tmp_path / "out" / "manifest.jsonl").open()]
    assert [(r["id"], r["status"]) for r in records] == [("a", "ok"), ("b", "ok"), ("a", "error")]
    assert run_batch(job, engine=ToneEngine()).skipped == 2


def test_a_killed_batch_keeps_the_lines_it_finished(tmp_path):
    engine = ToneEngine()
    job = BatchJob(_write_jsonl(tmp_path / "in.jsonl", GOOD), tmp_path / "out")
    run_batch(job, engine=engine)
    # a kill during the next run: the manifest ends in half a record
    with open(tmp_path / "out" / "manifest.jsonl", "a") as manifest:
        manifest.write('{"id": "b", "sta')
    summary = run_batch(job, engine=engine)
    assert summary.skipped == 2


# -- command line -----------------------------------------------------------------------------

@pytest.fixture
def tone_model(no_plugins, tmp_path):
    import types

    from mizuoto import registry

    module = types.ModuleType("tone_plugin")

    @mizuoto.hookimpl
    def register_engines(register):
        register(ToneEngine)

    module.register_engines = register_engines
    no_plugins.register(module, name="tone_plugin")
    registry.clear_cache()
    (tmp_path / "model").mkdir()
    return tmp_path / "model"


def test_cli_batch_exit_code_says_whether_a_line_failed(tone_model, tmp_path):
    good = _write_jsonl(tmp_path / "good.jsonl", GOOD)
    args = ["batch", "-e", "tone", "-m", str(tone_model), "-o", str(tmp_path / "out")]
    result = CliRunner().invoke(cli, [*args, str(good)], obj={})
    assert result.exit_code == 0, result.output
    assert "2 written" in result.output
    mixed = _write_jsonl(tmp_path / "mixed.jsonl", GOOD + BAD)
    result = CliRunner().invoke(cli, [*args, "--format", "flac", str(mixed)], obj={})
    assert result.exit_code == 5 and "5 failed" in result.output
    assert (tmp_path / "out" / "a.flac").is_file()


def test_a_local_ray_instance_keeps_its_files_outside_the_virtualenv(monkeypatch):
    # nox sets TMPDIR inside its virtualenv; Ray's workers refuse that and die at start
    import sys
    import tempfile

    from mizuoto.batch import ray as ray_backend

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(Path(sys.prefix) / "tmp"))
    chosen = ray_backend._local_temp_dir()["_temp_dir"]
    assert not Path(chosen).resolve().is_relative_to(Path(sys.prefix).resolve())
    monkeypatch.setattr(tempfile, "gettempdir", lambda: "/tmp")
    assert ray_backend._local_temp_dir() == {}  # outside it: Ray's default is fine
