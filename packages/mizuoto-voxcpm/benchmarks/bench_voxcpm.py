"""Benchmark: one VoxCPM request, Mizuoto against upstream voxcpm 2.0.3, on the same random-init
model (VoxCPM-0.5B sized by default), the same seed, a fixed number of patches and the same
thread count: `mizuoto bench --against-upstream` with this benchmark's model and request.

Each side runs in its own process (load, one request), alternating; the report gives medians
(min-max), the ratio, each side's peak RSS and whether the audio is identical. ``--stream``
times the streaming path instead (``engine.stream`` against upstream's ``generate_streaming``):
time to first audio, and identical chunks, boundaries included. ``--dtype`` sets the
checkpoint's ``dtype`` for both sides (``auto`` keeps the config's, bfloat16); ``--isa avx2``
limits torch and oneDNN to AVX2 (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``), i.e. what a
CPU without native bfloat16 gives them. Extra arguments go to `mizuoto bench` (``--json``,
``--compare``, ...); ``--json`` has each run's CPU times (steadier on a shared machine).

    python packages/mizuoto-voxcpm/benchmarks/bench_voxcpm.py                  # real size
    python packages/mizuoto-voxcpm/benchmarks/bench_voxcpm.py --tiny --runs 1  # smoke test
    python packages/mizuoto-voxcpm/benchmarks/bench_voxcpm.py --stream --patches 4 --runs 2

Never run in CI (real size takes minutes and several GB).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

TEXT = ("The quick brown fox jumps over the lazy dog, and then it runs far away into the "
        "quiet green forest.")
SEED = 42


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
    args, extra = parser.parse_known_args()

    from mizuoto_voxcpm.fixtures import with_dtype, write_random_model

    scratch = Path(tempfile.mkdtemp(prefix="bench-voxcpm-"))
    directory = args.dir or scratch / f"{args.generation}{'-tiny' if args.tiny else ''}"
    if not (directory / "config.json").exists():
        print(f"writing random {'tiny' if args.tiny else 'real-size'} {args.generation} "
              f"to {directory}", flush=True)
        write_random_model(directory, args.generation, realsize=not args.tiny, stop="never")
    model = directory if args.dtype == "auto" else \
        with_dtype(directory, scratch / f"{directory.name}-{args.dtype}", args.dtype)
    if args.isa == "avx2":  # inherited by every measured process
        os.environ.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    command = [sys.executable, "-m", "mizuoto", "bench", str(model), "--engine", "voxcpm",
               "--text", TEXT, "--seed", str(SEED), "--param", f"max_len={args.patches}",
               "--param", "retry_badcase=false", "--runs", str(args.runs),
               "--threads", str(args.threads), "--against-upstream",
               *(["--stream"] if args.stream else []), *extra]
    os.execv(sys.executable, command)


if __name__ == "__main__":
    main()
