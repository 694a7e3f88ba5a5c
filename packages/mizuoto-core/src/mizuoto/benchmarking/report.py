"""Measurements summarized: min/median/max per configuration, ratios against the base
configuration and against upstream, whether the audio is bit-identical; as a table for people
and as a JSON document for machines."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mizuoto.benchmarking.quality import against_base, format_db, format_stop
from mizuoto.benchmarking.runner import BASE, UPSTREAM, Configuration

#: Summarized per configuration (min, median, max over the runs).
METRICS = ("import_s", "load_s", "load_cpu_s", "request_s", "request_cpu_s", "warm_request_s",
           "first_audio_s", "audio_s", "rtf", "peak_rss_mb", "peak_gpu_mb")
#: Given as ratios of medians, this configuration's over the base's (and over upstream's).
RATIOS = ("load_s", "request_s", "request_cpu_s", "warm_request_s", "first_audio_s", "rtf",
          "peak_rss_mb", "peak_gpu_mb")


def spread(values: Sequence[float | None]) -> dict[str, float] | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return {"min": min(present), "median": statistics.median(present), "max": max(present)}


def _audio(runs: Sequence[Mapping[str, Any]]) -> set[tuple]:
    """Each distinct output: the samples' hash and, streamed, the chunk boundaries."""
    return {(r["audio_sha256"], tuple(r["chunks"] or ())) for r in runs}


def _ratios(summary: Mapping[str, Any], against: Mapping[str, Any]) -> dict[str, float | None]:
    ratios: dict[str, float | None] = {}
    for metric in RATIOS:
        ours, theirs = summary.get(metric), against.get(metric)
        ratios[metric] = (ours["median"] / theirs["median"]
                          if ours and theirs and theirs["median"] else None)
    return ratios


def summarize(configurations: Sequence[Configuration],
              measured: Mapping[str, Sequence[Mapping[str, Any]]],
              audio: Mapping[str, Path] | None = None) -> list[dict[str, Any]]:
    """One entry per configuration: its options, runs, summary, ratios and audio identity;
    with ``audio`` (each configuration's saved samples, from its last run) every other
    configuration's ``against_base`` too (:func:`~mizuoto.benchmarking.quality.against_base`:
    speed-up, waveform and mel SNR, whether the stop moved)."""
    summaries = {c.name: {m: spread([r.get(m) for r in measured[c.name]]) for m in METRICS}
                 for c in configurations}
    outputs = {c.name: _audio(measured[c.name]) for c in configurations}

    def same(name: str, other: str) -> bool | None:
        if other not in outputs:
            return None
        return len(outputs[name]) == 1 and outputs[name] == outputs[other]

    entries = []
    for configuration in configurations:
        name, runs = configuration.name, measured[configuration.name]
        entries.append({
            "name": name, "side": configuration.side,
            "options": list(configuration.option_pairs), "runs": list(runs),
            "summary": summaries[name],
            "deterministic": len(outputs[name]) == 1
            and all(r["same_audio_every_request"] for r in runs),
            "ratio_to_base": _ratios(summaries[name], summaries[BASE]),
            "identical_to_base": same(name, BASE),
            "ratio_to_upstream": _ratios(summaries[name], summaries[UPSTREAM])
            if UPSTREAM in summaries else None,
            "identical_to_upstream": same(name, UPSTREAM),
            "against_base": _against_base(name, measured, audio, summaries),
        })
    return entries


def _against_base(name: str, measured: Mapping[str, Sequence[Mapping[str, Any]]],
                  audio: Mapping[str, Path] | None, summaries: Mapping[str, Any]
                  ) -> dict[str, Any] | None:
    if name == BASE or not audio or name not in audio or BASE not in audio:
        return None
    base, this = summaries[BASE]["request_s"], summaries[name]["request_s"]
    speedup = base["median"] / this["median"] if base and this and this["median"] else None
    return against_base(measured[BASE][-1], measured[name][-1], audio[BASE], audio[name],
                        speedup)


