"""Long-form synthesis to a file: sections, resume, byte identity, bounded memory.

An in-test engine speaks seeded noise whose length follows the text, so that every section's
audio depends on its seed and text: a resume that re-used or skipped the wrong section, or
seeded it differently, changes the file.
"""

from __future__ import annotations

import filecmp
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from stub_engines import StubEngine

import mizuoto
from mizuoto import Applied, Audio, Capability, SynthesisRequest, SynthesisResult
from mizuoto.cli import cli
from mizuoto.errors import InvalidRequest
from mizuoto.longform import iter_sections, section_seed, synthesize_to

RATE = 8000


class NoiseEngine(StubEngine):
    """Seeded noise, 40 samples per character of text; counts its calls."""

    name = "noise"
    model_name = "noise-model"
    declared = frozenset({Capability.ZERO_SHOT, Capability.LONG_TEXT})
    sample_rate = RATE

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def synthesize(self, request, *, progress=None):
        self.calls += 1
        generator = torch.Generator().manual_seed(request.seed)
        samples = 0.3 * torch.randn(40 * len(request.text), generator=generator)
        applied = Applied("noise", "noise-model", request.seed, False, "float32", "cpu",
                          warnings=("a warning",))
        return SynthesisResult(Audio(samples, RATE), applied)


TEXT = " ".join(f"Sentence number {i} is here." for i in range(40))


@pytest.fixture
def engine():
    return NoiseEngine()


# -- sections ---------------------------------------------------------------------------------

def test_a_short_text_is_one_section_verbatim():
    assert list(iter_sections(["  Hello there.\n"], 100)) == ["  Hello there.\n"]
    assert list(iter_sections(["   \n "], 100)) == []


def test_sections_pack_whole_sentences_up_to_the_limit():
    sections = list(iter_sections([TEXT], 100))
    assert all(len(s) <= 100 for s in sections)
    assert all(s.endswith(".") for s in sections)
    assert " ".join(sections) == TEXT
    assert len(sections) < len(TEXT) // 50  # packed, not one sentence each


def test_a_long_sentence_is_cut_at_a_space_or_at_the_limit():
    words = "word " * 100
    assert all(len(s) <= 50 and not s.endswith("wor") for s in iter_sections([words], 50))
    assert list(iter_sections(["x" * 250], 100)) == ["x" * 100, "x" * 100, "x" * 50]


def test_cjk_full_stops_and_blank_lines_end_sections():
    text = "今日は晴れです。" * 30 + "\n\n" + "Second paragraph without a stop " * 3
    sections = list(iter_sections([text], 40))
    assert all(len(s) <= 40 for s in sections)
    assert sections[0].endswith("。")


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab .!?\n。")), max_size=600),
       max_chars=st.integers(1, 60), block=st.integers(1, 97))
def test_sections_do_not_depend_on_how_the_text_is_read(text, max_chars, block):
    blocks = [text[i:i + block] for i in range(0, len(text), block)]
    assert list(iter_sections(blocks, max_chars)) == list(iter_sections([text], max_chars))


def test_section_seeds_are_the_seed_then_derived_32_bit_seeds():
    assert section_seed(7, 0) == 7
    seeds = {section_seed(7, k) for k in range(1, 200)}
    assert len(seeds) == 199 and all(0 <= s < 2**32 for s in seeds)
    assert section_seed(7, 3) == section_seed(7, 3) != section_seed(8, 3)


# -- same file as one synthesize call ---------------------------------------------------------

@pytest.mark.parametrize("suffix", [".wav", ".flac"])
def test_one_section_is_the_file_result_save_writes(engine, tmp_path, suffix):
    request = SynthesisRequest("Just one sentence.\n", seed=11)
    engine.synthesize(request).save(tmp_path / f"direct{suffix}")
    done = synthesize_to(engine, tmp_path / f"long{suffix}", request)
    assert done.complete and done.sections == 1
    assert filecmp.cmp(tmp_path / f"direct{suffix}", tmp_path / f"long{suffix}", shallow=False)
    assert not (tmp_path / f"long{suffix}.part").exists()


