"""Batch synthesis: reading JSONL/CSV/TSV/text inputs, per-line errors, manifest, resume, CLI."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from stub_engines import StubEngine

import mizuoto
from mizuoto import Applied, Audio, Capability, SynthesisResult
from mizuoto.batch import BatchJob, build_request, read_lines, run_batch
from mizuoto.batch.items import count_lines
from mizuoto.batch.run import LOCK
from mizuoto.cli import cli
from mizuoto.contracts.placement import Placement
from mizuoto.errors import InvalidRequest
from mizuoto.identity import file_digest


class ToneEngine(StubEngine):
    """Seeded noise as long as the text; ``params.gain`` (a float) is its only setting. An
    API 1.0 plugin (it overrides ``synthesize``): batch runs old plugins as they were."""

    name = "tone"
    model_name = "tone-model"
    declared = frozenset({Capability.ZERO_SHOT})
    fingerprint = "f" * 64

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

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


def _first_run(tmp_path, engine):
    """GOOD written once into ``out``: the job, its rows and the bytes of ``a.wav``."""
    rows = [dict(row) for row in GOOD]
    job = BatchJob(_write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out")
    run_batch(job, engine=engine)
    return job, rows, (tmp_path / "out" / "a.wav").read_bytes()


def test_a_rerun_skips_written_lines_and_redoes_changed_ones(tmp_path):
    engine = ToneEngine()
    job, rows, first = _first_run(tmp_path, engine)
    rows[1]["seed"] = 22
    _write_jsonl(tmp_path / "in.jsonl", rows)
    calls = engine.calls
    summary = run_batch(job, engine=engine)
    assert (summary.ok, summary.skipped) == (1, 1) and engine.calls == calls + 1
    assert (tmp_path / "out" / "a.wav").read_bytes() == first
    records = _manifest(tmp_path / "out")
    assert records["a"]["resumed"] and records["b"]["applied"]["seed"] == 22



def test_a_fast_profile_does_not_resume_the_exact_paths_lines(tmp_path):
    """int8 samples are not the exact path's: lines written without the profile are made
    again with it; the exact path's identity has no fast key (older manifests still resume)."""
    from mizuoto.identity import model_identity

    engine = ToneEngine()
    job, rows, first = _first_run(tmp_path, engine)
    assert "fast" not in model_identity(engine)
    fast_engine = ToneEngine()
    # what an engine's load places with an inexact fast profile on (``engines.x.fast=int8``)
    fast_engine.placement = Placement(ToneEngine, torch.device("cpu"), torch.float32,
                                      settings={"fast": "int8", "fast_int8_linears": 12})
    assert fast_engine.placement.fast_profile
    assert model_identity(fast_engine)["fast"] == "int8"
    summary = run_batch(job, engine=fast_engine)
    assert (summary.ok, summary.skipped) == (len(rows), 0)
    assert fast_engine.calls == len(rows)
    again = run_batch(job, engine=fast_engine)  # the same profile resumes
    assert again.skipped == len(rows) and fast_engine.calls == len(rows)


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


@pytest.mark.parametrize("param", ["gain=nan", "gain=-1", "volume=2"])
def test_a_bad_param_for_every_line_is_refused_before_any_line(no_plugins, tmp_path, param):
    """``--param`` applies to every line: a value the engine's params_class refuses is
    refused at once, naming it (it used to fail every line, exit code 5), and so is one the
    model directory's defaults file would make bad."""
    import math
    import types

    import attrs

    from mizuoto import registry

    @attrs.frozen
    class GainParams:
        gain: float = attrs.field(default=0.2, converter=float)

        @gain.validator
        def _finite_and_positive(self, attribute, value):
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"must be a finite number above 0, got {value}")

    class GainEngine(ToneEngine):
        name = "gain"
        params_class = GainParams

    module = types.ModuleType("gain_plugin")
    module.register_engines = mizuoto.hookimpl(lambda register: register(GainEngine))
    no_plugins.register(module, name="gain_plugin")
    registry.clear_cache()
    (tmp_path / "model").mkdir()
    good = _write_jsonl(tmp_path / "good.jsonl", GOOD)
    args = ["batch", "-e", "gain", "-m", str(tmp_path / "model"), "-o", str(tmp_path / "out")]
    result = CliRunner().invoke(cli, [*args, "--param", param, str(good)], obj={})
    assert result.exit_code == 2, result.output
    assert f"params.{param.split('=')[0]}" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out" / "manifest.jsonl").exists()  # no line was tried
    result = CliRunner().invoke(cli, [*args, "--param", "gain=0.5", str(good)], obj={})
    assert result.exit_code == 0, result.output


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

    from mizuoto.runtime.ray_temp import local_ray_temp_dir

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(Path(sys.prefix) / "tmp"))
    chosen = local_ray_temp_dir()["_temp_dir"]
    assert not Path(chosen).resolve().is_relative_to(Path(sys.prefix).resolve())
    monkeypatch.setattr(tempfile, "gettempdir", lambda: "/tmp")
    assert local_ray_temp_dir() == {}  # outside it: Ray's default is fine