def _cell(summary: Mapping[str, Any], metric: str, digits: int = 2) -> str:
    value = summary.get(metric)
    if value is None:
        return "-"
    low, median, high = (f"{value[k]:.{digits}f}" for k in ("min", "median", "max"))
    return median if low == high else f"{median} ({low}-{high})"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(header: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> str:
    """The human report: one row per configuration, medians with (min-max)."""
    upstream = any(e["name"] == UPSTREAM for e in entries)
    stream = header["stream"]
    warm = header["requests"] > 1
    gpu = any(e["summary"]["peak_gpu_mb"] for e in entries)
    columns = ["configuration", "load s", "request s"]
    columns += ["warm request s"] if warm else []
    columns += ["first audio s"] if stream else []
    columns += ["RTF", "peak RSS MB"] + (["peak GPU MB"] if gpu else [])
    notes = [_audio_note(entry) for entry in entries]
    columns += ["x base"] + (["x upstream"] if upstream else [])
    columns += ["audio"] if any(notes) else []  # a column of dashes says nothing
    sides = any(e.get("against_base") for e in entries)
    columns += ["speed-up", "wave SNR dB", "mel SNR dB", "stop"] if sides else []
    rows = []
    for entry in entries:
        summary = entry["summary"]
        row = [entry["name"], _cell(summary, "load_s"), _cell(summary, "request_s")]
        row += [_cell(summary, "warm_request_s")] if warm else []
        row += [_cell(summary, "first_audio_s")] if stream else []
        row += [_cell(summary, "rtf", 3), _cell(summary, "peak_rss_mb", 0)]
        row += [_cell(summary, "peak_gpu_mb", 0)] if gpu else []
        row += [_ratio(entry["ratio_to_base"]["request_s"])]
        row += [_ratio(entry["ratio_to_upstream"]["request_s"])] if upstream else []
        row += [notes[len(rows)] or "-"] if any(notes) else []
        row += _side_by_side(entry.get("against_base")) if sides else []
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [columns, *rows]) for i in range(len(columns))]
    lines = [_title(header), ""]
    for row in [columns, *rows]:
        cells = (str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
        lines.append("  ".join(cells).rstrip())
    lines += ["", "medians over the runs (min-max); x base / x upstream: ratio of the median "
              "request times; RTF: request seconds per second of audio"]
    if sides:
        lines += ["speed-up: the base's median request time over this one's; SNRs of the "
                  "waveform and the magnitude mel against the base's audio (last runs), "
                  "over their common length; stop: where speech ended against the base"]
    return "\n".join(lines)


def _side_by_side(compared: Mapping[str, Any] | None) -> list[str]:
    if not compared:
        return ["-"] * 4
    speedup = compared["speedup"]
    return ["-" if speedup is None else f"{speedup:.2f}x",
            format_db(compared["waveform_snr_db"], compared["identical"]),
            format_db(compared["mel_snr_db"], compared["identical"]),
            format_stop(compared["stop"])]


def _audio_note(entry: Mapping[str, Any]) -> str:
    notes = []
    if not entry["deterministic"]:
        notes.append("varies between runs")
    if entry["name"] == BASE:
        if entry["identical_to_upstream"] is not None:
            notes.append("identical to upstream" if entry["identical_to_upstream"]
                         else "differs from upstream")
    elif entry["identical_to_base"] is not None:
        notes.append("identical to base" if entry["identical_to_base"] else "differs from base")
    return "; ".join(notes)


def _title(header: Mapping[str, Any]) -> str:
    threads = header["threads"]
    load = header["load_average"]
    return (f"mizuoto bench: {header['model']} ({header['engine']}), "
            f"{'stream' if header['stream'] else 'synthesize'}, {header['runs']} run(s) per "
            f"configuration, {header['requests']} request(s) per run, "
            f"{'torch default' if threads is None else threads} thread(s), "
            f"load average {load['before'][0]:.2f} before, {load['after'][0]:.2f} after")
