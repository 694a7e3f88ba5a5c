"""Time one F5-TTS request in Mizuoto and in upstream f5-tts on the same random-init model:
`mizuoto bench --against-upstream` with this benchmark's request.

    python benchmarks/bench_f5tts.py --size real --runs 3 --threads 2

``--size real`` is the released v1 Base architecture (337 M parameters, random weights;
``tiny`` to try the script), written once under ``--workdir``. Each side runs ``--runs`` times,
alternating, each run in its own process with the same thread count; both clone the default
voice (upstream's ``basic_ref_en.wav``) with the same seed, and the report says whether the
samples are identical. Extra arguments go to `mizuoto bench` (e.g. ``--compare``, ``--json``).
Never run in CI: the real size takes minutes per request on a CPU.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

GEN_TEXT = "I don't really care what you call me. I've been a silent spectator."
SEED = 1234


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("real", "tiny"), default="real")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--workdir", type=Path, default=Path("bench-f5tts"))
    args, extra = parser.parse_known_args()
    fixture = "realsize-v1-base" if args.size == "real" else "tiny-v1-base"
    command = [sys.executable, "-m", "mizuoto", "bench", f"random:f5tts/{fixture}",
               "--random-dir", str(args.workdir / f"v1_base-{args.size}"),
               "--text", GEN_TEXT, "--seed", str(SEED), "--steps", str(args.steps),
               "--runs", str(args.runs), "--threads", str(args.threads),
               "--against-upstream", *extra]
    os.execv(sys.executable, command)


if __name__ == "__main__":
    main()