# -- hostile inputs (issue 22 item 15) --------------------------------------------------------

def _lines(path):
    return list(read_lines(path))


def test_a_utf8_bom_is_accepted_in_every_input_kind(tmp_path):
    (tmp_path / "in.csv").write_bytes("\ufeffid,text\na,Hello.\n".encode())
    (tmp_path / "in.tsv").write_bytes("\ufeffid\ttext\na\tHello.\n".encode())
    (tmp_path / "in.jsonl").write_bytes('\ufeff{"id": "a", "text": "Hello."}\n'.encode())
    (tmp_path / "in.txt").write_bytes("\ufeffHello.\n".encode())
    for name in ("in.csv", "in.tsv", "in.jsonl"):
        [line] = _lines(tmp_path / name)
        assert (line.error, line.id, line.fields["text"]) == (None, "a", "Hello."), name
    assert _lines(tmp_path / "in.txt")[0].fields == {"text": "Hello."}


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".txt"])
@pytest.mark.parametrize("encoding", ["latin-1", "utf-16", "cp1252"])
def test_an_input_in_another_encoding_is_a_named_error(tmp_path, suffix, encoding):
    path = tmp_path / f"in{suffix}"
    body = {".csv": "id,text\na,Grüße ô\n", ".tsv": "id\ttext\na\tGrüße ô\n",
            ".jsonl": '{"id": "a", "text": "Grüße ô"}\n', ".txt": "Grüße ô\n"}[suffix]
    path.write_bytes(body.encode(encoding))
    said = "is not UTF-8 text: it is UTF-16LE" if encoding == "utf-16" else \
        "is not UTF-8 text: byte"  # Python's utf-16 writes a byte order mark, named
    with pytest.raises(InvalidRequest, match=said) as caught:
        count_lines(path)
    assert caught.value.field == "input" and str(path) in str(caught.value)


@pytest.mark.parametrize("body, problem", [
    ('id,text\na,"Hello.\nb,World.\n', "line 2: a quote opened in this row is never closed"),
    ('id,text\na,"He said "hi" ok\nb,x\n', "expected after"),
    ("id,text,id\na,Hello.,b\n", "repeats the column 'id'"),
    ("id,text,text\na,Hello.,Bye.\n", "repeats the column 'text'"),
    ("id,,text\na,x,Hello.\n", "column without a name"),
    (f'id,text\na,{"x" * 200_000}\n', "field larger than field limit"),
])
def test_csv_that_cannot_be_read_whole_is_refused(tmp_path, body, problem):
    path = tmp_path / "in.csv"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(InvalidRequest, match=problem) as caught:
        count_lines(path)
    assert caught.value.field == "input"


