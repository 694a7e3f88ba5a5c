"""Text with nothing to speak (only zero-width or format characters) is refused as whitespace is,
by every front end through the one check in SynthesisRequest; a lone surrogate is named, in a
batch line with its line number (issue 33, 4)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from test_batch import ToneEngine

from mizuoto import SynthesisRequest
from mizuoto.batch import BatchJob, run_batch
from mizuoto.batch.items import read_lines
from mizuoto.cli import cli
from mizuoto.contracts.requests import is_blank
from mizuoto.errors import InvalidRequest

INVISIBLE = ["\u200b", "\u200c\u200d", "\u2060", "\ufeff", " \u200b\n\u00ad ", "\u200e\u200f",
             "\u3000\u200b"]


@pytest.mark.parametrize("text", INVISIBLE)
def test_invisible_text_is_refused_as_empty(text):
    assert is_blank(text)
    with pytest.raises(InvalidRequest, match="^text: is empty") as info:
        SynthesisRequest(text)
    assert info.value.fix
    with pytest.raises(InvalidRequest, match="^instruction: is empty"):
        SynthesisRequest("Hello.", instruction=text)


def test_words_with_zero_width_characters_are_still_spoken():
    assert not is_blank("Hel\u200blo")
    assert SynthesisRequest("Hel\u200blo").text == "Hel\u200blo"


def test_say_refuses_invisible_text_before_loading(fake_plugin, tmp_path):
    (tmp_path / "fake.json").write_text("{}")
    result = CliRunner().invoke(cli, ["say", "-m", str(tmp_path), "-o", str(tmp_path / "a.wav"),
                                      "\u200b\u2060\ufeff"], obj={})
    assert result.exit_code == 2 and "is empty" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "a.wav").exists()


def test_batch_records_invisible_text_and_lone_surrogates_by_name(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"id": "zw", "text": "\u200b\u200d", "seed": 1}) + "\n"
                    + '{"id": "half", "text": "Hi \\ud83d there", "seed": 2}\n'
                    + '{"id": "whole", "text": "Hi \\ud83d\\ude00", "seed": 3}\n',
                    encoding="utf-8")
    half = list(read_lines(path))[1].error
    assert half.field == "line" and "line 2" in str(half) and "\\ud83d" in str(half)
    assert "both halves" in half.fix
    run_batch(BatchJob(path, tmp_path / "out"), engine=ToneEngine())
    records = [json.loads(r) for r in (tmp_path / "out" / "manifest.jsonl").read_text(
        encoding="utf-8").splitlines()]
    by_status = {r.get("id", r.get("line")): (r["status"], r.get("error", {}).get("message", ""))
                 for r in records}
    assert by_status["zw"][0] == "error" and "text: is empty" in by_status["zw"][1]
    assert [r["status"] for r in records].count("error") == 2
    assert any("lone surrogate" in r.get("error", {}).get("message", "") for r in records)
    assert (tmp_path / "out" / "whole.wav").is_file()


def test_a_lone_surrogate_in_the_api_is_named():
    with pytest.raises(InvalidRequest, match="text: holds a lone surrogate U\\+D83D"):
        SynthesisRequest("Hi \ud83d")