def test_one_section_mp3_is_what_say_writes(engine, tmp_path):
    from mizuoto.audio_encoding import encode

    request = SynthesisRequest("Just one sentence.", seed=11)
    samples = engine.synthesize(request).audio.numpy()
    synthesize_to(engine, tmp_path / "long.mp3", request)
    assert (tmp_path / "long.mp3").read_bytes() == encode(samples, RATE, "mp3")


def test_sections_are_the_engine_output_for_their_text_and_seed(engine, tmp_path):
    import soundfile as sf

    done = synthesize_to(engine, tmp_path / "out.wav", SynthesisRequest(TEXT, seed=5),
                         max_chars=150)
    written, rate = sf.read(tmp_path / "out.wav", dtype="int16")
    parts = []
    for index, section in enumerate(iter_sections([TEXT], 150)):
        result = engine.synthesize(SynthesisRequest(section, seed=section_seed(5, index)))
        result.save(tmp_path / "part.wav")
        parts.append(sf.read(tmp_path / "part.wav", dtype="int16")[0])
    assert rate == RATE and done.sections == len(parts) > 3
    assert (written == np.concatenate(parts)).all()
    assert done.applied.seed == 5 and done.applied.extra["sections"] == done.sections
    assert done.applied.warnings == ("a warning",)  # once, not once per section


# -- resume -----------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".wav", ".flac", ".mp3", ".ogg"])
def test_a_resumed_run_writes_the_same_bytes(engine, tmp_path, suffix):
    request = SynthesisRequest(TEXT, seed=3)
    whole = synthesize_to(engine, tmp_path / f"whole{suffix}", request, max_chars=120)
    out = tmp_path / f"resumed{suffix}"
    first = synthesize_to(engine, out, request, max_chars=120, stop_after=2)
    assert not first.complete and first.sections_done == 2 and not out.exists()
    # a run killed while writing leaves bytes past the last complete section
    with open(out.with_name(out.name + ".part") / "audio.raw", "ab") as raw:
        raw.write(b"\x01\x02\x03" * 1001)
    calls = engine.calls
    second = synthesize_to(engine, out, request, max_chars=120, resume=True)
    assert second.complete and second.resumed_at == 2
    assert engine.calls - calls == whole.sections - 2  # done sections are not redone
    if suffix == ".ogg":  # Opus; libsndfile gives each Ogg stream a random serial number
        import soundfile as sf

        assert np.array_equal(sf.read(tmp_path / f"whole{suffix}")[0], sf.read(out)[0])
    else:
        assert filecmp.cmp(tmp_path / f"whole{suffix}", out, shallow=False)


def test_ctrl_c_leaves_a_run_that_resumes_to_the_same_bytes(engine, tmp_path):
    request = SynthesisRequest(TEXT, seed=6)
    synthesize_to(engine, tmp_path / "whole.wav", request, max_chars=120)

    def interrupt(progress):  # Ctrl-C while the third section is being spoken
        if progress.stage == "section" and progress.done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        synthesize_to(engine, tmp_path / "a.wav", request, max_chars=120, progress=interrupt)
    done = synthesize_to(engine, tmp_path / "a.wav", request, max_chars=120, resume=True)
    assert done.resumed_at == 2
    assert filecmp.cmp(tmp_path / "whole.wav", tmp_path / "a.wav", shallow=False)


def test_a_drawn_seed_is_kept_across_a_resume(engine, tmp_path):
    request = SynthesisRequest(TEXT)
    first = synthesize_to(engine, tmp_path / "a.wav", request, max_chars=120, stop_after=1)
    second = synthesize_to(engine, tmp_path / "a.wav", request, max_chars=120, resume=True)
    assert first.applied.seed_drawn and second.applied.seed == first.applied.seed
    again = synthesize_to(engine, tmp_path / "b.wav", SynthesisRequest(TEXT, seed=first.applied.seed),
                          max_chars=120)
    assert filecmp.cmp(tmp_path / "a.wav", tmp_path / "b.wav", shallow=False)
    assert again.applied.seed == first.applied.seed


