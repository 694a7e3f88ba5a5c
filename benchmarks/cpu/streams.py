"""Concurrent streams on one model, batched by Mizuoto's scheduler against the same streams
stepped one row at a time, printed as nano-vllm and vLLM-Omni print theirs.

    python benchmarks/cpu/streams.py MODEL_DIR [--concurrency 1,4,8] [--max-len 20]
    python benchmarks/cpu/streams.py --tiny          # a random tiny VoxCPM: shows it runs

For each concurrency ``c``: ``c`` listeners connect together (a thread each, as a server's
lanes) to a model loaded twice, unbatched (``engines.voxcpm.max_batch=1``: the rows take turns
per patch) and batched (``max_batch=c``), each with ``c`` cache slots. Per run: throughput
(seconds of audio per second of wall time) and its ratio to unbatched, first audio p50, p90
and p95 (from the listeners' common start), RTF (wall seconds per second of audio, per
stream: the mean), and the peak resident memory sampled during the run. Never a test: the
numbers depend on the machine (``lscpu``, the threads, what else runs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import mizuoto
from mizuoto import ComputeOptions, Options, SynthesisRequest

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Streams join and leave the batch at patch boundaries.",
    "Eight listeners, one model, and every one of them hears its own voice.",
    "A short one.",
)


def _peak_rss(stop: threading.Event, peak: list[int]) -> None:
    """Sample this process's resident memory (bytes) until ``stop``; the largest in
    ``peak[0]``."""
    page = os.sysconf("SC_PAGE_SIZE")
    while not stop.is_set():
        with open("/proc/self/statm", encoding="ascii") as statm:
            peak[0] = max(peak[0], int(statm.read().split()[1]) * page)
        stop.wait(0.01)


def _listen(engine, requests) -> tuple[float, list[float], list[float], int]:
    """The requests streamed on a thread each, started together: wall seconds, each one's
    first-audio seconds and audio seconds, and the peak resident memory (bytes)."""
    count = len(requests)
    start = threading.Barrier(count + 1)
    first = [0.0] * count
    audio = [0.0] * count
    errors: list[BaseException] = []
    began = [0.0]

    def listen(index: int) -> None:
        try:
            start.wait()
            for chunk in engine.stream(requests[index]):
                if not first[index]:
                    first[index] = time.perf_counter() - began[0]
                audio[index] += chunk.audio.duration
        except BaseException as exc:  # re-raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=listen, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    stop, peak = threading.Event(), [0]
    sampler = threading.Thread(target=_peak_rss, args=(stop, peak), daemon=True)
    sampler.start()
    began[0] = time.perf_counter()
    start.wait()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began[0]
    stop.set()
    sampler.join()
    if errors:
        raise errors[0]
    return wall, first, audio, peak[0]


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def _load(model_dir: Path, max_batch: int, slots: int, threads: int):
    options = Options(compute=ComputeOptions(device="cpu", cpu_threads=threads),
                      engines={"voxcpm": {"max_batch": max_batch,
                                          "cache_slots": max(slots, max_batch)}})
    return mizuoto.load(model_dir, options=options)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", nargs="?", type=Path)
    parser.add_argument("--tiny", action="store_true", help="a random tiny VoxCPM-0.5B")
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--max-len", type=int, default=20, help="patches per stream at most")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args(argv)
    if (args.model_dir is None) == (not args.tiny):
        parser.error("give MODEL_DIR or --tiny")
    model_dir = args.model_dir
    if args.tiny:
        from mizuoto_voxcpm.fixtures import write_random_model

        model_dir = write_random_model(Path(tempfile.mkdtemp()) / "tiny", "voxcpm-0.5b")
    levels = [int(c) for c in args.concurrency.split(",")]
    params = {"retry_badcase": False, "max_len": args.max_len}
    print(f"# {model_dir}, {args.threads} threads, at most {args.max_len} patches a stream")
    print(f"{'streams':>7} {'mode':>9} {'audio s/s':>9} {'x unbat.':>8} {'first p50':>9} "
          f"{'p90':>7} {'p95':>7} {'RTF':>6} {'peak MB':>8}")
    for count in levels:
        requests = [SynthesisRequest(SENTENCES[i % len(SENTENCES)], seed=100 + i,
                                     params=params) for i in range(count)]
        unbatched = None
        for mode, max_batch in (("unbatched", 1), ("batched", count)):
            if mode == "batched" and count == 1:
                continue  # one stream is never batched
            engine = _load(model_dir, max_batch, count, args.threads)
            # the one-time costs (kernels proven for this many rows) before the clock, with
            # other texts: their prefills are not the timed requests' (PrefillMemo)
            _listen(engine, [SynthesisRequest(f"Warming up, listener {i}.", seed=i,
                                              params={**params, "max_len": 2})
                             for i in range(count)])
            wall, first, audio, peak = _listen(engine, requests)
            throughput = sum(audio) / wall
            unbatched = unbatched or throughput
            rtf = statistics.mean(wall / seconds for seconds in audio if seconds)
            print(f"{count:>7} {mode:>9} {throughput:>9.3f} {throughput / unbatched:>8.2f} "
                  f"{1000 * _percentile(first, 0.5):>7.0f}ms {1000 * _percentile(first, 0.9):>5.0f}"
                  f"ms {1000 * _percentile(first, 0.95):>5.0f}ms {rtf:>6.2f} "
                  f"{peak / 2**20:>8.0f}", flush=True)
            del engine
    return 0


if __name__ == "__main__":
    sys.exit(main())