def test_a_quoted_multiline_cell_is_still_one_line(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text('id,text\na,"Two\nlines, ""quoted"""\nb,x\n', encoding="utf-8")
    lines = _lines(path)
    assert [(line.id, line.fields["text"]) for line in lines] == [
        ("a", 'Two\nlines, "quoted"'), ("b", "x")]


@pytest.mark.parametrize("raw_id", [None, 7.0, 7.5, True, False, [], {}, ["a"]])
def test_a_jsonl_id_that_is_not_a_string_or_integer_is_refused(tmp_path, raw_id):
    path = _write_jsonl(tmp_path / "in.jsonl", [{"id": raw_id, "text": "Hi."},
                                                {"id": "ok", "text": "Hi."}])
    bad, good = _lines(path)
    assert bad.error is not None and bad.error.field == "id" and "string" in str(bad.error)
    assert good.error is None
    summary = run_batch(BatchJob(path, tmp_path / "out"), engine=ToneEngine())
    assert (summary.ok, summary.failed) == (1, 1)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["manifest.jsonl", "ok.wav"]


def test_a_jsonl_integer_id_names_its_file_like_the_string(tmp_path):
    path = _write_jsonl(tmp_path / "in.jsonl", [{"id": 7, "text": "Hi."},
                                                {"id": 0, "text": "Hi."},
                                                {"id": "7", "text": "Again."}])
    seven, zero, again = _lines(path)
    assert (seven.id, zero.id) == ("7", "0") and seven.error is None
    assert again.error is not None and "also the id of line 1" in str(again.error)
    summary = run_batch(BatchJob(path, tmp_path / "out"), engine=ToneEngine())
    assert (summary.ok, summary.failed) == (2, 1)
    records = [json.loads(x) for x in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records if r["status"] == "ok"] == ["7", "0"]
    assert (tmp_path / "out" / "7.wav").is_file() and (tmp_path / "out" / "0.wav").is_file()


def test_a_negative_or_huge_integer_id_is_checked_as_a_file_name(tmp_path):
    rows = [{"id": -3, "text": "Hi."}, {"id": 10 ** 130, "text": "Hi."}]
    negative, huge = _lines(_write_jsonl(tmp_path / "in.jsonl", rows))
    assert negative.error is not None and negative.error.field == "id"
    assert huge.error is not None and huge.error.field == "id"


@pytest.mark.parametrize("raw_id", ["", " ", "..", ".hidden", "a/b", "a\\b", "x.", "NUL",
                                    "con.take1", "Lpt1", "é", "a b", "x" * 129, "a\x00b"])
def test_ids_that_are_not_safe_file_names_are_refused(tmp_path, raw_id):
    rows = [{"id": raw_id, "text": "Hi."}]
    [line] = _lines(_write_jsonl(tmp_path / "in.jsonl", rows))
    assert line.error is not None and line.error.field == "id", raw_id


def test_empty_csv_ids_and_ids_differing_in_case_are_refused(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("id,text\n,No id.\nTake,One.\ntake,Two.\n", encoding="utf-8")
    lines = _lines(path)
    assert "is empty" in str(lines[0].error)
    assert lines[1].error is None and "differ only in case" in str(lines[2].error)
    no_ids = tmp_path / "plain.csv"  # no id column at all: ids by line number
    no_ids.write_text("text\nOne.\nTwo.\n", encoding="utf-8")
    assert [line.id for line in _lines(no_ids)] == ["1", "2"]


# -- one run per folder; the manifest describes its files (item 7) -----------------------------

def test_a_second_batch_into_the_same_folder_is_refused_naming_the_first(tmp_path):
    import socket

    job = BatchJob(_write_jsonl(tmp_path / "in.jsonl", GOOD), tmp_path / "out")
    refused = []

    def second_run(progress):
        if progress.done == 1 and not refused:
            with pytest.raises(InvalidRequest, match="another run") as caught:
                run_batch(job, engine=ToneEngine())
            refused.append(str(caught.value))

    summary = run_batch(job, engine=ToneEngine(), progress=second_run)
    assert summary.ok == 2 and refused
    assert f"pid {os.getpid()} on {socket.gethostname()}" in refused[0]
    assert not (tmp_path / "out" / LOCK).exists()  # removed when the run ends


def test_a_stale_lock_left_by_a_killed_run_is_taken_over(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text("pid 999999 on elsewhere\n")  # no process holds it
    job = BatchJob(_write_jsonl(tmp_path / "in.jsonl", GOOD), out)
    assert run_batch(job, engine=ToneEngine()).ok == 2


def test_a_lock_held_by_another_process_names_it(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from mizuoto.runtime.run_lock import RunLock;"
         f"RunLock({str(out / LOCK)!r}, field='output_dir', what='x').acquire();"
         "print('held', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        job = BatchJob(_write_jsonl(tmp_path / "in.jsonl", GOOD), out)
        with pytest.raises(InvalidRequest, match=f"pid {holder.pid} on "):
            run_batch(job, engine=ToneEngine())
    finally:
        holder.kill()
        holder.wait()
    assert run_batch(job, engine=ToneEngine()).ok == 2  # its lock went with it


def test_a_file_replaced_behind_the_manifest_is_made_again(tmp_path):
    engine = ToneEngine()
    job, _, first = _first_run(tmp_path, engine)
    # another request's audio lands in a.wav without its record (a run killed in between)
    (tmp_path / "out" / "a.wav").write_bytes((tmp_path / "out" / "b.wav").read_bytes())
    summary = run_batch(job, engine=engine)
    assert (summary.ok, summary.skipped) == (1, 1)
    assert (tmp_path / "out" / "a.wav").read_bytes() == first
    records = _manifest(tmp_path / "out")
    for record in records.values():
        assert record["sha256"] == file_digest(tmp_path / "out" / record["path"])


# -- workers and Ray: settings and the model checked first (item 16) ---------------------------

def test_workers_check_the_model_before_starting(tone_model, tmp_path):
    good = _write_jsonl(tmp_path / "good.jsonl", GOOD)
    started = time.monotonic()
    for extra in (["--workers", "2"], ["--ray", "local"], []):
        result = CliRunner().invoke(cli, ["batch", "-m", str(tmp_path / "nonexistent"),
                                          "-o", str(tmp_path / "out"), *extra, str(good)],
                                    obj={})
        assert result.exit_code == 3, (extra, result.output)
        assert "nonexistent" in result.output and "Traceback" not in result.output
    assert time.monotonic() - started < 10  # no worker (or Ray) was started
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("option, value", [("--ray-cpus", "-1"), ("--ray-cpus", "nan"),
                                           ("--ray-cpus", "0"), ("--ray-cpus", "inf"),
                                           ("--ray-gpus", "-0.5"), ("--ray-gpus", "nan")])
def test_ray_resources_are_validated_first(tone_model, tmp_path, option, value):
    good = _write_jsonl(tmp_path / "good.jsonl", GOOD)
    result = CliRunner().invoke(cli, ["batch", "-e", "tone", "-m", str(tone_model), "-o",
                                      str(tmp_path / "out"), "--ray", "local", option, value,
                                      str(good)], obj={})
    assert result.exit_code == 2 and option in result.output, result.output
    assert "Traceback" not in result.output


def test_a_worker_that_dies_is_a_named_error(tmp_path, monkeypatch):
    from mizuoto.batch import run as batch_run
    from mizuoto.errors import MizuotoError

    job = BatchJob(_write_jsonl(tmp_path / "in.jsonl", GOOD), tmp_path / "out")
    with pytest.raises(MizuotoError, match="--workers 1"):
        run_batch(job, load=batch_run.ModelLoader(str(tmp_path / "nothing-here")), workers=2)


@pytest.mark.parametrize(("field", "value"), [
    ("steps", "2"), ("seed", "7"), ("guidance", "2.0"), ("steps", True), ("seed", 7.0),
    ("seed", -0.0), ("steps", 2.5), ("guidance", "nan"),
])
def test_a_jsonl_number_field_is_checked_as_the_api_checks_it(tmp_path, field, value):
    """JSONL has numbers: a numeric string, a bool or a float for an integer is refused, as
    the Python API and the server refuse it (only CSV/TSV cells, all text, are converted)."""
    path = _write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "Hi.", field: value}])
    summary = run_batch(BatchJob(path, tmp_path / "out"), engine=ToneEngine())
    assert (summary.ok, summary.failed) == (0, 1)
    record = json.loads((tmp_path / "out" / "manifest.jsonl").read_text())
    assert record["error"]["field"] == field, record


def test_csv_number_cells_are_converted_and_bad_ones_name_their_field(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("id,text,steps,seed,guidance\na,Hi.,2,7,1.5\nb,Hi.,2.0,7,1\n"
                    "c,Hi.,2,0x10,1\nd,Hi.,true,1,1\n", encoding="utf-8")
    good, *bad = _lines(path)
    assert good.error is None and good.fields["steps"] == 2 and good.fields["guidance"] == 1.5
    assert [line.error.field for line in bad] == ["steps", "seed", "steps"]


@pytest.mark.parametrize("workers", ["257", "99999999999999999999"])
def test_a_worker_count_past_any_machine_is_refused_at_once(tmp_path, workers):
    """``--workers 99999999999999999999`` queued worker slots forever (the process never
    started a line nor exited): refused by name, as run_batch refuses it."""
    (tmp_path / "in.txt").write_text("Hi.\n", encoding="utf-8")
    result = CliRunner().invoke(cli, ["batch", "-m", str(tmp_path), "-o", str(tmp_path / "o"),
                                      "--workers", workers, str(tmp_path / "in.txt")], obj={})
    assert result.exit_code == 2 and "--workers" in result.output, result.output
    for bad in (0, 257, 10 ** 20, True, 2.0):
        with pytest.raises(InvalidRequest, match="workers"):
            run_batch(BatchJob(tmp_path / "in.txt", tmp_path / "o"), engine=ToneEngine(),
                      workers=bad)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("line, said", [
    ('{"text": ' + "[" * 7_000 + "]" * 7_000 + "}", "nests deeper than"),
    ('{"text": "a", "seed": ' + "4" * 5_000 + "}", "5,000 digits"),
    ('{"id": "one", "text": "a", "text": "b"}', "'text' is given twice"),
])
def test_a_hostile_jsonl_line_is_a_named_error_of_its_line(tmp_path, line, said):
    from mizuoto.batch.items import read_lines

    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n", encoding="utf-8")
    good, bad = list(read_lines(path))
    assert good.error is None and bad.error is not None
    assert bad.error.field == "line" and said in str(bad.error)