def test_resume_refuses_a_damaged_partial_run(engine, tmp_path):
    request = SynthesisRequest(TEXT, seed=1)
    synthesize_to(engine, tmp_path / "a.wav", request, max_chars=120, stop_after=2)
    raw = tmp_path / "a.wav.part" / "audio.raw"
    raw.write_bytes(raw.read_bytes()[:-2])  # lost its last bytes: no silence padding
    with pytest.raises(InvalidRequest, match="less than"):
        synthesize_to(engine, tmp_path / "a.wav", request, max_chars=120, resume=True)


def test_two_runs_cannot_write_one_output_at_once(engine, tmp_path):
    request = SynthesisRequest(TEXT, seed=1)
    refused = []

    def second_run(progress):
        if progress.stage == "section" and progress.done == 1 and not refused:
            with pytest.raises(InvalidRequest, match="another run") as caught:
                synthesize_to(NoiseEngine(), tmp_path / "a.wav", request, max_chars=120,
                              resume=True)
            refused.append(caught.value)

    done = synthesize_to(engine, tmp_path / "a.wav", request, max_chars=120,
                         progress=second_run)
    assert refused and done.complete


def test_an_interrupted_run_is_not_overwritten_without_resume(engine, tmp_path):
    request = SynthesisRequest(TEXT, seed=1)
    synthesize_to(engine, tmp_path / "a.wav", request, max_chars=120, stop_after=1)
    with pytest.raises(InvalidRequest, match="interrupted run") as caught:
        synthesize_to(engine, tmp_path / "a.wav", request, max_chars=120)
    assert caught.value.field == "output"


@pytest.mark.parametrize(("change", "named"), [
    ({"text": TEXT + " More."}, "text"),
    ({"params": {"speed": 2}}, "params"),
    ({"seed": 2}, "seed"),
])
def test_resume_refuses_other_settings_and_names_them(engine, tmp_path, change, named):
    import attrs

    request = SynthesisRequest(TEXT, seed=1)
    synthesize_to(engine, tmp_path / "a.wav", request, max_chars=120, stop_after=1)
    with pytest.raises(InvalidRequest, match=f"differing: .*{named}"):
        synthesize_to(engine, tmp_path / "a.wav", attrs.evolve(request, **change),
                      max_chars=120, resume=True)
    # the refusal let go of the run: the right settings resume it at once
    assert synthesize_to(engine, tmp_path / "a.wav", request, max_chars=120,
                         resume=True).complete


def test_progress_counts_sections_with_audio_seconds_and_eta(engine, tmp_path):
    seen = []
    done = synthesize_to(engine, tmp_path / "a.wav", SynthesisRequest(TEXT, seed=1),
                         max_chars=200, progress=seen.append)
    sections = [p for p in seen if p.stage == "section"]
    assert [p.done for p in sections] == list(range(done.sections + 1))
    assert {p.total for p in sections} == {done.sections}
    assert "s audio" in sections[-1].detail and "ETA" in sections[-1].detail
    assert any(p.stage == "encoding" for p in seen)


def test_unknown_output_format_is_refused(engine, tmp_path):
    with pytest.raises(InvalidRequest, match=r"\.aiff"):
        synthesize_to(engine, tmp_path / "a.aiff", SynthesisRequest("Hi.", seed=1))


# -- bounded memory ---------------------------------------------------------------------------

