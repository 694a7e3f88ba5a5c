"""Long-form synthesis with F5-TTS (tiny random model): a SIGKILLed ``mizuoto say -f`` resumes to
the bytes of an uninterrupted run; sections are F5's own synthesis; memory stays flat."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile

import mizuoto
from mizuoto import SynthesisRequest
from mizuoto.longform import iter_sections, section_seed, synthesize_to
from mizuoto_f5tts import F5Engine
from mizuoto_f5tts.fixtures import write_random_model_dir

SENTENCES = " ".join(f"This is sentence {i} of a tiny model." for i in range(14))
OPTIONS = {"compute.device": "cpu", "compute.cpu_threads": 1}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_random_model_dir(tmp_path_factory.mktemp("f5") / "v1", "v1_base", size="tiny")


@pytest.fixture(scope="module")
def engine(model_dir):
    return F5Engine.load(model_dir, options=mizuoto.Options.from_mapping(OPTIONS))


def test_sigkill_then_resume_gives_the_uninterrupted_bytes(engine, model_dir, tmp_path):
    text = tmp_path / "story.txt"
    text.write_text(SENTENCES, encoding="utf-8")
    sections = len(list(iter_sections([SENTENCES], 70)))
    assert sections >= 7
    synthesize_to(engine, tmp_path / "whole.wav", SynthesisRequest("x", seed=3, steps=2),
                  text_file=text, max_chars=70)

    out = tmp_path / "story.wav"
    command = [sys.executable, "-m", "mizuoto", "-q", "say", "-m", str(model_dir), "-f",
               str(text), "-o", str(out), "--seed", "3", "--steps", "2", "--section-chars",
               "70", "--option", "compute.device=cpu", "--option", "compute.cpu_threads=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    state = tmp_path / "story.wav.part" / "state.json"
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    done, deadline = 0, time.monotonic() + 120
    while done < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
        try:
            done = json.loads(state.read_text())["sections_done"]
        except (OSError, ValueError):
            continue
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, process.stderr.read().decode()
    killed_at = json.loads(state.read_text())["sections_done"]
    assert 2 <= killed_at < sections and not out.exists()

    resumed = subprocess.run([*command, "--resume"], env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert out.read_bytes() == (tmp_path / "whole.wav").read_bytes()
    assert not state.parent.exists()


def test_each_section_is_f5s_own_synthesis_of_it(engine, tmp_path):
    """Within a section F5 chunks, crossfades and seeds its chunks as one synthesize call."""
    request = SynthesisRequest(SENTENCES, seed=9, steps=2)
    done = synthesize_to(engine, tmp_path / "long.wav", request, max_chars=300)
    written, _ = soundfile.read(tmp_path / "long.wav", dtype="int16")
    expected = []
    for index, section in enumerate(iter_sections([SENTENCES], 300)):
        result = engine.synthesize(SynthesisRequest(section, seed=section_seed(9, index),
                                                    steps=2))
        result.save(tmp_path / "one.wav")
        expected.append(soundfile.read(tmp_path / "one.wav", dtype="int16")[0])
    assert done.sections == len(expected) >= 2
    assert done.applied.chunks > done.sections  # F5 split sections into its own chunks
    assert np.array_equal(written, np.concatenate(expected))


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_resident_memory_stays_flat_over_many_sections(engine, tmp_path):
    book = tmp_path / "book.txt"
    with open(book, "w", encoding="utf-8") as handle:  # about 3 MB
        for i in range(60_000):
            handle.write(f"Line {i} of a long book is read aloud. ")
    rss: list[int] = []
    times: list[float] = []

    def watch(progress):
        if progress.stage == "section" and progress.done:
            rss.append(_rss())
            times.append(time.monotonic())

    done = synthesize_to(engine, tmp_path / "book.flac", SynthesisRequest("x", seed=1, steps=1),
                         text_file=book, max_chars=80, stop_after=30, progress=watch)
    assert done.sections > 10_000 and done.sections_done == 30
    # medians: RSS moves by +-15 MiB from one section to the next (allocator caches)
    early, late = np.median(rss[4:12]), np.median(rss[-8:])
    per_section = (times[-1] - times[0]) / (len(times) - 1)
    print(f"RSS median {early / 2**20:.0f} MiB over sections 5-12, {late / 2**20:.0f} MiB over "
          f"23-30; {per_section:.2f} s per section")
    assert late - early < 12 * 2**20
