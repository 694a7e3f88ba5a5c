"""Benchmark: one VoxCPM request, Mizuoto against upstream voxcpm 2.0.3, on the same random-init
model (VoxCPM-0.5B sized by default), the same seed, a fixed number of patches and the same
thread count. Each side runs in its own subprocess (load, one request), alternating; the
report gives the median times, the ratio and each side's peak RSS, and checks the audio is
identical.

``--stream`` times the streaming path instead (``engine.stream`` against upstream's
``generate_streaming``): the time to first audio (from the call to the first chunk) and to the
last chunk, and checks the chunks are identical, boundaries included. Times are wall-clock;
``cpu`` rows are the worker's CPU time, which on one thread is the wall time without the
waits for other processes (use them on a shared machine). ``--dtype`` sets the
checkpoint's ``dtype`` for both sides (``auto`` keeps the config's, bfloat16); ``--isa avx2``
limits torch and oneDNN to AVX2 (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``), i.e. what a
CPU without native bfloat16 gives them.

    python packages/mizuoto-voxcpm/benchmarks/bench_voxcpm.py                  # real size
    python packages/mizuoto-voxcpm/benchmarks/bench_voxcpm.py --tiny --runs 1  # smoke test
    python packages/mizuoto-voxcpm/benchmarks/bench_voxcpm.py --stream --patches 4 --runs 2

Never run in CI (real size takes minutes and several GB).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEXT = ("The quick brown fox jumps over the lazy dog, and then it runs far away into the "
        "quiet green forest.")
SEED = 42


def _worker(side: str, directory: str, patches: int, threads: int, output: str,
            stream: bool) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    start = time.perf_counter()
    if side == "mizuoto":
        import mizuoto
        from mizuoto_voxcpm.engine import VoxCPMEngine

        engine = VoxCPMEngine.load(Path(directory))
        loaded, loaded_cpu = time.perf_counter(), time.process_time()
        request = mizuoto.SynthesisRequest(
            TEXT, seed=SEED, params={"max_len": patches, "retry_badcase": False})
        if stream:
            chunks, first = _timed(c.audio.samples.numpy() for c in engine.stream(request))
        else:
            chunks, first = [engine.synthesize(request).audio.samples.numpy()], None
    else:
        from voxcpm.core import VoxCPM

        tts = VoxCPM(voxcpm_model_path=directory, enable_denoiser=False, optimize=False)
        loaded, loaded_cpu = time.perf_counter(), time.process_time()
        torch.manual_seed(SEED)
        if stream:
            chunks, first = _timed(tts.generate_streaming(text=TEXT, max_len=patches))
        else:
            chunks = [tts.generate(text=TEXT, max_len=patches, retry_badcase=False)]
            first = None
    done, done_cpu = time.perf_counter(), time.process_time()
    np.save(output, np.concatenate(chunks))
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"side": side, "load_s": loaded - start, "request_s": done - loaded,
                      "request_cpu_s": done_cpu - loaded_cpu,
                      "first_s": first[0] - loaded if first is not None else None,
                      "first_cpu_s": first[1] - loaded_cpu if first is not None else None,
                      "chunks": [len(c) for c in chunks], "peak_rss_mib": peak_kib / 1024}))


def _timed(chunks) -> tuple[list, tuple[float, float]]:
    """Consume a stream: its chunks and when the first one arrived (wall clock, CPU time)."""
    collected, first = [], None
    for chunk in chunks:
        if first is None:
            first = time.perf_counter(), time.process_time()
        collected.append(chunk)
    return collected, first


def _run_side(side: str, args, output: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads),
           "MKL_NUM_THREADS": str(args.threads)}
    if args.isa == "avx2":
        env.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    command = [sys.executable, __file__, "--worker", side, "--dir", str(args.model),
               "--patches", str(args.patches), "--threads", str(args.threads),
               "--output", str(output)] + (["--stream"] if args.stream else [])
    completed = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise SystemExit(f"{side} worker failed:\n{completed.stderr[-4000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generation", default="voxcpm-0.5b",
                        choices=("voxcpm-0.5b", "voxcpm-1.5", "voxcpm2"))
    parser.add_argument("--tiny", action="store_true", help="a tiny model (to check the script)")
    parser.add_argument("--patches", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3, help="runs per side, alternating")
    parser.add_argument("--dir", type=Path, default=None, help="model directory (reused)")
    parser.add_argument("--stream", action="store_true",
                        help="time the streaming path: first audio and whole stream")
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                        help="the checkpoint's dtype, for both sides (auto: the config's)")
    parser.add_argument("--isa", default="native", choices=("native", "avx2"),
                        help="avx2: limit torch and oneDNN to AVX2 (no native bfloat16)")
    parser.add_argument("--worker", choices=("mizuoto", "upstream"), help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, str(args.dir), args.patches, args.threads, args.output,
                args.stream)
        return

    import numpy as np

    from mizuoto_voxcpm.fixtures import with_dtype, write_random_model

    scratch = Path(tempfile.mkdtemp(prefix="bench-voxcpm-"))
    if args.dir is None:
        args.dir = scratch / f"{args.generation}{'-tiny' if args.tiny else ''}"
    if not (args.dir / "config.json").exists():
        print(f"writing random {'tiny' if args.tiny else 'real-size'} {args.generation} "
              f"to {args.dir}", flush=True)
        write_random_model(args.dir, args.generation, realsize=not args.tiny, stop="never")
    args.model = args.dir if args.dtype == "auto" else \
        with_dtype(args.dir, scratch / f"{args.dir.name}-{args.dtype}", args.dtype)

    results: dict[str, list[dict]] = {"mizuoto": [], "upstream": []}
    audio: dict[str, np.ndarray] = {}
    chunks: dict[str, list[int]] = {}
    for run in range(args.runs):
        order = ("mizuoto", "upstream") if run % 2 == 0 else ("upstream", "mizuoto")
        for side in order:
            output = scratch / f"{side}-{run}.npy"
            results[side].append(_run_side(side, args, output))
            audio[side] = np.load(output)
            chunks[side] = results[side][-1]["chunks"]
            print(json.dumps(results[side][-1]), flush=True)

    def median(side, key):
        return statistics.median(r[key] for r in results[side])

    identical = audio["mizuoto"].shape == audio["upstream"].shape and \
        bool(np.array_equal(audio["mizuoto"], audio["upstream"]))
    if args.stream:
        identical = identical and chunks["mizuoto"] == chunks["upstream"]
    print(f"\nVoxCPM {args.generation} ({'tiny' if args.tiny else 'real size'}), "
          f"{'streaming, ' if args.stream else ''}dtype {args.dtype}, isa {args.isa}, "
          f"{args.patches} patches, {args.threads} thread(s), {args.runs} run(s) per side")
    keys = (("first_s", "first audio"), ("first_cpu_s", "  cpu")) if args.stream else ()
    keys += (("request_s", "request"), ("request_cpu_s", "  cpu"), ("load_s", "load"))
    for key, label in keys:
        ours, theirs = median("mizuoto", key), median("upstream", key)
        print(f"  {label:11s} mizuoto {ours:8.2f} s   upstream {theirs:8.2f} s   "
              f"upstream/mizuoto {theirs / ours:5.2f}x")
    print(f"  peak RSS mizuoto {max(r['peak_rss_mib'] for r in results['mizuoto']):8.0f} MiB   "
          f"upstream {max(r['peak_rss_mib'] for r in results['upstream']):8.0f} MiB")
    print(f"  audio identical{' (chunk by chunk)' if args.stream else ''}: {identical}")


if __name__ == "__main__":
    main()