def test_memory_does_not_grow_with_the_text(engine, tmp_path):
    """A 4 MB text file is never read whole; Python's allocations stay under 2 MB while it is
    scanned and sections are spoken (the noise engine's tensors are a few KB each)."""
    book = tmp_path / "book.txt"
    with open(book, "w", encoding="utf-8") as handle:
        for i in range(110_000):
            handle.write(f"This is sentence {i} of a long book. ")
    assert book.stat().st_size > 4_000_000
    tracemalloc.start()
    try:
        done = synthesize_to(engine, tmp_path / "book.wav", SynthesisRequest("x", seed=1),
                             text_file=book, max_chars=300, stop_after=30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert done.sections > 10_000 and done.sections_done == 30
    assert peak < 2_000_000, f"peak {peak} bytes"


# -- command line -----------------------------------------------------------------------------

def _plugin():
    import types

    module = types.ModuleType("noise_plugin")

    @mizuoto.hookimpl
    def register_engines(register):
        register(NoiseEngine)

    module.register_engines = register_engines
    return module


@pytest.fixture
def noise_cli(no_plugins, tmp_path):
    from mizuoto import registry

    no_plugins.register(_plugin(), name="noise_plugin")
    registry.clear_cache()
    model = tmp_path / "model"
    model.mkdir()
    return model


def test_say_text_file_writes_sections_and_resumes(noise_cli, tmp_path):
    text = tmp_path / "story.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "story.flac"
    args = ["say", "-e", "noise", "-m", str(noise_cli), "-f", str(text), "-o", str(out),
            "--seed", "4", "--section-chars", "150"]
    result = CliRunner().invoke(cli, ["-q", *args], obj={})
    assert result.exit_code == 0, result.output
    reference = out.read_bytes()
    out.unlink()
    engine = NoiseEngine()
    synthesize_to(engine, out, SynthesisRequest(TEXT, seed=4), max_chars=150, stop_after=2)
    refused = CliRunner().invoke(cli, args, obj={})
    assert refused.exit_code == 2 and "--resume" in refused.output
    resumed = CliRunner().invoke(cli, [*args, "--resume"], obj={})
    assert resumed.exit_code == 0, resumed.output
    assert "(2 resumed)" in resumed.output
    assert out.read_bytes() == reference


def test_say_resume_needs_a_text_file(noise_cli, tmp_path):
    result = CliRunner().invoke(cli, ["say", "-e", "noise", "-m", str(noise_cli), "Hello.",
                                      "-o", str(tmp_path / "a.wav"), "--resume"], obj={})
    assert result.exit_code == 2 and "--text-file" in result.output


def test_say_empty_text_file_fails_before_loading(noise_cli, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n", encoding="utf-8")
    result = CliRunner().invoke(cli, ["say", "-e", "noise", "-m", str(noise_cli), "-f",
                                      str(empty), "-o", str(tmp_path / "a.wav")], obj={})
    assert result.exit_code == 2 and "empty" in result.output


def test_sections_are_written_as_they_finish(engine, tmp_path):
    out = tmp_path / "a.wav"
    sizes = []

    def watch(progress):
        if progress.stage == "section":
            raw = out.with_name("a.wav.part") / "audio.raw"
            sizes.append(raw.stat().st_size if raw.exists() else 0)

    synthesize_to(engine, out, SynthesisRequest(TEXT, seed=1), max_chars=200, progress=watch)
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes) > 3
    assert Path(out).stat().st_size > sizes[-1]


# -- every format; RF64 past WAV's 4 GiB (issue 22 item 9, issue 23 item 5) --------------------

@pytest.mark.parametrize("name", ["aac", "pcm"])
def test_one_section_in_the_encoders_formats_is_what_say_writes(engine, tmp_path, name):
    from mizuoto.audio_encoding import encode
    from mizuoto.audio_formats import FORMATS

    pytest.importorskip(FORMATS[name].needs or "numpy")
    request = SynthesisRequest("Just one sentence.", seed=11)
    samples = engine.synthesize(request).audio.numpy()
    path = tmp_path / f"long{FORMATS[name].extension}"
    assert synthesize_to(engine, path, request).complete
    assert path.read_bytes() == encode(samples, RATE, name)


def test_a_wav_past_the_32_bit_limit_becomes_rf64_at_the_boundary(tmp_path):
    import soundfile as sf

    from mizuoto.audio_encoders import WAV_MAX_DATA_BYTES, wav_container
    from mizuoto.audio_encoding import WriteSettings, open_writer

    for size, container in ((WAV_MAX_DATA_BYTES, "WAV"), (WAV_MAX_DATA_BYTES + 2, "RF64"),
                            (0xFFFFFFFF + 2, "RF64"), (6 << 30, "RF64")):
        assert wav_container(size) == container, size
    # the writer asks it with the frames to come (16-bit: 2 bytes each); FLAC never changes
    for name, frames, container in (("wav", WAV_MAX_DATA_BYTES // 2, "WAV"),
                                    ("wav", WAV_MAX_DATA_BYTES // 2 + 1, "RF64"),
                                    ("flac", 6 << 30, "FLAC")):
        path = tmp_path / f"x.{name}"
        with open_writer(path, name, RATE, WriteSettings(frames=frames)) as writer:
            writer.write(np.zeros(16, np.float32))
        assert sf.info(path).format == container, (name, frames)
    # what the limit leaves room for: RIFF's size field holds the data, header and tags
    assert WAV_MAX_DATA_BYTES + 44 + 4096 <= 0xFFFFFFFF


def test_rf64_output_reads_back_as_the_wav_would(engine, tmp_path, monkeypatch):
    import soundfile as sf

    from mizuoto import audio_encoders

    request = SynthesisRequest(TEXT, seed=3)
    synthesize_to(engine, tmp_path / "plain.wav", request, max_chars=150)
    monkeypatch.setattr(audio_encoders, "WAV_MAX_DATA_BYTES", 1000)  # a long run, in miniature
    synthesize_to(engine, tmp_path / "long.wav", request, max_chars=150)
    with sf.SoundFile(tmp_path / "long.wav") as long, sf.SoundFile(tmp_path / "plain.wav") as plain:
        assert (long.format, plain.format) == ("RF64", "WAV")
        assert long.frames == plain.frames and long.comment == plain.comment
    assert (tmp_path / "long.wav").read_bytes()[:4] == b"RF64"
    assert np.array_equal(sf.read(tmp_path / "long.wav", dtype="int16")[0],
                          sf.read(tmp_path / "plain.wav", dtype="int16")[0])


# -- a text file that changes while it is spoken (issue 22 item 10) ----------------------------

def _shrink(path):
    path.write_text("Short now.", encoding="utf-8")


def _grow(path):
    path.write_text(path.read_text(encoding="utf-8") + " More words at the end.",
                    encoding="utf-8")


def _same_size(path):  # a word not read yet changes, the size does not
    text = path.read_text(encoding="utf-8")
    at = text.rindex("number")
    path.write_text(text[:at] + "NUMBER" + text[at + 6:], encoding="utf-8")


def _same_size_and_time(path):
    stat = path.stat()
    _same_size(path)
    import os

    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # only the content tells


@pytest.mark.parametrize("change", [_shrink, _grow, _same_size, _same_size_and_time])
def test_a_text_file_changed_between_sections_is_an_error_naming_it(engine, tmp_path, change,
                                                                    monkeypatch):
    from mizuoto import longform

    monkeypatch.setattr(longform, "_READ_CHARS", 64)  # read as it is spoken, as a long book is
    text_file = tmp_path / "book.txt"  # longer than the file object's own 8 KiB buffer
    text_file.write_text(" ".join(f"Sentence number {i} is here." for i in range(500)),
                         encoding="utf-8")
    changed = []

    def change_after_first(progress):
        if progress.stage == "section" and progress.done == 1 and not changed:
            change(text_file)
            changed.append(True)

    with pytest.raises(InvalidRequest, match="changed while it was being spoken") as caught:
        synthesize_to(engine, tmp_path / "out.wav", SynthesisRequest("x", seed=1),
                      text_file=text_file, max_chars=150, progress=change_after_first)
    assert caught.value.field == "text_file" and str(text_file) in str(caught.value)
    assert not (tmp_path / "out.wav").exists()


def test_say_reports_success_only_for_a_complete_file(tmp_path, monkeypatch):

    from conftest import make_plugin

    from mizuoto import registry

    text_file = tmp_path / "book.txt"
    text_file.write_text(TEXT, encoding="utf-8")

    class ShrinkingEngine(NoiseEngine):
        def synthesize(self, request, *, progress=None):
            if self.calls == 1:
                _shrink(text_file)
            return super().synthesize(request, progress=progress)

        @classmethod
        def recognizes(cls, model_dir):
            return True

    module = make_plugin("shrink_plugin", engines=(ShrinkingEngine,), trainers=(), models=(),
                         fixtures=())
    monkeypatch.setenv("MIZUOTO_PLUGINS", "")
    mizuoto.plugins.reset_plugins()
    mizuoto.plugins.load_plugins()
    mizuoto.plugins.pm.register(module, name="shrink_plugin")
    registry.clear_cache()
    try:
        result = CliRunner().invoke(cli, ["say", "-m", str(tmp_path), "-e", "noise", "-f",
                                          str(text_file), "--section-chars", "150", "-o",
                                          str(tmp_path / "out.wav")], obj={})
    finally:
        mizuoto.plugins.reset_plugins()
    assert result.exit_code == 2, result.output
    assert "changed while it was being spoken" in result.output and "Wrote" not in result.output
    assert not (tmp_path / "out.wav").exists()


def test_a_text_file_with_a_byte_order_mark_is_spoken_without_it(engine, tmp_path):
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_text(TEXT, encoding="utf-8")
    marked.write_bytes("\ufeff".encode() + TEXT.encode())
    for path in (plain, marked):
        synthesize_to(engine, tmp_path / f"{path.stem}.wav", SynthesisRequest("x", seed=2),
                      text_file=path, max_chars=150)
    assert filecmp.cmp(tmp_path / "plain.wav", tmp_path / "marked.wav", shallow=False)
    from mizuoto.text.files import read_utf8

    assert read_utf8(marked, "--text-file") == TEXT


@pytest.mark.parametrize("piped", ["-", "a pipe's /dev/fd path"])
def test_say_reads_piped_text_once(noise_cli, tmp_path, piped):
    """``-f -`` reads standard input; ``-f /dev/stdin`` (here a pipe's /dev/fd path, as the
    shell gives one) is read once, though a long text is checked, spoken and resumable."""
    import os

    out = tmp_path / "piped.wav"
    args = ["-q", "say", "-e", "noise", "-m", str(noise_cli), "-o", str(out), "--seed", "4",
            "--section-chars", "150", "-f"]
    if piped == "-":
        result = CliRunner().invoke(cli, [*args, "-"], input=TEXT, obj={})
    else:
        read_end, write_end = os.pipe()
        os.write(write_end, TEXT.encode())  # a pipe holds 64 KiB: the text fits
        os.close(write_end)
        try:
            result = CliRunner().invoke(cli, [*args, f"/dev/fd/{read_end}"], obj={})
        finally:
            os.close(read_end)
    assert result.exit_code == 0, result.output
    expected = tmp_path / "expected.wav"
    synthesize_to(NoiseEngine(), expected, SynthesisRequest(TEXT, seed=4), max_chars=150)
    assert out.read_bytes() == expected.read_bytes()


@pytest.mark.parametrize("fail_at, kept", [(1, False), (3, True)])
def test_a_full_disk_is_named_by_path_and_leaves_a_part_only_to_resume(
        tmp_path, monkeypatch, fail_at, kept):
    import errno
    import os

    import mizuoto.longform as longform
    from mizuoto.errors import DiskFull

    syncs, fsync = [], os.fsync

    def filling_fsync(fd):
        syncs.append(fd)
        # the first state, then each section's audio and state: 1 fails before any section
        # is done, 5 at the second section's audio (one done: resumable)
        if len(syncs) >= fail_at * 2 - 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        fsync(fd)

    out = tmp_path / "full.wav"
    monkeypatch.setattr(longform.os, "fsync", filling_fsync)
    with pytest.raises(DiskFull) as raised:
        synthesize_to(NoiseEngine(), out, SynthesisRequest(TEXT, seed=2), max_chars=150)
    assert "full.wav.part" in str(raised.value)
    assert out.with_name("full.wav.part").exists() is kept
    assert not out.exists()
