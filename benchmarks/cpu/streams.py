"""Concurrent streams on one model, batched by Mizuoto's scheduler against the same streams
stepped one row at a time, printed as nano-vllm and vLLM-Omni print theirs.

    python benchmarks/cpu/streams.py MODEL_DIR [--concurrency 1,4,8] [--max-len 20]
    python benchmarks/cpu/streams.py --tiny          # a random tiny VoxCPM: shows it runs
    python benchmarks/cpu/streams.py --tiny f5tts --steps 4   # a random tiny F5-TTS
    python benchmarks/cpu/streams.py MODEL_DIR --option engines.voxcpm.fast=int8  # a profile

For each concurrency ``c``: ``c`` listeners connect together (a thread each, as a server's
lanes). The model directory's engine picks the runs. An engine that steps rows (VoxCPM): the
model loaded twice, unbatched (``engines.voxcpm.max_batch=1``: the rows take turns per patch)
and batched (``max_batch=c``), each with ``c`` cache slots. An engine whose requests take
turns per chunk (F5-TTS, ``takes_turns_per = "chunk"``): unbatched only, the listeners'
requests alternating chunk by chunk (``--steps`` sets its sampling steps). Per run: throughput
(seconds of audio per second of wall time) and its ratio to unbatched, first audio p50, p90
and p95 (from the listeners' common start), RTF (wall seconds per second of audio, per
stream: the mean), and the peak resident memory sampled during the run. Never a test: the
numbers depend on the machine (``lscpu``, the threads, what else runs).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import mizuoto
from mizuoto import ComputeOptions, Options, SynthesisRequest
from mizuoto.contracts.features import stepping_engine
from mizuoto.loading import resolve_engine

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


def _load(model_dir: Path, max_batch: int | None, slots: int, threads: int,
          engine_options: dict[str, dict[str, str]]):
    """The model, with ``max_batch`` rows and ``slots`` cache slots (VoxCPM's options); None:
    an engine that takes turns, which has neither. ``engine_options``: ``--option``'s
    ``{engine: {key: value}}``, the same in every mode."""
    engines = {name: dict(values) for name, values in engine_options.items()}
    if max_batch is not None:
        engines.setdefault("voxcpm", {}).update(
            {"max_batch": max_batch, "cache_slots": max(slots, max_batch)})
    options = Options(compute=ComputeOptions(device="cpu", cpu_threads=threads),
                      engines=engines)
    return mizuoto.load(model_dir, options=options)


def _modes(engine_cls, count: int) -> list[tuple[str, int | None]]:
    """(mode, max_batch) of the runs at ``count`` streams: batched against unbatched for an
    engine that steps rows (one stream is never batched); turns alone for one that takes
    turns per chunk."""
    if stepping_engine(engine_cls) is None:
        return [("turns", None)]
    return [("unbatched", 1)] + ([("batched", count)] if count > 1 else [])


def _tiny(engine: str) -> Path:
    """A random tiny model of ``engine`` in a temporary folder."""
    root = Path(tempfile.mkdtemp())
    if engine == "f5tts":
        from mizuoto_f5tts.fixtures import write_random_model_dir

        return write_random_model_dir(root / "tiny", "v1_base", size="tiny")
    from mizuoto_voxcpm.fixtures import write_random_model

    return write_random_model(root / "tiny", "voxcpm-0.5b")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", nargs="?", type=Path)
    parser.add_argument("--tiny", nargs="?", const="voxcpm", choices=("voxcpm", "f5tts"),
                        help="a random tiny VoxCPM-0.5B (or F5-TTS v1 Base: --tiny f5tts)")
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--max-len", type=int, default=20,
                        help="patches per stream at most (VoxCPM)")
    parser.add_argument("--steps", type=int, default=None,
                        help="sampling steps per request (default: the engine's)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--option", action="append", default=[], metavar="engines.NAME.KEY=VALUE",
                        help="an engine option for every mode, e.g. engines.voxcpm.fast=int8 "
                             "(repeatable)")
    args = parser.parse_args(argv)
    engine_options: dict[str, dict[str, str]] = {}
    for option in args.option:
        key, sep, value = option.partition("=")
        parts = key.split(".")
        if not sep or len(parts) != 3 or parts[0] != "engines":
            parser.error(f"--option {option!r}: give engines.NAME.KEY=VALUE")
        engine_options.setdefault(parts[1], {})[parts[2]] = value
    if (args.model_dir is None) == (args.tiny is None):
        parser.error("give MODEL_DIR or --tiny")
    model_dir = args.model_dir if args.tiny is None else _tiny(args.tiny)
    engine_cls, _ = resolve_engine(model_dir)
    levels = [int(c) for c in args.concurrency.split(",")]
    stepping = stepping_engine(engine_cls) is not None
    params = {"retry_badcase": False, "max_len": args.max_len} if stepping else {}
    limit = f"at most {args.max_len} patches a stream" if stepping else "turns per chunk"
    shown = ", ".join(args.option) or "no options"
    print(f"# {model_dir} ({engine_cls.name}), {args.threads} threads, {limit}, {shown}")
    print(f"{'streams':>7} {'mode':>9} {'audio s/s':>9} {'x unbat.':>8} {'first p50':>9} "
          f"{'p90':>7} {'p95':>7} {'RTF':>6} {'peak MB':>8}")
    for count in levels:
        requests = [SynthesisRequest(SENTENCES[i % len(SENTENCES)], seed=100 + i,
                                     steps=args.steps, params=params) for i in range(count)]
        unbatched = None
        for mode, max_batch in _modes(engine_cls, count):
            engine = _load(model_dir, max_batch, count, args.threads, engine_options)
            # the one-time costs (kernels proven for this many rows) before the clock, with
            # other texts: their prefills are not the timed requests' (PrefillMemo)
            # (an engine taking turns warms up with one sampling step: the same kernels)
            warm_params = {**params, "max_len": 2} if stepping else params
            warm_steps = args.steps if stepping else 1
            _listen(engine, [SynthesisRequest(f"Warming up, listener {i}.", seed=i,
                                              steps=warm_steps, params=warm_params)
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
            gc.collect()  # the next mode's peak memory without this engine in it (cycles)
    return 0


if __name__ == "__main__":
    sys.exit(main())
