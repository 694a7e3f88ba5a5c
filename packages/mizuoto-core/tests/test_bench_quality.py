"""``mizuoto bench``'s side-by-side columns (a configuration against the base: speed-up,
waveform SNR, mel SNR, whether the stop moved) are computed from the audio each child saved.
Nothing here is timed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mizuoto.benchmarking.quality import mel_snr_db, snr_db, stop_moved
from mizuoto.benchmarking.report import summarize, table
from mizuoto.benchmarking.runner import Configuration

RATE = 24000


def _tone(seconds=0.5, noise=0.0, seed=0):
    t = np.arange(int(RATE * seconds)) / RATE
    rng = np.random.default_rng(seed)
    return (0.3 * np.sin(2 * np.pi * 220 * t) + noise * rng.standard_normal(t.size)) \
        .astype(np.float32)


def test_snr_of_a_known_noise_and_of_equal_audio():
    signal = np.ones(1000, np.float32)
    assert snr_db(signal, signal + np.float32(0.1)) == pytest.approx(20.0, abs=1e-4)
    assert snr_db(signal, signal.copy()) == math.inf
    assert snr_db(signal, np.ones(500, np.float32)) == math.inf  # over the common length
    assert snr_db(np.zeros(10, np.float32), np.ones(10, np.float32)) == -math.inf


def test_mel_snr_ignores_what_the_waveform_snr_sees():
    reference = _tone()
    shifted = np.roll(reference, 3)  # a phase shift: far on the waveform, close on the mel
    assert mel_snr_db(reference, shifted, RATE) > snr_db(reference, shifted) + 10
    assert mel_snr_db(reference, _tone(noise=0.03), RATE) < mel_snr_db(reference, shifted, RATE)
    assert mel_snr_db(reference[:1000], reference[:1000], RATE) is None  # under one window


def test_the_stop_is_compared_by_patches_where_reported_else_by_length():
    assert stop_moved({"patches": 20, "samples": 9}, {"patches": 17, "samples": 9}) == \
        {"moved": True, "unit": "patches", "base": 20, "this": 17}
    assert not stop_moved({"patches": None, "samples": 9}, {"patches": None, "samples": 9})["moved"]
    assert stop_moved({"patches": None, "samples": 9}, {"patches": None, "samples": 8})["moved"]


def _run(request_s, samples, patches=None):
    return {"audio_sha256": str(samples), "chunks": None, "request_s": request_s, "load_s": 1.0,
            "same_audio_every_request": True, "sample_rate": RATE, "samples": samples,
            "patches": patches}


def test_the_side_by_side_columns_are_computed_from_the_saved_audio(tmp_path):
    audio = {"base": _tone(), "fast": _tone(noise=0.003), "same": _tone(),
             "short": _tone(seconds=0.4)}
    paths = {}
    for name, samples in audio.items():
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], samples)
    measured = {"base": [_run(3.0, 12000, 20)], "fast": [_run(1.5, 12000, 20)],
                "same": [_run(3.0, 12000, 20)], "short": [_run(2.0, 9600, 16)]}
    entries = {e["name"]: e for e in summarize([Configuration(n) for n in audio], measured,
                                               paths)}
    assert entries["base"]["against_base"] is None
    fast = entries["fast"]["against_base"]
    assert fast["speedup"] == 2.0 and fast["identical"] is False
    assert fast["waveform_snr_db"] == pytest.approx(snr_db(audio["base"], audio["fast"]))
    assert 30 < fast["waveform_snr_db"] < 45
    assert fast["mel_snr_db"] == pytest.approx(mel_snr_db(audio["base"], audio["fast"], RATE))
    assert fast["stop"] == {"moved": False, "unit": "patches", "base": 20, "this": 20}
    same = entries["same"]["against_base"]
    assert same["identical"] and same["waveform_snr_db"] is None  # JSON has no infinity
    assert entries["short"]["against_base"]["stop"]["moved"]
    header = {"model": "m", "engine": "e", "stream": False, "runs": 1, "requests": 1,
              "threads": 1, "load_average": {"before": [1.0, 1, 1], "after": [1.0, 1, 1]}}
    lines = table(header, list(entries.values())).splitlines()
    assert lines[2].split()[-8:] == ["speed-up", "wave", "SNR", "dB", "mel", "SNR", "dB",
                                     "stop"]
    rows = {line.split()[0]: line.split("  ") for line in lines[3:7]}
    cells = {name: [c.strip() for c in row if c.strip()][-4:] for name, row in rows.items()}
    assert cells["base"] == ["-", "-", "-", "-"]
    assert cells["fast"] == ["2.00x", f"{fast['waveform_snr_db']:.1f}",
                             f"{fast['mel_snr_db']:.1f}", "same (20 patches)"]
    assert cells["same"] == ["1.00x", "exact", "exact", "same (20 patches)"]
    assert cells["short"][0] == "1.50x" and cells["short"][3] == "moved (20 -> 16 patches)"
