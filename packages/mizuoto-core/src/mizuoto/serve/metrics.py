"""Prometheus text metrics (exposition format 0.0.4), kept by hand: a few counters and
histograms do not need a client library.

- ``mizuoto_requests_total{model,endpoint,status}``: finished requests by HTTP status;
- ``mizuoto_queue_depth{model}``: requests queued or running on the model's worker;
- ``mizuoto_time_to_first_audio_seconds{model}``: from a speech request's arrival to its first
  audio (histogram);
- ``mizuoto_real_time_factor{model}``: generation time over audio duration (histogram);
- ``mizuoto_audio_seconds_total{model}``: seconds of audio generated;
- ``mizuoto_cancelled_total{model}``: generations stopped because the client went away;
- ``mizuoto_batch_size{model}`` and ``mizuoto_batch_step_seconds{model}``: the requests in the
  model's last batched step and how long it took; ``mizuoto_batch_steps_total{model}``,
  ``mizuoto_batch_rows_total{model}`` and ``mizuoto_batch_seconds_total{model}``: all its
  batched steps (rows / steps is the mean batch size); ``mizuoto_batch_prefills_total``,
  ``mizuoto_batch_prefills_shared_total`` (requests that reused another's prefill of the same
  prompt) and ``mizuoto_batch_decode_seconds_total`` where the engine reports them. Only for a
  model whose engine batches (``mizuoto serve --max-batch``).
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Callable

TTFA_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RTF_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value

    def lines(self, name: str, labels: str) -> list[str]:
        out, cumulative = [], 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            cumulative += count
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {cumulative}')
        out.append(f"{name}_sum{{{labels}}} {self.total}")
        out.append(f"{name}_count{{{labels}}} {cumulative}")
        return out


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """Thread-safe: the event loop records requests, the workers record generations."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self._ttfa: dict[str, _Histogram] = {}
        self._rtf: dict[str, _Histogram] = {}
        self._audio: dict[str, float] = defaultdict(float)
        self._cancelled: dict[str, int] = defaultdict(int)
        self._depths: dict[str, Callable[[], int]] = {}
        self._batches: dict[str, Callable[[], object]] = {}

    def watch_queue(self, model: str, depth: Callable[[], int]) -> None:
        self._depths[model] = depth

    def watch_batches(self, model: str, stats: Callable[[], object]) -> None:
        """``stats()``: the model's batching statistics now (``steps``, ``rows``,
        ``seconds``, ``last_size``, ``last_seconds``), or None while it does not batch."""
        self._batches[model] = stats

    def request(self, model: str, endpoint: str, status: int) -> None:
        with self._lock:
            self._requests[model, endpoint, status] += 1

    def first_audio(self, model: str, seconds: float) -> None:
        with self._lock:
            self._ttfa.setdefault(model, _Histogram(TTFA_BUCKETS)).observe(seconds)

    def generated(self, model: str, seconds_taken: float, audio_seconds: float) -> None:
        with self._lock:
            self._audio[model] += audio_seconds
            if audio_seconds > 0:
                self._rtf.setdefault(model, _Histogram(RTF_BUCKETS)).observe(
                    seconds_taken / audio_seconds)

    def cancelled(self, model: str) -> None:
        with self._lock:
            self._cancelled[model] += 1

    def render(self) -> str:
        with self._lock:
            lines = ["# HELP mizuoto_requests_total Finished requests by HTTP status.",
                     "# TYPE mizuoto_requests_total counter"]
            for (model, endpoint, status), count in sorted(self._requests.items()):
                lines.append(f'mizuoto_requests_total{{model="{_label(model)}",endpoint='
                             f'"{endpoint}",status="{status}"}} {count}')
            lines += ["# HELP mizuoto_queue_depth Requests queued or running per model.",
                      "# TYPE mizuoto_queue_depth gauge"]
            for model, depth in sorted(self._depths.items()):
                lines.append(f'mizuoto_queue_depth{{model="{_label(model)}"}} {depth()}')
            for name, kind, table in (
                    ("mizuoto_time_to_first_audio_seconds",
                     "Seconds from a speech request's arrival to its first audio.", self._ttfa),
                    ("mizuoto_real_time_factor",
                     "Generation time over the duration of the audio generated.", self._rtf)):
                lines += [f"# HELP {name} {kind}", f"# TYPE {name} histogram"]
                for model, histogram in sorted(table.items()):
                    lines += histogram.lines(name, f'model="{_label(model)}"')
            for name, kind, table in (
                    ("mizuoto_audio_seconds_total", "Seconds of audio generated.", self._audio),
                    ("mizuoto_cancelled_total", "Generations stopped because the client left.",
                     self._cancelled)):
                lines += [f"# HELP {name} {kind}", f"# TYPE {name} counter"]
                for model, value in sorted(table.items()):
                    lines.append(f'{name}{{model="{_label(model)}"}} {value}')
            lines += self._batch_lines()
        return "\n".join(lines) + "\n"

    def _batch_lines(self) -> list[str]:
        current = {model: stats() for model, stats in sorted(self._batches.items())}
        current = {model: stats for model, stats in current.items() if stats is not None}
        lines = []
        for name, kind, help_text, field in (
                ("mizuoto_batch_size", "gauge", "Requests in the model's last batched step.",
                 "last_size"),
                ("mizuoto_batch_step_seconds", "gauge", "Seconds the last batched step took.",
                 "last_seconds"),
                ("mizuoto_batch_steps_total", "counter", "Batched steps.", "steps"),
                ("mizuoto_batch_rows_total", "counter", "Requests stepped, summed over steps.",
                 "rows"),
                ("mizuoto_batch_seconds_total", "counter", "Seconds spent in batched steps.",
                 "seconds"),
                ("mizuoto_batch_prefills_total", "counter", "Prompts prefilled.", "prefills"),
                ("mizuoto_batch_prefills_shared_total", "counter",
                 "Requests whose prompt's prefill another request had made.",
                 "prefills_shared"),
                ("mizuoto_batch_decode_seconds_total", "counter",
                 "Seconds spent decoding the batch's patches to audio.", "decode_seconds")):
            # the last three only where the engine's statistics have them
            values = {model: getattr(stats, field, None) for model, stats in current.items()}
            values = {model: value for model, value in values.items() if value is not None}
            if not values:
                continue
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            for model, value in values.items():
                lines.append(f'{name}{{model="{_label(model)}"}} {value}')
        return lines
