"""Benchmark: one VoxCPM request, Mizuoto against upstream voxcpm 2.0.3, on the same random-init
model (VoxCPM-0.5B sized by default), the same seed, a fixed number of patches and the same
thread count. Each side runs in its own subprocess (load, one request), alternating; the
report gives the median times, the ratio and each side's peak RSS, and checks the audio is
identical.

    python packages/mizuoto-voxcpm/benchmarks/bench_voxcpm.py                  # real size
    python packages/mizuoto-voxcpm/benchmarks/bench_voxcpm.py --tiny --runs 1  # smoke test

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


def _worker(side: str, directory: str, patches: int, threads: int, output: str) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    start = time.perf_counter()
    if side == "mizuoto":
        import mizuoto
        from mizuoto_voxcpm.engine import VoxCPMEngine

        engine = VoxCPMEngine.load(Path(directory))
        loaded = time.perf_counter()
        result = engine.synthesize(mizuoto.SynthesisRequest(
            TEXT, seed=SEED, params={"max_len": patches, "retry_badcase": False}))
        audio = result.audio.samples.numpy()
    else:
        from voxcpm.core import VoxCPM

        tts = VoxCPM(voxcpm_model_path=directory, enable_denoiser=False, optimize=False)
        loaded = time.perf_counter()
        torch.manual_seed(SEED)
        audio = tts.generate(text=TEXT, max_len=patches, retry_badcase=False)
    done = time.perf_counter()
    np.save(output, audio)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"side": side, "load_s": loaded - start, "request_s": done - loaded,
                      "peak_rss_mib": peak_kib / 1024}))


def _run_side(side: str, args, output: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads),
           "MKL_NUM_THREADS": str(args.threads)}
    command = [sys.executable, __file__, "--worker", side, "--dir", str(args.dir),
               "--patches", str(args.patches), "--threads", str(args.threads),
               "--output", str(output)]
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
    parser.add_argument("--worker", choices=("mizuoto", "upstream"), help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, str(args.dir), args.patches, args.threads, args.output)
        return

    import numpy as np

    from mizuoto_voxcpm.fixtures import write_random_model

    scratch = Path(tempfile.mkdtemp(prefix="bench-voxcpm-"))
    if args.dir is None:
        args.dir = scratch / f"{args.generation}{'-tiny' if args.tiny else ''}"
    if not (args.dir / "config.json").exists():
        print(f"writing random {'tiny' if args.tiny else 'real-size'} {args.generation} "
              f"to {args.dir}", flush=True)
        write_random_model(args.dir, args.generation, realsize=not args.tiny, stop="never")

    results: dict[str, list[dict]] = {"mizuoto": [], "upstream": []}
    audio: dict[str, np.ndarray] = {}
    for run in range(args.runs):
        order = ("mizuoto", "upstream") if run % 2 == 0 else ("upstream", "mizuoto")
        for side in order:
            output = scratch / f"{side}-{run}.npy"
            results[side].append(_run_side(side, args, output))
            audio[side] = np.load(output)
            print(json.dumps(results[side][-1]), flush=True)

    def median(side, key):
        return statistics.median(r[key] for r in results[side])

    identical = audio["mizuoto"].shape == audio["upstream"].shape and \
        bool(np.array_equal(audio["mizuoto"], audio["upstream"]))
    print(f"\nVoxCPM {args.generation} ({'tiny' if args.tiny else 'real size'}), "
          f"{args.patches} patches, {args.threads} thread(s), {args.runs} run(s) per side")
    for key, label in (("request_s", "request"), ("load_s", "load")):
        ours, theirs = median("mizuoto", key), median("upstream", key)
        print(f"  {label:8s} mizuoto {ours:8.2f} s   upstream {theirs:8.2f} s   "
              f"upstream/mizuoto {theirs / ours:5.2f}x")
    print(f"  peak RSS mizuoto {max(r['peak_rss_mib'] for r in results['mizuoto']):8.0f} MiB   "
          f"upstream {max(r['peak_rss_mib'] for r in results['upstream']):8.0f} MiB")
    print(f"  audio identical: {identical}")


if __name__ == "__main__":
    main()
